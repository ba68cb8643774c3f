// The input pipeline's readers and decoders under deterministic mutation, in
// every ctest run (as tests/config_fuzz_test.cc does for the config loader).
// Seeds: the libFuzzer corpora (tests/fuzz/image_corpus/, tests/fuzz/corpus_archive/)
// plus images, tar shards, .npy files and image lists generated here with
// tests/image_fixtures.h. Each is mutated a few thousand times: bit flips, random
// and "interesting" bytes, truncation (anywhere, and just before the end),
// duplicated, spliced, zeroed and deleted ranges, and length fields overwritten
// with extreme values (JPEG SOF dimensions and segment lengths, PNG IHDR and
// chunk lengths, tar size/type/name fields, pax and GNU long-name records, the
// .npy header length, version, dtype and shape); half of the mutants then get
// their PNG CRCs and tar header checksums recomputed so that they reach past
// the integrity checks. Every prefix of every seed is tried as well.
//
// The contracts are tests/fuzz/image_fuzz_check.h (decodeCropResize: a sample or
// DecodeError, nothing written outside the output) and
// tests/fuzz/archive_fuzz_check.h (indexTar, parseNpy/mapNpy, parseImageList,
// readImageList: a result that keeps its invariants or ConfigError), shared with
// the libFuzzer targets. Any other exception fails the test, a crash or a hang
// does too (ctest's TIMEOUT). The work is bounded by input counts, not by time,
// so every run tries the same inputs. A failing input is saved under
// ::testing::TempDir() to be replayed (and added to the corpus once fixed).
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

#include "tests/fuzz/fuzz_rng.h"
#include "fuzz/archive_fuzz_check.h"
#include "fuzz/image_fuzz_check.h"
#include "tests/image_fixtures.h"

namespace fs = std::filesystem;
using batchdist::fuzz::ArchiveOutcome;
using batchdist::fuzz::checkArchive;
using batchdist::fuzz::checkImage;
using batchdist::worker::DecodeScratch;
using batchdist::worker::NpyType;

namespace {

using batchdist::fuzz::Rng;

const uint8_t* bytes(const std::string& s) { return reinterpret_cast<const uint8_t*>(s.data()); }
uint8_t u8(const std::string& s, std::size_t i) { return static_cast<uint8_t>(s[i]); }

std::string readAll(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

struct Seed {
  std::string name;
  std::string bytes;
};

void addDir(std::vector<Seed>* out, const char* dir) {
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(std::string(BATCHDIST_SOURCE_DIR) + dir)) {
    if (e.is_regular_file()) files.push_back(e.path());
  }
  std::sort(files.begin(), files.end());  // directory order is not deterministic
  for (const auto& f : files) out->push_back({f.filename().string(), readAll(f)});
}

// ---- seeds -------------------------------------------------------------------

std::vector<Seed> imageSeeds() {
  using namespace batchdist::testing;
  std::vector<Seed> out;
  addDir(&out, "/tests/fuzz/image_corpus");
  for (const auto& [w, h] : {std::pair{53, 41}, std::pair{17, 9}, std::pair{131, 97}}) {
    const std::string dim = std::to_string(w) + "x" + std::to_string(h);
    const std::vector<uint8_t> rgb = patternRgb(w, h, 2, 99);
    const std::size_t n = static_cast<std::size_t>(w) * h;
    std::vector<uint8_t> gray(n), cmyk(n * 4);
    for (std::size_t i = 0; i < n; ++i) {
      gray[i] = static_cast<uint8_t>((rgb[i * 3] + rgb[i * 3 + 1] + rgb[i * 3 + 2]) / 3);
      for (int k = 0; k < 3; ++k) cmyk[i * 4 + k] = static_cast<uint8_t>(255 - rgb[i * 3 + k]);
      cmyk[i * 4 + 3] = static_cast<uint8_t>(i % 256);
    }
    out.push_back({"gen_jpeg_rgb_" + dim, encodeJpeg(rgb.data(), w, h, 3, 90)});
    out.push_back({"gen_jpeg_progressive_" + dim, encodeJpeg(rgb.data(), w, h, 3, 75, true)});
    if (w > 100) continue;  // the large one: baseline and progressive only
    out.push_back({"gen_jpeg_gray_" + dim, encodeJpeg(gray.data(), w, h, 1, 80)});
    out.push_back({"gen_jpeg_cmyk_" + dim, encodeJpeg(cmyk.data(), w, h, 4, 85)});
    if (w < 50) continue;
    for (const auto& [kind, name] :
         {std::pair{PngKind::kRgb8, "rgb"}, std::pair{PngKind::kRgba8, "rgba"},
          std::pair{PngKind::kGray8, "gray"}, std::pair{PngKind::kGrayAlpha8, "gray_alpha"},
          std::pair{PngKind::kPalette8, "palette"}, std::pair{PngKind::kRgb16, "rgb16"}}) {
      out.push_back({std::string("gen_png_") + name + "_" + dim, encodePng(rgb.data(), w, h, kind)});
    }
  }
  return out;
}

std::vector<Seed> archiveSeeds() {
  using namespace batchdist::testing;
  std::vector<Seed> out;
  addDir(&out, "/tests/fuzz/corpus_archive");
  const std::vector<uint8_t> rgb = patternRgb(13, 11, 1, 5);
  const std::string jpg = encodeJpeg(rgb.data(), 13, 11, 3, 70);
  const std::string png = encodePng(rgb.data(), 13, 11, PngKind::kPalette8);
  out.push_back({"gen_three_samples.tar",
                 makeTar({{"s0.jpg", jpg},
                          {"s0.cls", "3"},
                          {"d/s1.cls", "0\n"},
                          {"d/s1.png", png},
                          {"s2.json", "{}"},
                          {"s2.JPEG", jpg},
                          {"s2.cls", " 7 "}})});
  out.push_back({"gen_long_name.tar",
                 makeTar({{std::string(120, 'k') + "/x.cls", "1"},
                          {std::string(120, 'k') + "/x.png", png},
                          {"README", "no sample"},
                          {"dir/", ""}})});
  out.push_back({"gen_u8_3x2x2.npy", makeNpy(NpyType::kUint8, {3, 2, 2}, std::string(12, '\x07'))});
  out.push_back({"gen_f16_2x3.npy", makeNpy(NpyType::kFloat16, {2, 3}, std::string(12, '\0'))});
  out.push_back({"gen_f32_4.npy", makeNpy(NpyType::kFloat32, {4}, std::string(16, '\x3f'))});
  out.push_back({"gen_i32_5.npy", makeNpy(NpyType::kInt32, {5}, std::string(20, '\x01'))});
  out.push_back({"gen_i64_3.npy", makeNpy(NpyType::kInt64, {3}, std::string(24, '\0'))});
  out.push_back({"gen_u8_0x4.npy", makeNpy(NpyType::kUint8, {0, 4}, "")});
  batchdist::worker::ImageList list;
  list.classes = {"cat", "dog", "with space", ""};
  list.train = {{"cat/1.jpg", 0}, {"dog/a b.png", 1}, {"with space/x.JPEG", 2}};
  list.val = {{"cat/v.jpg", 0}};
  list.has_val = true;
  list.skipped = 2;
  list.dirs = {{"train", 1700000000123456789}, {"train/cat", -5}};
  out.push_back({"gen_image_list.cache", batchdist::worker::serializeImageList(list)});
  out.push_back({"gen_list.txt", "# comment\n\nimgs/a.jpg 0\n  spaced name.png   12\r\nz 2147483647\n"});
  return out;
}

// ---- format knowledge for the mutations ---------------------------------------

uint32_t crc32(const uint8_t* p, std::size_t n) {
  static const auto table = [] {
    std::vector<uint32_t> t(256);
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
      t[i] = c;
    }
    return t;
  }();
  uint32_t c = 0xFFFFFFFFu;
  for (std::size_t i = 0; i < n; ++i) c = table[(c ^ p[i]) & 0xFF] ^ (c >> 8);
  return c ^ 0xFFFFFFFFu;
}

uint32_t be32(const std::string& s, std::size_t i) {
  return uint32_t{u8(s, i)} << 24 | uint32_t{u8(s, i + 1)} << 16 | uint32_t{u8(s, i + 2)} << 8 |
         u8(s, i + 3);
}
void putBe32(std::string& s, std::size_t i, uint32_t v) {
  for (int k = 0; k < 4; ++k) s[i + k] = static_cast<char>(v >> (24 - 8 * k));
}
void putBe16(std::string& s, std::size_t i, uint32_t v) {
  s[i] = static_cast<char>(v >> 8);
  s[i + 1] = static_cast<char>(v);
}

bool isJpeg(const std::string& s) { return s.size() >= 3 && u8(s, 0) == 0xFF && u8(s, 1) == 0xD8; }
bool isPng(const std::string& s) { return s.size() >= 8 && s.compare(0, 8, "\x89PNG\r\n\x1a\n") == 0; }
bool isNpy(const std::string& s) { return s.size() >= 6 && s.compare(0, 6, "\x93NUMPY") == 0; }

/// Offsets of the JPEG marker segments before the entropy data (SOS included).
std::vector<std::size_t> jpegSegments(const std::string& s) {
  std::vector<std::size_t> out;
  std::size_t i = 2;
  while (i + 4 <= s.size() && u8(s, i) == 0xFF) {
    const uint8_t m = u8(s, i + 1);
    if (m == 0xFF) {
      ++i;
      continue;
    }
    if (m == 0xD8 || m == 0x01 || (m >= 0xD0 && m <= 0xD7)) {
      i += 2;
      continue;
    }
    out.push_back(i);
    if (m == 0xDA || m == 0xD9) break;
    i += 2 + (std::size_t{u8(s, i + 2)} << 8 | u8(s, i + 3));
  }
  return out;
}
bool isSof(uint8_t m) { return m >= 0xC0 && m <= 0xCF && m != 0xC4 && m != 0xC8 && m != 0xCC; }

/// Offsets of the PNG chunks (length field) that fit in the file.
std::vector<std::size_t> pngChunks(const std::string& s) {
  std::vector<std::size_t> out;
  std::size_t i = 8;
  while (i + 12 <= s.size()) {
    out.push_back(i);
    const uint64_t len = be32(s, i);
    if (len > s.size()) break;
    i += 12 + static_cast<std::size_t>(len);
  }
  return out;
}

/// Recomputes the CRC of every PNG chunk that fits (so mutants get past libpng's
/// CRC check and reach the decoder proper).
void fixPngCrcs(std::string& s) {
  if (!isPng(s)) return;
  for (std::size_t at : pngChunks(s)) {
    const uint64_t len = be32(s, at);
    if (at + 12 + len > s.size()) break;
    putBe32(s, at + 8 + static_cast<std::size_t>(len),
            crc32(bytes(s) + at + 4, 4 + static_cast<std::size_t>(len)));
  }
}

/// 512-byte blocks that look like tar headers (ustar magic).
std::vector<std::size_t> tarHeaders(const std::string& s) {
  std::vector<std::size_t> out;
  for (std::size_t at = 0; at + 512 <= s.size(); at += 512) {
    if (s.compare(at + 257, 5, "ustar") == 0) out.push_back(at);
  }
  return out;
}

void fixTarChecksums(std::string& s) {
  for (std::size_t at : tarHeaders(s)) {
    std::memset(&s[at + 148], ' ', 8);
    unsigned sum = 0;
    for (std::size_t i = 0; i < 512; ++i) sum += u8(s, at + i);
    char buf[8];
    std::snprintf(buf, sizeof buf, "%06o", sum & 0777777);
    std::memcpy(&s[at + 148], buf, 6);
    s[at + 154] = '\0';
    s[at + 155] = ' ';
  }
}

/// A ustar header block (checksum filled in) for inserting records.
std::string tarHeader(const std::string& name, const std::string& size_field, char type) {
  std::string h(512, '\0');
  std::memcpy(&h[0], name.data(), std::min<std::size_t>(name.size(), 100));
  std::memcpy(&h[124], size_field.data(), std::min<std::size_t>(size_field.size(), 12));
  h[156] = type;
  std::memcpy(&h[257], "ustar\0" "00", 8);
  fixTarChecksums(h);
  return h;
}

std::string octal(uint64_t v, int width = 11) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%0*llo", width, static_cast<unsigned long long>(v));
  return buf;
}

const uint32_t kInteresting16[] = {0,   1,    2,    7,     8,     9,     15,    16,   17,
                                   255, 256,  4095, 4096,  16383, 16384, 16385, 32767, 32768,
                                   65500, 65535};
const uint32_t kInteresting32[] = {0,          1,          7,          8,          255,
                                   256,        4096,       16384,      16385,      32768,
                                   65535,      65536,      1u << 20,   0x7FFFFFFF, 0x80000000,
                                   0xFFFFFFFE, 0xFFFFFFFF};
const char* const kBigNumbers[] = {"0",
                                   "1",
                                   "-1",
                                   "4294967296",
                                   "2147483648",
                                   "4611686018427387904",
                                   "9223372036854775807",
                                   "9223372036854775808",
                                   "18446744073709551615",
                                   "99999999999999999999999",
                                   "00000000000000000000000000000000000000001"};

/// Replaces the digit run at or after a random point with an extreme number
/// (shapes, counts, labels, octal fields).
void replaceNumber(std::string& s, Rng& rng, std::size_t from = 0) {
  const auto at = s.find_first_of("0123456789", from + rng.below(s.size() - std::min(from, s.size()) + 1));
  if (at == std::string::npos) return;
  const auto end = s.find_first_not_of("0123456789", at);
  s.replace(at, (end == std::string::npos ? s.size() : end) - at, rng.pick(kBigNumbers));
}

/// Overwrites a length or size field of the format `s` has with an extreme value.
void mutateLengthField(std::string& s, Rng& rng) {
  if (isJpeg(s)) {
    const auto segs = jpegSegments(s);
    if (segs.empty()) return;
    std::vector<std::size_t> sofs;
    for (auto at : segs) {
      if (isSof(u8(s, at + 1)) && at + 10 <= s.size()) sofs.push_back(at);
    }
    const std::size_t r = rng.below(6);
    if (!sofs.empty() && r < 4) {
      const std::size_t at = sofs[rng.below(sofs.size())];
      if (r == 0 || r == 2) putBe16(s, at + 5, rng.pick(kInteresting16));  // height
      if (r == 1 || r == 2) putBe16(s, at + 7, rng.pick(kInteresting16));  // width
      if (r == 3) {  // components, sampling factors, quantisation table selectors
        const std::size_t k = at + 9 + rng.below(10);
        if (k < s.size()) s[k] = static_cast<char>(rng.pick(kInteresting16));
      }
    } else {
      const std::size_t at = segs[rng.below(segs.size())];
      putBe16(s, at + 2, rng.below(2) ? rng.pick(kInteresting16) : rng.below(s.size() + 3));
    }
    return;
  }
  if (isPng(s)) {
    const auto chunks = pngChunks(s);
    const std::size_t r = rng.below(7);
    if (r < 2 && s.size() >= 33) {  // IHDR width or height (or both)
      putBe32(s, 16 + 4 * r, rng.pick(kInteresting32));
      if (rng.below(3) == 0) putBe32(s, 20 - 4 * r, rng.pick(kInteresting32));
    } else if (r == 2 && s.size() >= 33) {  // bit depth, colour type, interlace
      const uint8_t depths[] = {0, 1, 2, 3, 4, 8, 16, 255};
      const uint8_t kinds[] = {0, 1, 2, 3, 4, 5, 6, 7};
      s[24] = static_cast<char>(rng.pick(depths));
      s[25] = static_cast<char>(rng.pick(kinds));
      if (rng.below(2)) s[28] = static_cast<char>(rng.below(3));
    } else if (!chunks.empty()) {
      const std::size_t at = chunks[rng.below(chunks.size())];
      putBe32(s, at, rng.below(2) ? rng.pick(kInteresting32)
                                  : static_cast<uint32_t>(rng.below(s.size() + 16)));
    }
    if (rng.below(4) != 0) fixPngCrcs(s);  // mostly: past the CRC check
    return;
  }
  if (isNpy(s) && s.size() >= 12) {
    switch (rng.below(5)) {
      case 0:  // header length (v1: 2 bytes, v2/v3: 4)
        if (u8(s, 6) == 1) {
          const uint32_t v = rng.pick(kInteresting16);
          s[8] = static_cast<char>(v), s[9] = static_cast<char>(v >> 8);
        } else {
          const uint32_t v = rng.pick(kInteresting32);
          for (int k = 0; k < 4; ++k) s[8 + k] = static_cast<char>(v >> (8 * k));
        }
        break;
      case 1: {  // version
        const uint8_t versions[] = {0, 1, 2, 3, 4, 255};
        s[6] = static_cast<char>(rng.pick(versions));
        break;
      }
      case 2: {  // dtype
        const auto at = s.find("descr");
        const auto q = at == std::string::npos ? at : s.find_first_of("'\"", at + 7);
        const auto q2 = q == std::string::npos ? q : s.find_first_of("'\"", q + 1);
        if (q2 == std::string::npos) break;
        const char* const descrs[] = {"'<f8'", "'>i4'", "'|u1'", "'>u1'", "'=f2'", "'<U3'",
                                      "'O'", "''", "[('a', '<i4')]", "'<i8"};
        s.replace(q, q2 + 1 - q, rng.pick(descrs));
        break;
      }
      default: {  // a dimension of the shape
        const auto at = s.find('(');
        if (at != std::string::npos) replaceNumber(s, rng, at);
      }
    }
    return;
  }
  const auto headers = tarHeaders(s);
  if (!headers.empty()) {
    const std::size_t at = headers[rng.below(headers.size())];
    const int64_t size = static_cast<int64_t>(s.size());
    switch (rng.below(6)) {
      case 0:
      case 1: {  // the size field
        std::string f;
        switch (rng.below(6)) {
          case 0: f = octal(static_cast<uint64_t>(size - static_cast<int64_t>(at) - 512 + static_cast<int64_t>(rng.below(1100)) - 550)); break;
          case 1: f = octal(rng.pick(kInteresting32)); break;
          case 2: f = octal(077777777777ull); break;
          case 3: {  // GNU base-256
            f = std::string(12, '\0');
            f[0] = static_cast<char>(rng.below(4) ? 0x80 : 0xFF);
            const uint64_t v = rng.below(2) ? (uint64_t{1} << 62) + rng.below(1000)
                                            : static_cast<uint64_t>(rng.below(size + 1));
            for (int k = 0; k < 8; ++k) f[4 + k] = static_cast<char>(v >> (56 - 8 * k));
            break;
          }
          case 4: f = "          \0"; break;
          default: f = octal(rng.below(2048), 11); f[rng.below(11)] = static_cast<char>("89 x-\0"[rng.below(6)]);
        }
        f.resize(12, '\0');
        s.replace(at + 124, 12, f);
        break;
      }
      case 2:  // the type
        s[at + 156] = "0\0" "57LKxg12S"[rng.below(11)];
        break;
      case 3: {  // the name (keys, extensions, directories)
        const char* const names[] = {"a.cls", "a.jpg", "a.JPEG", "a.png", ".jpg", "a.", "a",
                                     "a/", "a/b.c.cls", "x.json", "", "a.cls\0junk"};
        std::string n = rng.pick(names);
        n.resize(100, '\0');
        s.replace(at, 100, n);
        break;
      }
      default: {  // a pax or GNU long-name record before this member
        std::string body;
        char type = 'x';
        switch (rng.below(5)) {
          case 0: body = "21 path=k.jpg\n"; break;
          case 1: body = std::string("25 size=") + rng.pick(kBigNumbers) + "\n"; break;
          case 2: body = std::to_string(rng.below(40)) + " path=kk.cls\n"; break;
          case 3: body = "18 size=" + std::to_string(rng.below(size + 1)) + "\n"; break;
          default: type = 'L', body = std::string(1 + rng.below(300), 'n') + ".png";
        }
        std::string rec = tarHeader("././@PaxHeader", octal(body.size()), type) + body;
        rec.append((512 - rec.size() % 512) % 512, '\0');
        s.insert(at, rec);
        return;  // already has its checksum
      }
    }
    if (rng.below(4) != 0) fixTarChecksums(s);
    return;
  }
  replaceNumber(s, rng);  // text: image lists, list files
}

// ---- the mutator ---------------------------------------------------------------

constexpr std::size_t kMaxMutant = 1 << 16;

/// One mutation of `s` (deterministic given the generator's state).
void mutate(std::string& s, Rng& rng, const std::vector<Seed>& pool) {
  const auto range = [&](std::size_t max_len, std::size_t* at, std::size_t* len) {
    *at = rng.below(s.size());
    *len = std::min(1 + rng.below(max_len), s.size() - *at);
  };
  std::size_t at = 0, len = 0;
  switch (rng.below(14)) {
    case 0:  // flip a bit
      if (!s.empty()) s[rng.below(s.size())] ^= static_cast<char>(1u << rng.below(8));
      break;
    case 1:  // random bytes
      if (s.empty()) break;
      range(8, &at, &len);
      for (std::size_t i = 0; i < len; ++i) s[at + i] = static_cast<char>(rng.next());
      break;
    case 2:  // truncate anywhere
      s.resize(rng.below(s.size() + 1));
      break;
    case 3:  // truncate near the end (the entropy data, IEND, the end blocks)
      s.resize(s.size() - std::min(s.size(), 1 + rng.below(rng.below(2) ? 16 : 1100)));
      break;
    case 4: {  // duplicate a range
      if (s.empty()) break;
      range(rng.below(4) ? 64 : 1024, &at, &len);
      const std::string piece = s.substr(at, len);
      s.insert(rng.below(s.size() + 1), piece);
      break;
    }
    case 5: {  // splice a range of another seed in (inserted or overwriting)
      const std::string& other = pool[rng.below(pool.size())].bytes;
      if (other.empty()) break;
      const std::size_t from = rng.below(other.size());
      const std::string piece = other.substr(from, 1 + rng.below(512));
      const std::size_t to = rng.below(s.size() + 1);
      if (rng.below(2)) {
        s.insert(to, piece);
      } else {
        s.replace(to, piece.size(), piece);
      }
      break;
    }
    case 6:  // zero a range
      if (s.empty()) break;
      range(rng.below(4) ? 16 : 600, &at, &len);
      std::memset(&s[at], 0, len);
      break;
    case 7:
    case 8:
    case 9:  // a length field (format-aware)
      mutateLengthField(s, rng);
      break;
    case 10: {  // an interesting integer, 1, 2 or 4 bytes, either byte order
      if (s.size() < 4) break;
      const uint32_t v = rng.below(2) ? rng.pick(kInteresting32) : rng.pick(kInteresting16);
      const std::size_t width = std::size_t{1} << rng.below(3);
      at = rng.below(s.size() - width + 1);
      const bool big = rng.below(2);
      for (std::size_t k = 0; k < width; ++k)
        s[at + k] = static_cast<char>(v >> (8 * (big ? width - 1 - k : k)));
      break;
    }
    case 11:  // delete a range
      if (s.empty()) break;
      range(rng.below(4) ? 16 : 700, &at, &len);
      s.erase(at, len);
      break;
    case 12: {  // insert random bytes
      std::string piece(1 + rng.below(16), '\0');
      for (char& c : piece) c = static_cast<char>(rng.next());
      s.insert(rng.below(s.size() + 1), piece);
      break;
    }
    default:  // an extreme number in the text (headers, lists, octal fields)
      replaceNumber(s, rng);
  }
  if (s.size() > kMaxMutant) s.resize(kMaxMutant);
}

/// A mutant of `seed`: 1-3 mutations, then (half the time) the PNG CRCs and tar
/// checksums made right again so that the mutation reaches the code behind them.
std::string mutant(const Seed& seed, Rng& rng, const std::vector<Seed>& pool) {
  std::string s = seed.bytes;
  const int rounds = 1 + static_cast<int>(rng.below(3));
  for (int k = 0; k < rounds; ++k) mutate(s, rng, pool);
  if (rng.below(2)) {
    fixPngCrcs(s);
    fixTarChecksums(s);
  }
  return s;
}

/// An existing temp file (mkstemp), removed at the end of the scope.
class TempFile {
 public:
  TempFile() {
    std::string tmpl = "/tmp/batchdist_data_fuzz_XXXXXX";
    const int fd = ::mkstemp(tmpl.data());
    if (fd < 0) throw std::runtime_error("mkstemp failed");
    ::close(fd);
    path_ = tmpl;
  }
  ~TempFile() { ::unlink(path_.c_str()); }
  TempFile(const TempFile&) = delete;
  TempFile& operator=(const TempFile&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

/// Under the temp dir, named after the input and this process (Note [scratch dirs]:
/// two processes failing alike do not overwrite each other's), and kept.
void saveReproducer(const std::string& name, const std::string& bytes) {
  const auto p = fs::path(::testing::TempDir()) / (name + "." + std::to_string(::getpid()));
  std::ofstream(p, std::ios::binary) << bytes;
  std::cout << "[ data fuzz ] failing input saved to " << p << "\n";
}

double secondsSince(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

/// Scratch buffers are reused as the loader reuses them, but a mutant that claims
/// a huge image leaves them large: start afresh then (memory, not behaviour).
void trimScratch(DecodeScratch* scratch) {
  if (scratch->rgb.capacity() > (64u << 20) || scratch->row.capacity() > (64u << 20)) {
    *scratch = DecodeScratch();
  }
}

/// The modes (image_fuzz_check.h) every image mutant is tried in, besides its
/// last byte's: all four boxes, both plain output sizes and the extra ones.
uint8_t modeFor(std::size_t i, std::size_t k) {
  static const uint8_t kModes[] = {0x00, 0x05, 0x0A, 0x0F, 0x04, 0x19, 0x22, 0x33,
                                   0x42, 0x8D, 0xC4, 0x16, 0x2B, 0x3C, 0x81, 0x47};
  return kModes[(i * 3 + k * 7) % std::size(kModes)];
}

}  // namespace

TEST(DataFuzz, ImageSeedsDecodeInEveryMode) {
  const auto seeds = imageSeeds();
  ASSERT_GE(seeds.size(), 25u);
  DecodeScratch scratch;
  int decodes = 0;
  for (const auto& seed : seeds) {
    SCOPED_TRACE(seed.name);
    for (int mode = 0; mode < 256; ++mode) {
      bool ok = false;
      const auto problem = checkImage(bytes(seed.bytes), seed.bytes.size(),
                                      static_cast<uint8_t>(mode), &scratch, &ok);
      ASSERT_EQ(problem, "") << "mode " << mode;
      ASSERT_EQ(ok, !batchdist::fuzz::imageModeRefusesAlways(static_cast<uint8_t>(mode)))
          << "mode " << mode;
      ++decodes;
    }
  }
  std::cout << "[ data fuzz ] " << seeds.size() << " image seeds decoded in all 256 modes ("
            << decodes << " calls)\n";
}

TEST(DataFuzz, ArchiveSeedsAreRead) {
  const auto seeds = archiveSeeds();
  ASSERT_GE(seeds.size(), 15u);
  TempFile tmp;
  DecodeScratch scratch;
  for (const auto& seed : seeds) {
    SCOPED_TRACE(seed.name);
    ArchiveOutcome o;
    ASSERT_EQ(checkArchive(bytes(seed.bytes), seed.bytes.size(), tmp.path(), &o), "");
    const auto ext = fs::path(seed.name).extension().string();
    if (ext == ".tar") {
      EXPECT_TRUE(o.tar);
      EXPECT_FALSE(o.shard.samples.empty());
      // the images the generated shards carry are real
      if (seed.name.rfind("gen_", 0) == 0) {
        for (const auto& t : o.shard.samples) {
          bool ok = false;
          EXPECT_EQ(checkImage(bytes(seed.bytes) + t.image_offset,
                               static_cast<std::size_t>(t.image_size), 0x04, &scratch, &ok),
                    "");
          EXPECT_TRUE(ok) << t.image_member;
        }
      }
    }
    if (ext == ".npy") EXPECT_TRUE(o.npy);
    if (ext == ".cache") EXPECT_TRUE(o.image_list);
    if (ext == ".txt") EXPECT_TRUE(o.list_file);
  }
}

// Every prefix of every seed: a truncated image is refused or decodes; a
// truncated shard is refused or yields a prefix of the seed's samples; a
// truncated .npy is refused once any of its data is missing.
TEST(DataFuzz, TruncatedSeedsAreRefusedOrConsistent) {
  const auto t0 = std::chrono::steady_clock::now();
  DecodeScratch scratch;
  int64_t image_prefixes = 0, image_decoded = 0, failures = 0;
  std::vector<uint8_t> pixels, reference[2];
  for (const auto& seed : imageSeeds()) {
    const uint8_t modes[2] = {0x00, 0x8D};  // whole image to 7 x 7; a tall box to 61 x 13
    for (int k = 0; k < 2; ++k) {
      bool ok = false;
      ASSERT_EQ(checkImage(bytes(seed.bytes), seed.bytes.size(), modes[k], &scratch, &ok,
                           &reference[k]), "");
      ASSERT_TRUE(ok) << seed.name;
    }
    // The large generated seeds: every 5th length (their size is mostly entropy data).
    const std::size_t step = seed.bytes.size() > 8000 ? 5 : 1;
    for (std::size_t n = 0; n < seed.bytes.size() && failures < 5; n += step) {
      const int k = static_cast<int>(n % 2);
      bool ok = false;
      auto problem = checkImage(bytes(seed.bytes), n, modes[k], &scratch, &ok, &pixels);
      ++image_prefixes;
      image_decoded += ok;
      // A cut file decodes only when the rows the box needs were all there (a JPEG
      // decodes no further than the box: Note [decode less]; a PNG is inflated
      // whole, so only its 12-byte IEND chunk may go), and then to the very
      // pixels of the whole file: missing data must never become grey or zero
      // pixels (Note [libjpeg errors]: a bad file must be found, not trained on).
      if (problem.empty() && ok && pixels != reference[k]) {
        problem = "decoded to other pixels than the whole file";
      }
      if (problem.empty() && ok && isPng(seed.bytes) && seed.bytes.size() - n > 12) {
        problem = "a PNG decoded although " + std::to_string(seed.bytes.size() - n) +
                  " bytes were cut off";
      }
      if (!problem.empty()) {
        ++failures;
        saveReproducer("data_fuzz_truncated_" + seed.name, seed.bytes.substr(0, n));
        ADD_FAILURE() << seed.name << " cut to " << n << " bytes, mode " << int(modes[k]) << ": "
                      << problem;
      }
    }
  }
  TempFile tmp;
  int64_t archive_prefixes = 0, tar_accepted = 0, npy_accepted = 0;
  for (const auto& seed : archiveSeeds()) {
    ArchiveOutcome full;
    ASSERT_EQ(checkArchive(bytes(seed.bytes), seed.bytes.size(), tmp.path(), &full), "");
    std::size_t npy_end = 0;  // header + data of a non-empty array
    if (full.npy) {
      const auto a = batchdist::worker::parseNpy(bytes(seed.bytes), seed.bytes.size(), "seed",
                                                 {NpyType::kUint8, NpyType::kFloat16,
                                                  NpyType::kFloat32, NpyType::kInt32,
                                                  NpyType::kInt64});
      npy_end = static_cast<std::size_t>(a.data - bytes(seed.bytes)) +
                static_cast<std::size_t>(a.shape[0] * a.rowBytes());
    }
    for (std::size_t n = 0; n < seed.bytes.size() && failures < 5; ++n) {
      ArchiveOutcome o;
      auto problem = checkArchive(bytes(seed.bytes), n, tmp.path(), &o);
      ++archive_prefixes;
      tar_accepted += o.tar;
      npy_accepted += o.npy;
      if (problem.empty() && o.tar && full.tar) {
        const auto& got = o.shard.samples;
        const auto& all = full.shard.samples;
        if (got.size() > all.size()) problem = "a truncated shard has more samples";
        for (std::size_t i = 0; problem.empty() && i < got.size(); ++i) {
          if (got[i].key != all[i].key || got[i].image_offset != all[i].image_offset ||
              got[i].image_size != all[i].image_size || got[i].label != all[i].label) {
            problem = "sample " + std::to_string(i) + " of the truncated shard differs";
          }
        }
      }
      if (problem.empty() && o.npy && full.npy && n < npy_end) {
        problem = "a .npy cut inside its data was accepted";
      }
      if (!problem.empty()) {
        ++failures;
        saveReproducer("data_fuzz_truncated_" + seed.name, seed.bytes.substr(0, n));
        ADD_FAILURE() << seed.name << " cut to " << n << " bytes: " << problem;
      }
    }
  }
  std::cout << "[ data fuzz ] prefixes: " << image_prefixes << " images (" << image_decoded
            << " decoded to the whole file's pixels), " << archive_prefixes
            << " archives (" << tar_accepted << " indexed as tar, " << npy_accepted
            << " read as .npy) in " << secondsSince(t0) << " s\n";
}

TEST(DataFuzz, ImageMutationsDecodeOrThrowDecodeError) {
  const auto pool = imageSeeds();
  constexpr std::size_t kInputs = 8000;
  Rng rng(0x696d6167);  // fixed: the same inputs on every run
  DecodeScratch scratch;
  const auto t0 = std::chrono::steady_clock::now();
  int64_t calls = 0, decoded = 0, inputs_decoded = 0, rechecked = 0, failures = 0;
  double slowest = 0;
  std::size_t slowest_input = 0;
  std::vector<uint8_t> first, again;
  for (std::size_t i = 0; i < kInputs && failures < 5; ++i) {
    const Seed& seed = pool[i % pool.size()];
    const std::string input = mutant(seed, rng, pool);
    const uint8_t modes[] = {input.empty() ? uint8_t{0} : u8(input, input.size() - 1),
                             modeFor(i, 0), modeFor(i, 1)};
    bool any = false;
    for (std::size_t k = 0; k < std::size(modes) && failures < 5; ++k) {
      bool ok = false;
      const auto t = std::chrono::steady_clock::now();
      auto problem = checkImage(bytes(input), input.size(), modes[k], &scratch, &ok, &first);
      const double took = secondsSince(t);
      if (took > slowest) slowest = took, slowest_input = i;
      trimScratch(&scratch);
      ++calls;
      decoded += ok;
      any = any || ok;
      // Decoding is deterministic: a fresh scratch gives the same pixels (stale
      // scratch bytes or uninitialised reads would not).
      if (problem.empty() && ok && i % 4 == 0) {
        DecodeScratch fresh;
        bool ok2 = false;
        problem = checkImage(bytes(input), input.size(), modes[k], &fresh, &ok2, &again);
        ++rechecked;
        if (problem.empty() && (!ok2 || again != first)) {
          problem = "a second decode with a fresh scratch gave another result";
        }
      }
      if (!problem.empty()) {
        ++failures;
        saveReproducer("data_fuzz_image_" + std::to_string(i), input);
        ADD_FAILURE() << "input " << i << " (from " << seed.name << ", " << input.size()
                      << " bytes), mode 0x" << std::hex << int(modes[k]) << std::dec << ": "
                      << problem;
      }
    }
    inputs_decoded += any;
  }
  const double seconds = secondsSince(t0);
  // Bounded time: a hostile header must be refused, not make the decoder crawl.
  EXPECT_LT(slowest, 5.0) << "input " << slowest_input;
  // The mutations must not all be refused at the first byte.
  EXPECT_GT(inputs_decoded, static_cast<int64_t>(kInputs / 20));
  std::cout << "[ data fuzz ] images: " << kInputs << " mutants of " << pool.size() << " seeds, "
            << calls << " decodeCropResize calls: " << decoded << " decoded, " << calls - decoded
            << " refused with DecodeError (" << inputs_decoded
            << " mutants decoded in some mode; " << rechecked
            << " decodes repeated with a fresh scratch) in " << seconds << " s (slowest "
            << slowest << " s)\n";
}

TEST(DataFuzz, ArchiveMutationsReturnOrThrowConfigError) {
  const auto pool = archiveSeeds();
  constexpr std::size_t kInputs = 12000;
  Rng rng(0x61726368);  // fixed
  TempFile tmp;
  DecodeScratch scratch;
  const auto t0 = std::chrono::steady_clock::now();
  int64_t tar = 0, npy = 0, list = 0, list_file = 0, samples = 0, images = 0, images_decoded = 0,
          failures = 0;
  double slowest = 0;
  std::size_t slowest_input = 0;
  for (std::size_t i = 0; i < kInputs && failures < 5; ++i) {
    const Seed& seed = pool[i % pool.size()];
    const std::string input = mutant(seed, rng, pool);
    ArchiveOutcome o;
    const auto t = std::chrono::steady_clock::now();
    auto problem = checkArchive(bytes(input), input.size(), tmp.path(), &o);
    tar += o.tar, npy += o.npy, list += o.image_list, list_file += o.list_file;
    // What the loader then does with an indexed shard: decode its images' ranges.
    if (problem.empty() && o.tar) {
      samples += static_cast<int64_t>(o.shard.samples.size());
      for (std::size_t k = 0; k < std::min<std::size_t>(o.shard.samples.size(), 4); ++k) {
        const auto& s = o.shard.samples[k];
        bool ok = false;
        problem = checkImage(bytes(input) + s.image_offset, static_cast<std::size_t>(s.image_size),
                             modeFor(i, k), &scratch, &ok);
        trimScratch(&scratch);
        ++images;
        images_decoded += ok;
        if (!problem.empty()) {
          problem = "the image of sample '" + s.key + "': " + problem;
          break;
        }
      }
    }
    const double took = secondsSince(t);
    if (took > slowest) slowest = took, slowest_input = i;
    if (!problem.empty()) {
      ++failures;
      saveReproducer("data_fuzz_archive_" + std::to_string(i), input);
      ADD_FAILURE() << "input " << i << " (from " << seed.name << ", " << input.size()
                    << " bytes): " << problem;
    }
  }
  const double seconds = secondsSince(t0);
  EXPECT_LT(slowest, 5.0) << "input " << slowest_input;
  // Each reader must still accept some mutants (the mutations are not all fatal).
  EXPECT_GT(tar, static_cast<int64_t>(kInputs / 100));
  EXPECT_GT(npy, static_cast<int64_t>(kInputs / 100));
  EXPECT_GT(list, static_cast<int64_t>(kInputs / 200));
  EXPECT_GT(list_file, static_cast<int64_t>(kInputs / 200));
  std::cout << "[ data fuzz ] archives: " << kInputs << " mutants of " << pool.size()
            << " seeds, each through indexTar, parseNpy/mapNpy, parseImageList, readImageList: "
            << "accepted " << tar << " as tar (" << samples << " samples; " << images_decoded
            << " of " << images << " images decoded), " << npy << " as .npy, " << list
            << " as image-list caches, " << list_file << " as list files; the rest refused "
               "with ConfigError, in "
            << seconds << " s (slowest " << slowest << " s)\n";
}
