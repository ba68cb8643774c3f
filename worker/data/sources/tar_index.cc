// Note [tar index] (tar_index.h): headers only, by pread; the one data read is the
// few bytes of each `cls` member.
#include "worker/data/sources/tar_index.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <limits>

#include "common/error.h"
#include "worker/common/files.h"

namespace batchdist::worker {
namespace {

constexpr int64_t kBlock = 512;
// GNU long names and pax records are metadata: bounded so that a corrupt size
// cannot make us allocate gigabytes.
constexpr int64_t kMaxMetaBytes = 64 << 10;
// A `cls` member holds a small integer; anything longer is not a label.
constexpr int64_t kMaxLabelBytes = 64;

class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }

 private:
  int fd_;
};

/// Reads up to n bytes at `offset`; returns the count read (short only at EOF).
int64_t preadFull(int fd, void* buf, int64_t n, int64_t offset, const std::string& path) {
  int64_t done = 0;
  auto* p = static_cast<char*>(buf);
  while (done < n) {
    const ssize_t r = ::pread(fd, p + done, static_cast<size_t>(n - done), offset + done);
    if (r < 0) {
      if (errno == EINTR) continue;
      throw ConfigError(strCat(path, ": read failed at byte offset ", offset + done, ": ",
                               std::strerror(errno)));
    }
    if (r == 0) break;
    done += r;
  }
  return done;
}

/// A NUL-terminated (or full-width) string field.
std::string field(const char* p, size_t width) {
  size_t n = 0;
  while (n < width && p[n] != '\0') ++n;
  return std::string(p, n);
}

/// An octal numeric field: leading spaces/NULs, digits, then NUL or space. False
/// on a character that is not octal or on overflow.
bool parseOctal(const char* p, size_t width, int64_t* out) {
  size_t i = 0;
  while (i < width && (p[i] == ' ' || p[i] == '\0')) ++i;
  int64_t v = 0;
  for (; i < width && p[i] >= '0' && p[i] <= '7'; ++i) {
    if (v > (std::numeric_limits<int64_t>::max() >> 3)) return false;
    v = (v << 3) | (p[i] - '0');
  }
  for (; i < width; ++i) {
    if (p[i] != ' ' && p[i] != '\0') return false;
  }
  *out = v;
  return true;
}

/// The size field: octal, or GNU base-256 (first byte 0x80) for sizes >= 8 GiB.
bool parseSize(const char* p, int64_t* out) {
  const auto* u = reinterpret_cast<const unsigned char*>(p);
  if (u[0] & 0x80) {
    if (u[0] != 0x80) return false;  // 0xff: negative
    uint64_t v = 0;
    for (int i = 1; i < 12; ++i) {
      if (v > (std::numeric_limits<uint64_t>::max() >> 8)) return false;
      v = (v << 8) | u[i];
    }
    if (v > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return false;
    *out = static_cast<int64_t>(v);
    return true;
  }
  return parseOctal(p, 12, out);
}

bool checksumOk(const char* h) {
  int64_t stored = 0;
  if (!parseOctal(h + 148, 8, &stored)) return false;
  int64_t unsigned_sum = 0, signed_sum = 0;
  for (int i = 0; i < kBlock; ++i) {
    const bool in_field = i >= 148 && i < 156;
    unsigned_sum += in_field ? ' ' : static_cast<unsigned char>(h[i]);
    signed_sum += in_field ? ' ' : static_cast<signed char>(h[i]);
  }
  return stored == unsigned_sum || stored == signed_sum;
}

bool allZero(const char* h) {
  for (int i = 0; i < kBlock; ++i) {
    if (h[i] != 0) return false;
  }
  return true;
}

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

/// Splits a member name into WebDataset's key and extension: the key is the name
/// up to the first dot of its base name. False for a base name without a dot or
/// starting with one (not part of any sample, e.g. "._x.jpg" or "README").
bool splitKey(const std::string& name, std::string* key, std::string* ext) {
  const size_t slash = name.rfind('/');
  const size_t base = slash == std::string::npos ? 0 : slash + 1;
  const size_t dot = name.find('.', base);
  if (dot == std::string::npos || dot == base || dot + 1 == name.size()) return false;
  *key = name.substr(0, dot);
  *ext = name.substr(dot + 1);
  return true;
}

/// Parses "len key=value\n" records of a pax extended header into *path / *size.
/// Returns an empty string or what is wrong.
std::string parsePax(const std::string& data, std::string* path, int64_t* size, bool* has_size) {
  size_t pos = 0;
  while (pos < data.size()) {
    if (data[pos] == '\0') break;  // padding some writers leave
    size_t i = pos;
    int64_t len = 0;
    while (i < data.size() && data[i] >= '0' && data[i] <= '9') {
      len = len * 10 + (data[i] - '0');
      if (len > static_cast<int64_t>(data.size())) return "a record length past its end";
      ++i;
    }
    if (i == pos || i >= data.size() || data[i] != ' ') return "a record without 'length '";
    if (len <= static_cast<int64_t>(i - pos + 1) || pos + len > data.size())
      return "a record length that does not fit";
    const size_t end = pos + static_cast<size_t>(len);  // one past the '\n'
    if (data[end - 1] != '\n') return "a record not ending in a newline";
    const std::string rec = data.substr(i + 1, end - 1 - (i + 1));
    const size_t eq = rec.find('=');
    if (eq == std::string::npos) return "a record without '='";
    const std::string key = rec.substr(0, eq);
    const std::string value = rec.substr(eq + 1);
    if (key == "path") {
      *path = value;
    } else if (key == "size") {
      int64_t v = 0;
      if (value.empty()) return "an empty size";
      for (char c : value) {
        if (c < '0' || c > '9') return "a size that is not a decimal number";
        if (v > (std::numeric_limits<int64_t>::max() - 9) / 10) return "a size that overflows";
        v = v * 10 + (c - '0');
      }
      *size = v;
      *has_size = true;
    }
    pos = end;
  }
  return "";
}

/// Parses a `cls` member: an ASCII integer, whitespace around it allowed.
bool parseLabel(const std::string& text, int64_t* out) {
  size_t b = 0, e = text.size();
  auto space = [](char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\0'; };
  while (b < e && space(text[b])) ++b;
  while (e > b && space(text[e - 1])) --e;
  if (b == e) return false;
  bool neg = false;
  if (text[b] == '+' || text[b] == '-') {
    neg = text[b] == '-';
    ++b;
  }
  if (b == e) return false;
  int64_t v = 0;
  for (size_t i = b; i < e; ++i) {
    if (text[i] < '0' || text[i] > '9') return false;
    if (v > (std::numeric_limits<int64_t>::max() - 9) / 10) return false;
    v = v * 10 + (text[i] - '0');
  }
  *out = neg ? -v : v;
  return true;
}

/// The sample being gathered: the run of adjacent members with one key.
struct Pending {
  std::string key;
  bool active = false;
  bool has_image = false, has_label = false;
  std::vector<std::string> exts;  ///< lowercased, to find repeats
  TarSample sample;
  int64_t first_offset = 0;  ///< header offset of its first member (for messages)
};

}  // namespace

TarShard indexTar(const std::string& path) {
  TarShard shard;
  shard.path = path;
  InputFile in = openInputFile(path);  // Note [input files are regular files]
  if (in.fd < 0 && in.kind.empty()) {
    throw ConfigError(strCat(path, ": cannot open the tar shard: ", in.why(),
                             " (check data.path / the shard pattern)"));
  }
  if (in.fd < 0) throw ConfigError(strCat(path, ": ", in.why(), " (expected a .tar shard)"));
  Fd fd(in.release());
  const int64_t file_size = static_cast<int64_t>(in.size);

  auto where = [&](const std::string& member, int64_t offset) {
    return strCat(path, ": member '", member, "' (header at byte offset ", offset, ")");
  };

  Pending cur;
  auto finish = [&]() {
    if (!cur.active) return;
    cur.active = false;
    if (!cur.has_image && !cur.has_label) {
      // Only members of no sample kind (already counted as skipped).
      return;
    }
    if (!cur.has_image) {
      throw ConfigError(strCat(path, ": sample '", cur.key, "' (byte offset ", cur.first_offset,
                               ") has a cls member but no image (.jpg/.jpeg/.png); every "
                               "sample needs one image and one .cls label"));
    }
    if (!cur.has_label) {
      throw ConfigError(strCat(path, ": sample '", cur.key, "' (byte offset ", cur.first_offset,
                               ") has no .cls member (its label); every sample needs one image "
                               "and one .cls label, as adjacent members sharing the key"));
    }
    cur.sample.key = cur.key;
    shard.samples.push_back(std::move(cur.sample));
    cur.sample = TarSample();
  };

  char h[kBlock];
  int64_t offset = 0;
  std::string long_name;      // from a GNU 'L' record, for the next member
  std::string pax_path;       // from a pax 'x' record, for the next member
  int64_t pax_size = 0;
  bool pax_has_size = false;
  while (true) {
    const int64_t got = preadFull(fd.get(), h, kBlock, offset, path);
    if (got == 0) break;  // EOF without end-of-archive blocks: accepted
    if (got < kBlock) {
      throw ConfigError(strCat(path, ": truncated archive: a partial header (", got,
                               " bytes) at byte offset ", offset,
                               "; the shard was cut short (re-copy or re-create it)"));
    }
    if (allZero(h)) break;  // end of archive (GNU tar also stops at the first zero block)
    std::string name = field(h, 100);
    if (!checksumOk(h)) {
      throw ConfigError(strCat(where(name, offset),
                               ": bad header checksum; the file is not a tar archive or is "
                               "corrupt (re-create the shard)"));
    }
    const char type = h[156];
    int64_t size = 0;
    if (!parseSize(h + 124, &size)) {
      throw ConfigError(strCat(where(name, offset), ": the size field is not a number; the "
                                                    "archive is corrupt (re-create the shard)"));
    }
    // POSIX ustar: name = prefix + "/" + name (GNU's header uses those bytes otherwise).
    if (std::memcmp(h + 257, "ustar\0", 6) == 0) {
      const std::string prefix = field(h + 345, 155);
      if (!prefix.empty()) name = prefix + "/" + name;
    }
    const bool is_meta = type == 'L' || type == 'K' || type == 'x' || type == 'g';
    if (!is_meta) {
      if (!long_name.empty()) name = long_name;
      if (!pax_path.empty()) name = pax_path;
      if (pax_has_size) size = pax_size;
      long_name.clear();
      pax_path.clear();
      pax_has_size = false;
    }
    const int64_t data_offset = offset + kBlock;
    if (size > file_size - data_offset) {
      throw ConfigError(strCat(path, ": truncated archive: member '", name,
                               "' (header at byte offset ", offset, ") has ", size,
                               " bytes of data but the file ends ", file_size - data_offset,
                               " bytes after its header; re-copy or re-create the shard"));
    }
    const int64_t next = data_offset + (size + kBlock - 1) / kBlock * kBlock;

    if (is_meta) {
      if (type == 'L' || type == 'x') {
        if (size > kMaxMetaBytes) {
          throw ConfigError(strCat(where(name, offset), ": a ",
                                   type == 'L' ? "GNU long-name" : "pax extended header",
                                   " record of ", size, " bytes (more than ", kMaxMetaBytes,
                                   "); the archive is corrupt"));
        }
        std::string data(static_cast<size_t>(size), '\0');
        if (preadFull(fd.get(), data.data(), size, data_offset, path) != size) {
          throw ConfigError(strCat(where(name, offset), ": truncated archive"));
        }
        if (type == 'L') {
          long_name = field(data.data(), data.size());
        } else {
          const std::string bad = parsePax(data, &pax_path, &pax_size, &pax_has_size);
          if (!bad.empty()) {
            throw ConfigError(strCat(where(name, offset), ": malformed pax extended header (",
                                     bad, "); the archive is corrupt"));
          }
          if (pax_has_size && pax_size > file_size) {
            throw ConfigError(strCat(path, ": truncated archive: the pax header at byte offset ",
                                     offset, " gives the next member ", pax_size,
                                     " bytes, more than the file holds"));
          }
        }
      }
      // 'K' (long link name) and 'g' (global pax) carry nothing we use.
      offset = next;
      continue;
    }

    const bool regular = type == '0' || type == '\0' || type == '7';
    if (type == '5' || (!regular && !name.empty() && name.back() == '/')) {
      offset = next;  // directory
      continue;
    }
    std::string key, ext;
    if (!regular || !splitKey(name, &key, &ext)) {
      ++shard.skipped_members;  // as WebDataset: skipped, the run goes on
      offset = next;
      continue;
    }
    if (!cur.active || key != cur.key) {
      finish();
      cur = Pending();
      cur.active = true;
      cur.key = key;
      cur.first_offset = offset;
    }
    const std::string lext = lower(ext);
    if (std::find(cur.exts.begin(), cur.exts.end(), lext) != cur.exts.end()) {
      throw ConfigError(strCat(where(name, offset), ": sample '", key, "' repeats the extension '",
                               ext, "'; a sample's members must have distinct extensions"));
    }
    cur.exts.push_back(lext);
    if (lext == "jpg" || lext == "jpeg" || lext == "png") {
      if (cur.has_image) {
        throw ConfigError(strCat(where(name, offset), ": sample '", key, "' has a second image ('",
                                 cur.sample.image_member, "' and '", name,
                                 "'); keep one image per sample"));
      }
      cur.has_image = true;
      cur.sample.image_offset = data_offset;
      cur.sample.image_size = size;
      cur.sample.image_member = name;
    } else if (lext == "cls") {
      std::string text;
      if (size <= kMaxLabelBytes) {
        text.resize(static_cast<size_t>(size));
        if (preadFull(fd.get(), text.data(), size, data_offset, path) != size) {
          throw ConfigError(strCat(where(name, offset), ": truncated archive"));
        }
      }
      int64_t label = 0;
      if (size > kMaxLabelBytes || !parseLabel(text, &label)) {
        throw ConfigError(strCat(where(name, offset), ": the label is not an integer (",
                                 size > kMaxLabelBytes ? strCat(size, " bytes")
                                                       : strCat("'", text, "'"),
                                 "); a .cls member holds the class index as ASCII, e.g. \"3\""));
      }
      if (label < 0) {
        throw ConfigError(strCat(where(name, offset), ": negative label ", label,
                                 "; class indices start at 0"));
      }
      cur.has_label = true;
      cur.sample.label = label;
    } else {
      ++shard.skipped_members;
    }
    offset = next;
  }
  finish();
  return shard;
}

namespace {

constexpr size_t kMaxExpansions = 1000000;

/// Expands the braces of `pattern` into `out`; returns what is malformed or "".
std::string expandBraces(const std::string& pattern, std::vector<std::string>* out) {
  const size_t open = pattern.find('{');
  const size_t close_before = pattern.find('}');
  if (open == std::string::npos) {
    if (close_before != std::string::npos) return "a '}' without '{'";
    if (out->size() >= kMaxExpansions) return strCat("more than ", kMaxExpansions, " names");
    out->push_back(pattern);
    return "";
  }
  if (close_before < open) return "a '}' without '{'";
  const size_t close = pattern.find('}', open);
  if (close == std::string::npos) return "a '{' without '}'";
  const std::string body = pattern.substr(open + 1, close - open - 1);
  if (body.find('{') != std::string::npos) return "nested braces";
  const std::string head = pattern.substr(0, open);
  const std::string tail = pattern.substr(close + 1);
  std::vector<std::string> items;
  const size_t dots = body.find("..");
  if (body.find(',') == std::string::npos && dots != std::string::npos) {
    const std::string a = body.substr(0, dots), b = body.substr(dots + 2);
    auto digits = [](const std::string& s) {
      return !s.empty() && s.size() <= 18 &&
             std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
    };
    if (!digits(a) || !digits(b)) return strCat("the range {", body, "} is not {first..last} in decimal");
    const int64_t lo = std::stoll(a), hi = std::stoll(b);
    if (lo > hi) return strCat("the range {", body, "} goes down");
    if (hi - lo >= static_cast<int64_t>(kMaxExpansions)) return strCat("the range {", body, "} is too long");
    const size_t width = a.size() > 1 && a[0] == '0' ? a.size() : 0;
    for (int64_t v = lo; v <= hi; ++v) {
      std::string s = std::to_string(v);
      if (s.size() < width) s.insert(0, width - s.size(), '0');
      items.push_back(std::move(s));
    }
  } else {
    size_t pos = 0;
    while (true) {
      const size_t comma = body.find(',', pos);
      items.push_back(body.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos));
      if (comma == std::string::npos) break;
      pos = comma + 1;
    }
    if (items.size() < 2) return strCat("{", body, "} is neither a list {a,b} nor a range {0..9}");
  }
  for (const auto& item : items) {
    const std::string bad = expandBraces(head + item + tail, out);
    if (!bad.empty()) return bad;
  }
  return "";
}

}  // namespace

std::vector<std::string> expandShards(const std::string& pattern) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (pattern.empty()) throw ConfigError("data.path: empty shard pattern");
  if (pattern.find('{') == std::string::npos && fs::is_directory(pattern, ec)) {
    std::vector<std::string> files;
    for (fs::directory_iterator it(pattern, ec), end; !ec && it != end; it.increment(ec)) {
      const fs::path& p = it->path();
      std::error_code ec2;
      // Note [input files are regular files]: a .tar that is a FIFO or a device
      // is listed, so indexTar names it; it was left out without a word.
      if (p.extension() == ".tar" && !fs::is_directory(p, ec2)) files.push_back(p.string());
    }
    if (ec) {
      throw ConfigError(strCat("data.path: cannot list ", pattern, ": ", ec.message()));
    }
    if (files.empty()) {
      throw ConfigError(strCat("data.path: the directory ", pattern,
                               " has no .tar files (expected WebDataset shards, e.g. "
                               "train-000000.tar)"));
    }
    std::sort(files.begin(), files.end());
    return files;
  }
  std::vector<std::string> names;
  const std::string bad = expandBraces(pattern, &names);
  if (!bad.empty()) {
    throw ConfigError(strCat("data.path: malformed shard pattern '", pattern, "': ", bad,
                             " (expected e.g. train-{000000..000127}.tar or a-{x,y}.tar)"));
  }
  if (names.empty()) throw ConfigError(strCat("data.path: the pattern '", pattern, "' matches no file"));
  int64_t missing = 0;
  std::string first_missing;
  for (const auto& n : names) {
    std::error_code ec2;
    if (!fs::exists(n, ec2)) {  // a FIFO exists: indexTar says what it is
      if (missing++ == 0) first_missing = n;
    }
  }
  if (missing > 0) {
    throw ConfigError(strCat("data.path: shard ", first_missing, " does not exist",
                             missing > 1 ? strCat(" (", missing, " of the ", names.size(),
                                                  " shards of '", pattern, "' are missing)")
                                         : std::string(),
                             "; check the pattern and the shard files"));
  }
  return names;
}

}  // namespace batchdist::worker
