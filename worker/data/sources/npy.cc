#include "worker/data/sources/npy.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>

#include "common/error.h"
#include "worker/common/files.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "npy.cc assumes a little-endian host ('=' and '<' dtypes are read as native)"
#endif

namespace batchdist::worker {
namespace {

constexpr char kMagic[] = "\x93NUMPY";
constexpr size_t kMagicLen = 6;

/// A recursive-descent reader of the header's Python dict literal.
class HeaderParser {
 public:
  HeaderParser(const std::string& text, const std::string& path) : s_(text), path_(path) {}

  std::string descr;
  bool fortran = false;
  std::vector<int64_t> shape;

  void parse() {
    bool seen_descr = false, seen_fortran = false, seen_shape = false;
    ws();
    expect('{');
    ws();
    while (peek() != '}') {
      const std::string key = str();
      ws();
      expect(':');
      ws();
      if (key == "descr") {
        dup(seen_descr, key);
        if (peek() == '[') {
          fail("'descr' is a structured dtype (a list of fields); save a plain array of one "
               "dtype");
        }
        descr = str();
      } else if (key == "fortran_order") {
        dup(seen_fortran, key);
        fortran = boolean();
      } else if (key == "shape") {
        dup(seen_shape, key);
        tuple();
      } else {
        fail(strCat("unknown key '", key, "' (expected 'descr', 'fortran_order', 'shape')"));
      }
      ws();
      if (peek() == ',') {
        ++i_;
        ws();
      } else if (peek() != '}') {
        fail("expected ',' or '}' after a value");
      }
    }
    ++i_;
    ws();
    if (i_ != s_.size()) fail("text after the closing '}'");
    if (!seen_descr || !seen_fortran || !seen_shape) {
      fail(strCat("missing key '", !seen_descr ? "descr" : !seen_fortran ? "fortran_order" : "shape",
                  "'"));
    }
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    throw ConfigError(strCat(path_, ": malformed .npy header: ", what, " at character ", i_,
                             " of \"", printable(), "\"; write the file with numpy.save"));
  }
  std::string printable() const {
    std::string out;
    for (char c : s_.substr(0, 200)) {
      const auto u = static_cast<unsigned char>(c);
      out += u >= 0x20 && u < 0x7f ? c : '?';
    }
    if (s_.size() > 200) out += "...";
    return out;
  }
  char peek() const {
    if (i_ >= s_.size()) fail("unexpected end of the header");
    return s_[i_];
  }
  void ws() {
    while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\t' || s_[i_] == '\n' || s_[i_] == '\r')) ++i_;
  }
  void expect(char c) {
    if (peek() != c) fail(strCat("expected '", c, "'"));
    ++i_;
  }
  void dup(bool& seen, const std::string& key) {
    if (seen) fail(strCat("key '", key, "' given twice"));
    seen = true;
  }
  std::string str() {
    const char q = peek();
    if (q != '\'' && q != '"') fail("expected a quoted string");
    ++i_;
    const size_t end = s_.find(q, i_);
    if (end == std::string::npos) fail("unterminated string");
    std::string v = s_.substr(i_, end - i_);
    if (v.find('\\') != std::string::npos) fail("escape sequences are not supported");
    i_ = end + 1;
    return v;
  }
  bool boolean() {
    if (s_.compare(i_, 4, "True") == 0) {
      i_ += 4;
      return true;
    }
    if (s_.compare(i_, 5, "False") == 0) {
      i_ += 5;
      return false;
    }
    fail("expected True or False");
  }
  void tuple() {
    expect('(');
    ws();
    while (peek() != ')') {
      if (peek() < '0' || peek() > '9') fail("expected a non-negative integer in the shape");
      int64_t v = 0;
      while (i_ < s_.size() && s_[i_] >= '0' && s_[i_] <= '9') {
        if (v > (std::numeric_limits<int64_t>::max() - 9) / 10) fail("a dimension too large");
        v = v * 10 + (s_[i_] - '0');
        ++i_;
      }
      if (i_ < s_.size() && s_[i_] == 'L') ++i_;  // Python 2 long
      shape.push_back(v);
      ws();
      if (peek() == ',') {
        ++i_;
        ws();
      } else if (peek() != ')') {
        fail("expected ',' or ')' in the shape");
      }
    }
    ++i_;
  }

  const std::string& s_;
  const std::string& path_;
  size_t i_ = 0;
};

struct DtypeInfo {
  NpyType type;
  const char* code;  // without the byte-order character
};
constexpr DtypeInfo kDtypes[] = {{NpyType::kUint8, "u1"},
                                 {NpyType::kFloat16, "f2"},
                                 {NpyType::kFloat32, "f4"},
                                 {NpyType::kFloat64, "f8"},
                                 {NpyType::kInt32, "i4"},
                                 {NpyType::kInt64, "i8"},
                                 {NpyType::kUint16, "u2"}};

std::string allowedList(const std::vector<NpyType>& allowed) {
  std::string out;
  for (NpyType t : allowed) {
    if (!out.empty()) out += ", ";
    out += toString(t);
  }
  return out;
}

std::string shapeText(const std::vector<int64_t>& shape) {
  std::string s = "(";
  for (size_t i = 0; i < shape.size(); ++i) s += strCat(i ? ", " : "", shape[i]);
  return s + (shape.size() == 1 ? ",)" : ")");
}

}  // namespace

int64_t NpyArray::itemBytes() const {
  switch (type) {
    case NpyType::kUint8: return 1;
    case NpyType::kFloat16: return 2;
    case NpyType::kFloat32: return 4;
    case NpyType::kFloat64: return 8;
    case NpyType::kInt32: return 4;
    case NpyType::kInt64: return 8;
    case NpyType::kUint16: return 2;
  }
  return 1;
}

int64_t NpyArray::rowBytes() const {
  int64_t n = itemBytes();
  for (size_t i = 1; i < shape.size(); ++i) n *= shape[i];
  return n;
}

const char* toString(NpyType t) {
  switch (t) {
    case NpyType::kUint8: return "uint8";
    case NpyType::kFloat16: return "float16";
    case NpyType::kFloat32: return "float32";
    case NpyType::kFloat64: return "float64";
    case NpyType::kInt32: return "int32";
    case NpyType::kInt64: return "int64";
    case NpyType::kUint16: return "uint16";
  }
  return "?";
}

NpyArray parseNpy(const uint8_t* data, std::size_t size, const std::string& path,
                  const std::vector<NpyType>& allowed) {
  if (size < kMagicLen + 2 || std::memcmp(data, kMagic, kMagicLen) != 0) {
    throw ConfigError(strCat(path, ": not a .npy file (no \\x93NUMPY magic at its start; ",
                             size, " bytes); write it with numpy.save"));
  }
  const int major = data[6], minor = data[7];
  size_t header_len = 0, header_start = 0;
  if (major == 1) {
    if (size < 10) throw ConfigError(strCat(path, ": truncated .npy file (", size, " bytes)"));
    header_len = static_cast<size_t>(data[8]) | static_cast<size_t>(data[9]) << 8;
    header_start = 10;
  } else if (major == 2 || major == 3) {
    if (size < 12) throw ConfigError(strCat(path, ": truncated .npy file (", size, " bytes)"));
    header_len = static_cast<size_t>(data[8]) | static_cast<size_t>(data[9]) << 8 |
                 static_cast<size_t>(data[10]) << 16 | static_cast<size_t>(data[11]) << 24;
    header_start = 12;
  } else {
    throw ConfigError(strCat(path, ": unsupported .npy format version ", major, ".", minor,
                             " (expected 1.0, 2.0 or 3.0)"));
  }
  if (header_len > size - header_start) {
    throw ConfigError(strCat(path, ": truncated .npy file: the header says ", header_len,
                             " bytes but the file has ", size - header_start, " after the preamble"));
  }
  const std::string text(reinterpret_cast<const char*>(data) + header_start, header_len);
  HeaderParser hp(text, path);
  hp.parse();

  NpyArray a;
  a.path = path;
  const std::string& d = hp.descr;
  const DtypeInfo* info = nullptr;
  if (d.size() == 3) {
    for (const auto& k : kDtypes) {
      if (d.compare(1, 2, k.code) == 0) info = &k;
    }
  }
  const char order = d.empty() ? '?' : d[0];
  const bool one_byte = info != nullptr && info->type == NpyType::kUint8;
  if (info == nullptr || !(order == '<' || order == '=' || order == '|' || order == '>') ||
      (order == '|' && !one_byte)) {
    throw ConfigError(strCat(path, ": unsupported dtype '", d, "'; expected one of ",
                             allowedList(allowed), " (convert with e.g. arr.astype('<f4'))"));
  }
  if (order == '>' && !one_byte) {
    throw ConfigError(strCat(path, ": big-endian dtype '", d, "'; convert with arr.astype('<",
                             d.substr(1), "') and save again"));
  }
  if (std::find(allowed.begin(), allowed.end(), info->type) == allowed.end()) {
    throw ConfigError(strCat(path, ": dtype ", toString(info->type), " ('", d,
                             "') is not accepted here; expected one of ", allowedList(allowed),
                             " (convert with arr.astype(...))"));
  }
  a.type = info->type;
  if (hp.fortran) {
    throw ConfigError(strCat(path, ": fortran_order is True (column-major data); save "
                                   "np.ascontiguousarray(arr) instead"));
  }
  if (hp.shape.empty()) {
    throw ConfigError(strCat(path, ": the array is a scalar (shape ()); expected at least 1-D"));
  }
  a.shape = hp.shape;
  const size_t data_offset = header_start + header_len;
  const uint64_t avail = size - data_offset;
  uint64_t need = static_cast<uint64_t>(a.itemBytes());
  bool zero = false;
  for (int64_t dim : a.shape) zero = zero || dim == 0;
  if (!zero) {
    for (int64_t dim : a.shape) {
      if (static_cast<uint64_t>(dim) > avail / need) {
        throw ConfigError(strCat(path, ": the data is shorter than the shape says: shape ",
                                 shapeText(a.shape),
                                 " of ", toString(a.type), " needs more than the ", avail,
                                 " bytes after the header (the file is truncated?)"));
      }
      need *= static_cast<uint64_t>(dim);
    }
  }
  a.data = data + data_offset;
  return a;
}

MappedFile mapFile(const std::string& path, const std::string& hint) {
  InputFile in = openInputFile(path);  // Note [input files are regular files]
  if (in.fd < 0) {
    throw ConfigError(
        strCat(path, in.kind.empty() ? ": cannot open: " : ": ", in.why(), " (", hint, ")"));
  }
  const size_t size = static_cast<size_t>(in.size);
  if (size == 0) throw ConfigError(strCat(path, ": empty file (", hint, ")"));
  const int fd = in.release();
  void* p = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
  const int e = errno;
  ::close(fd);  // the mapping stays valid
  if (p == MAP_FAILED) {
    throw ConfigError(strCat(path, ": mmap of ", size, " bytes failed: ", std::strerror(e)));
  }
  MappedFile f;
  f.data = static_cast<const uint8_t*>(p);
  f.size = size;
  f.mapping = std::shared_ptr<void>(p, [size](void* q) { ::munmap(q, size); });
  return f;
}

NpyArray mapNpy(const std::string& path, const std::vector<NpyType>& allowed) {
  MappedFile f = mapFile(path, "check data.path; expected a .npy file written by numpy.save");
  NpyArray a = parseNpy(f.data, f.size, path, allowed);
  a.mapping = std::move(f.mapping);
  return a;
}

}  // namespace batchdist::worker
