// Tar shards and .npy files for the tests and batchdist_make_data (image_fixtures.h).
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <stdexcept>

#include "tests/image_fixtures.h"

namespace batchdist::testing {
namespace {

void putOctal(char* field, size_t width, uint64_t v) {
  // width-1 zero-padded octal digits and a NUL, as GNU tar writes them.
  std::snprintf(field, width, "%0*llo", static_cast<int>(width - 1),
                static_cast<unsigned long long>(v));
}

std::string header(const std::string& name, uint64_t size, char type, bool gnu_magic) {
  std::string h(512, '\0');
  std::memcpy(h.data(), name.data(), std::min<size_t>(name.size(), 100));
  putOctal(&h[100], 8, 0644);
  putOctal(&h[108], 8, 0);
  putOctal(&h[116], 8, 0);
  putOctal(&h[124], 12, size);
  putOctal(&h[136], 12, 1700000000);
  h[156] = type;
  if (gnu_magic) {
    std::memcpy(&h[257], "ustar  ", 8);  // "ustar  \0"
  } else {
    std::memcpy(&h[257], "ustar", 6);  // "ustar\0" "00"
    h[263] = '0';
    h[264] = '0';
  }
  std::memcpy(&h[265], "root", 4);
  std::memcpy(&h[297], "root", 4);
  std::memset(&h[148], ' ', 8);
  unsigned sum = 0;
  for (char c : h) sum += static_cast<unsigned char>(c);
  std::snprintf(&h[148], 7, "%06o", sum);  // six digits, NUL, space
  h[155] = ' ';
  return h;
}

void pad(std::string* out) { out->append((512 - out->size() % 512) % 512, '\0'); }

}  // namespace

std::string makeTar(const std::vector<std::pair<std::string, std::string>>& members) {
  std::string out;
  for (const auto& [name, bytes] : members) {
    if (name.size() > 100) {
      out += header("././@LongLink", name.size() + 1, 'L', true);
      out += name;
      out += '\0';
      pad(&out);
    }
    out += header(name, bytes.size(), '0', name.size() > 100);
    out += bytes;
    pad(&out);
  }
  out.append(1024, '\0');
  return out;
}

std::string makeNpy(worker::NpyType type, const std::vector<int64_t>& shape,
                    const std::string& data, bool fortran_order) {
  const char* descr = "|u1";
  switch (type) {
    case worker::NpyType::kUint8: descr = "|u1"; break;
    case worker::NpyType::kFloat16: descr = "<f2"; break;
    case worker::NpyType::kFloat32: descr = "<f4"; break;
    case worker::NpyType::kFloat64: descr = "<f8"; break;
    case worker::NpyType::kInt32: descr = "<i4"; break;
    case worker::NpyType::kInt64: descr = "<i8"; break;
    case worker::NpyType::kUint16: descr = "<u2"; break;
  }
  std::string tuple = "(";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) tuple += ", ";
    tuple += std::to_string(shape[i]);
  }
  tuple += shape.size() == 1 ? ",)" : ")";
  std::string dict = std::string("{'descr': '") + descr + "', 'fortran_order': " +
                     (fortran_order ? "True" : "False") + ", 'shape': " + tuple + ", }";
  // numpy pads with spaces and a newline so the data starts 64-byte aligned.
  const size_t total = (10 + dict.size() + 1 + 63) / 64 * 64;
  dict.append(total - 10 - dict.size() - 1, ' ');
  dict += '\n';
  if (dict.size() > 65535) throw std::invalid_argument("makeNpy: header too long for v1.0");
  std::string out = "\x93NUMPY";
  out += '\x01';
  out += '\x00';
  out += static_cast<char>(dict.size() & 0xff);
  out += static_cast<char>(dict.size() >> 8);
  out += dict;
  out += data;
  return out;
}

}  // namespace batchdist::testing
