// The file readers of the input pipeline: tar index (WebDataset shards), .npy
// mapping, ImageFolder walk / list files / cache text.
#include <fcntl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <initializer_list>

#include "common/error.h"
#include "tests/fifo_watch.h"
#include "tests/image_fixtures.h"
#include "worker/common/files.h"
#include "worker/data/labels.h"
#include "worker/data/sources/image_folder.h"
#include "worker/data/sources/npy.h"
#include "worker/data/sources/tar_index.h"
#include "worker/data/sources/tokens.h"

namespace fs = std::filesystem;
using batchdist::ConfigError;
using batchdist::testing::makeNpy;
using batchdist::testing::makeTar;
using batchdist::testsupport::expectNoWaitOn;
using namespace batchdist::worker;

namespace {

class TempDir {
 public:
  TempDir() {
    std::string tmpl = (fs::temp_directory_path() / "batchdist_sources_XXXXXX").string();
    if (::mkdtemp(tmpl.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
    path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  std::string operator/(const std::string& rel) const { return path_ + "/" + rel; }
  const std::string& str() const { return path_; }

 private:
  std::string path_;
};

void writeBytes(const std::string& path, const std::string& bytes) {
  fs::create_directories(fs::path(path).parent_path());
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good()) << path;
}

std::string readAt(const std::string& path, int64_t offset, int64_t size) {
  std::ifstream in(path, std::ios::binary);
  in.seekg(offset);
  std::string out(static_cast<size_t>(size), '\0');
  in.read(out.data(), size);
  return in.gcount() == size ? out : std::string("<short read>");
}

/// Runs fn, expects a ConfigError whose message has every one of `parts`.
void expectError(const std::function<void()>& fn, std::initializer_list<std::string> parts) {
  try {
    fn();
  } catch (const ConfigError& e) {
    const std::string msg = e.what();
    for (const auto& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << "'" << p << "' not in: " << msg;
    return;
  }
  ADD_FAILURE() << "no ConfigError";
}

// ---- hand-made tar records, for what makeTar does not write ----------------

void setChecksum(std::string* h, bool signed_sum = false) {
  std::memset(&(*h)[148], ' ', 8);
  long sum = 0;
  for (char c : *h) sum += signed_sum ? static_cast<signed char>(c) : static_cast<unsigned char>(c);
  std::snprintf(&(*h)[148], 8, "%06lo", static_cast<unsigned long>(sum));
  (*h)[155] = ' ';
}

std::string rawHeader(const std::string& name, uint64_t size, char type,
                      const std::string& prefix = "") {
  std::string h(512, '\0');
  std::memcpy(h.data(), name.data(), std::min<size_t>(name.size(), 100));
  std::snprintf(&h[100], 8, "%07o", 0644);
  std::snprintf(&h[124], 12, "%011llo", static_cast<unsigned long long>(size));
  h[156] = type;
  std::memcpy(&h[257], "ustar", 6);
  h[263] = '0';
  h[264] = '0';
  std::memcpy(&h[345], prefix.data(), std::min<size_t>(prefix.size(), 155));
  setChecksum(&h);
  return h;
}

std::string padded(std::string data) {
  data.append((512 - data.size() % 512) % 512, '\0');
  return data;
}

std::string member(const std::string& name, const std::string& data, char type = '0',
                   const std::string& prefix = "") {
  return rawHeader(name, data.size(), type, prefix) + padded(data);
}

std::string paxRecord(const std::string& key, const std::string& value) {
  const std::string body = " " + key + "=" + value + "\n";
  size_t len = body.size() + 1;
  while (std::to_string(len).size() + body.size() != len) ++len;
  return std::to_string(len) + body;
}

const std::string kEnd(1024, '\0');

// ---- tar index ---------------------------------------------------------------

TEST(TarIndex, SamplesOffsetsAndLabels) {
  TempDir dir;
  const std::string tar = dir / "s.tar";
  const std::string img_a(1000, 'A'), img_b = "PNGDATA", img_c(512, 'C');
  writeBytes(tar, makeTar({{"sample000000.jpg", img_a},
                           {"sample000000.cls", "0"},
                           {"sample000001.cls", " 3\n"},  // label first, whitespace
                           {"sample000001.png", img_b},
                           {"sample000002.JPEG", img_c},
                           {"sample000002.cls", "12"},
                           {"sample000002.json", "{\"a\": 1}"}}));
  const TarShard s = indexTar(tar);
  EXPECT_EQ(s.path, tar);
  ASSERT_EQ(s.samples.size(), 3u);
  EXPECT_EQ(s.skipped_members, 1);
  const std::string imgs[] = {img_a, img_b, img_c};
  const int64_t labels[] = {0, 3, 12};
  const char* members[] = {"sample000000.jpg", "sample000001.png", "sample000002.JPEG"};
  for (int i = 0; i < 3; ++i) {
    const TarSample& t = s.samples[i];
    EXPECT_EQ(t.key, "sample00000" + std::to_string(i));
    EXPECT_EQ(t.label, labels[i]);
    EXPECT_EQ(t.image_member, members[i]);
    EXPECT_EQ(t.image_size, static_cast<int64_t>(imgs[i].size()));
    EXPECT_EQ(t.image_offset % 512, 0);
    EXPECT_EQ(readAt(tar, t.image_offset, t.image_size), imgs[i]) << i;
  }
  EXPECT_EQ(s.samples[0].image_offset, 512);
}

TEST(TarIndex, KeysAreUpToTheFirstDotOfTheBaseName) {
  TempDir dir;
  const std::string tar = dir / "s.tar";
  writeBytes(tar, makeTar({{"d.x/abc.seg.jpg", "mask"},  // ext "seg.jpg": not an image
                           {"d.x/abc.jpg", "img"},
                           {"d.x/abc.cls", "1"},
                           {"README", "no dot: no key"},
                           {"d.x/def.jpg", "img2"},
                           {"d.x/def.cls", "2"}}));
  const TarShard s = indexTar(tar);
  ASSERT_EQ(s.samples.size(), 2u);
  EXPECT_EQ(s.samples[0].key, "d.x/abc");
  EXPECT_EQ(readAt(tar, s.samples[0].image_offset, s.samples[0].image_size), "img");
  EXPECT_EQ(s.samples[1].key, "d.x/def");
  EXPECT_EQ(s.skipped_members, 2);
}

TEST(TarIndex, GnuLongNames) {
  TempDir dir;
  const std::string tar = dir / "s.tar";
  const std::string key = std::string(150, 'k') + "/" + std::string(120, 'n');
  writeBytes(tar, makeTar({{key + ".jpg", "longimage"}, {key + ".cls", "7"}, {"short.jpg", "s"},
                           {"short.cls", "1"}}));
  const TarShard s = indexTar(tar);
  ASSERT_EQ(s.samples.size(), 2u);
  EXPECT_EQ(s.samples[0].key, key);
  EXPECT_EQ(s.samples[0].image_member, key + ".jpg");
  EXPECT_EQ(s.samples[0].label, 7);
  EXPECT_EQ(readAt(tar, s.samples[0].image_offset, s.samples[0].image_size), "longimage");
  EXPECT_EQ(s.samples[1].key, "short");  // the long name applied to one member only
}

TEST(TarIndex, PaxPathAndSizeUstarPrefixGlobalHeadersAndDirectories) {
  TempDir dir;
  const std::string tar = dir / "s.tar";
  const std::string long_key = std::string(200, 'p') + "/img";
  const std::string pax = paxRecord("path", long_key + ".jpg") + paxRecord("mtime", "1.5") +
                          paxRecord("size", "9");
  std::string bytes = member("pax_global_header", paxRecord("comment", "x"), 'g') +
                      member("dir/", "", '5') + member("PaxHeaders/img.jpg", pax, 'x') +
                      // the header's own size field is 0; the pax size (9) wins
                      rawHeader("truncated-name.jpg", 0, '0') + padded("paxsized!") +
                      member("img.cls", "4", '0', "some/prefix") +  // key some/prefix/img: new sample
                      member("img.jpg", "prefixed", '0', "some/prefix") +
                      member(long_key + "X.cls", "5");  // too long for name: cut to 100 bytes
  bytes += kEnd;
  writeBytes(tar, bytes);
  // The first sample (the pax path) has no cls: the cut name above is not its key.
  expectError([&] { indexTar(tar); }, {tar, "no .cls member", long_key});

  std::string ok = member("PaxHeaders/img.jpg", pax, 'x') + rawHeader("cut.jpg", 0, '0') +
                   padded("paxsized!") + member("PaxHeaders/img.cls", paxRecord("path", long_key + ".cls"), 'x') +
                   member("cut.cls", "5") + member("img.cls", "4", '0', "some/prefix") +
                   member("img.jpg", "prefixed", '0', "some/prefix") + kEnd;
  writeBytes(tar, ok);
  const TarShard s = indexTar(tar);
  ASSERT_EQ(s.samples.size(), 2u);
  EXPECT_EQ(s.samples[0].key, long_key);
  EXPECT_EQ(s.samples[0].label, 5);
  EXPECT_EQ(s.samples[0].image_size, 9);
  EXPECT_EQ(readAt(tar, s.samples[0].image_offset, 9), "paxsized!");
  EXPECT_EQ(s.samples[1].key, "some/prefix/img");
  EXPECT_EQ(s.samples[1].image_member, "some/prefix/img.jpg");
  EXPECT_EQ(readAt(tar, s.samples[1].image_offset, s.samples[1].image_size), "prefixed");
  EXPECT_EQ(s.skipped_members, 0);
}

TEST(TarIndex, EndBlocksOptionalSignedChecksumAndBase256Size) {
  TempDir dir;
  const std::string tar = dir / "s.tar";
  std::string h = rawHeader("caf\xc3\xa9.jpg", 3, '0');  // bytes >= 0x80 in the name
  setChecksum(&h, /*signed_sum=*/true);
  std::string cls = rawHeader("caf\xc3\xa9.cls", 0, '0');
  // GNU base-256 size: 0x80 then big-endian bytes.
  std::memset(&cls[124], 0, 12);
  cls[124] = '\x80';
  cls[135] = 1;
  setChecksum(&cls);
  writeBytes(tar, h + padded("abc") + cls + padded("9"));  // no end-of-archive blocks
  const TarShard s = indexTar(tar);
  ASSERT_EQ(s.samples.size(), 1u);
  EXPECT_EQ(s.samples[0].key, "caf\xc3\xa9");
  EXPECT_EQ(s.samples[0].label, 9);
  // The last member without its padding is complete too.
  writeBytes(tar, h + padded("abc") + cls + "9");
  EXPECT_EQ(indexTar(tar).samples.size(), 1u);
}

TEST(TarIndex, TruncatedArchive) {
  TempDir dir;
  const std::string tar = dir / "s.tar";
  const std::string full = makeTar({{"a.jpg", std::string(3000, 'x')}, {"a.cls", "1"}});
  writeBytes(tar, full.substr(0, 512 + 2000));
  expectError([&] { indexTar(tar); }, {tar, "truncated archive", "a.jpg", "offset 0", "3000"});
  writeBytes(tar, full.substr(0, 512 + 3072 + 100));  // a partial header
  expectError([&] { indexTar(tar); }, {tar, "truncated archive", "offset 3584"});
  // A size far past the end is "truncated", not a huge allocation or a long loop.
  std::string huge = rawHeader("b.jpg", 0, '0');
  std::snprintf(&huge[124], 12, "%011llo", 077777777777ULL);
  setChecksum(&huge);
  writeBytes(tar, huge + kEnd);
  expectError([&] { indexTar(tar); }, {tar, "truncated archive", "b.jpg"});
}

TEST(TarIndex, SampleWithoutLabelOrImage) {
  TempDir dir;
  const std::string tar = dir / "s.tar";
  writeBytes(tar, makeTar({{"a.jpg", "x"}, {"a.cls", "1"}, {"b.jpg", "y"}, {"c.jpg", "z"}, {"c.cls", "0"}}));
  expectError([&] { indexTar(tar); }, {tar, "'b'", "no .cls"});
  writeBytes(tar, makeTar({{"a.jpg", "x"}, {"a.cls", "1"}, {"b.cls", "1"}, {"b.txt", "t"}}));
  expectError([&] { indexTar(tar); }, {tar, "'b'", "no image"});
  // Non-adjacent members of one key are two samples (WebDataset): each lacks a part.
  writeBytes(tar, makeTar({{"a.jpg", "x"}, {"b.jpg", "y"}, {"b.cls", "1"}, {"a.cls", "1"}}));
  expectError([&] { indexTar(tar); }, {tar, "'a'", "no .cls"});
  // A key with only extra members is no sample (and not an error).
  writeBytes(tar, makeTar({{"meta.json", "{}"}, {"a.jpg", "x"}, {"a.cls", "1"}}));
  const TarShard s = indexTar(tar);
  EXPECT_EQ(s.samples.size(), 1u);
  EXPECT_EQ(s.skipped_members, 1);
}

TEST(TarIndex, LabelErrors) {
  TempDir dir;
  const std::string tar = dir / "s.tar";
  writeBytes(tar, makeTar({{"a.jpg", "x"}, {"a.cls", "1"}, {"b.jpg", "y"}, {"b.cls", "dog"}}));
  expectError([&] { indexTar(tar); }, {tar, "b.cls", "offset 3072", "not an integer", "'dog'"});
  writeBytes(tar, makeTar({{"b.jpg", "y"}, {"b.cls", "-2"}}));
  expectError([&] { indexTar(tar); }, {tar, "b.cls", "negative label -2"});
  writeBytes(tar, makeTar({{"b.jpg", "y"}, {"b.cls", ""}}));
  expectError([&] { indexTar(tar); }, {"b.cls", "not an integer"});
  writeBytes(tar, makeTar({{"b.jpg", "y"}, {"b.cls", std::string(100, '1')}}));
  expectError([&] { indexTar(tar); }, {"b.cls", "not an integer", "100 bytes"});
  writeBytes(tar, makeTar({{"b.jpg", "y"}, {"b.cls", "99999999999999999999"}}));
  expectError([&] { indexTar(tar); }, {"b.cls", "not an integer"});
}

TEST(TarIndex, RepeatedExtensionAndTwoImages) {
  TempDir dir;
  const std::string tar = dir / "s.tar";
  writeBytes(tar, makeTar({{"a.jpg", "x"}, {"a.cls", "1"}, {"a.CLS", "2"}}));
  expectError([&] { indexTar(tar); }, {tar, "a.CLS", "offset 2048", "repeats the extension"});
  writeBytes(tar, makeTar({{"a.jpg", "x"}, {"a.png", "y"}, {"a.cls", "1"}}));
  expectError([&] { indexTar(tar); }, {tar, "a.png", "second image"});
}

TEST(TarIndex, BadChecksumAndCorruptFields) {
  TempDir dir;
  const std::string tar = dir / "s.tar";
  std::string bytes = makeTar({{"a.jpg", "x"}, {"a.cls", "1"}});
  bytes[1024 + 1] ^= 0x20;  // a byte of the second header
  writeBytes(tar, bytes);
  expectError([&] { indexTar(tar); }, {tar, "bad header checksum", "offset 1024"});
  writeBytes(tar, std::string(2048, 'z'));  // not a tar
  expectError([&] { indexTar(tar); }, {tar, "bad header checksum", "offset 0"});
  std::string h = rawHeader("a.jpg", 0, '0');
  std::memcpy(&h[124], "00000000x00", 11);
  setChecksum(&h);
  writeBytes(tar, h + kEnd);
  expectError([&] { indexTar(tar); }, {tar, "a.jpg", "size field"});
  // A long-name record bigger than any name is refused before it is read.
  writeBytes(tar, rawHeader("././@LongLink", 1 << 20, 'L') + std::string(1 << 20, 'n') + kEnd);
  expectError([&] { indexTar(tar); }, {tar, "long-name", "corrupt"});
  writeBytes(tar, member("p", "12 path=x\n", 'x') + kEnd);  // record length 12 != 11
  expectError([&] { indexTar(tar); }, {tar, "malformed pax"});
  expectError([&] { indexTar(dir / "missing.tar"); }, {dir / "missing.tar", "cannot open"});
  expectError([&] { indexTar(dir.str()); }, {"not a regular file"});
}

TEST(TarIndex, EmptyArchiveHasNoSamples) {
  TempDir dir;
  writeBytes(dir / "e.tar", kEnd);
  EXPECT_TRUE(indexTar(dir / "e.tar").samples.empty());
  writeBytes(dir / "z.tar", "");
  EXPECT_TRUE(indexTar(dir / "z.tar").samples.empty());
}

TEST(ExpandShards, RangesListsDirectoriesAndMissingFiles) {
  TempDir dir;
  for (const char* n : {"train-000000.tar", "train-000001.tar", "train-000002.tar", "val-000000.tar",
                        "x-a-0.tar", "x-a-1.tar", "x-b-0.tar", "x-b-1.tar", "notes.txt"}) {
    writeBytes(dir / n, kEnd);
  }
  EXPECT_EQ(expandShards(dir / "train-{000000..000002}.tar"),
            (std::vector<std::string>{dir / "train-000000.tar", dir / "train-000001.tar",
                                      dir / "train-000002.tar"}));
  EXPECT_EQ(expandShards(dir / "{train,val}-000000.tar"),
            (std::vector<std::string>{dir / "train-000000.tar", dir / "val-000000.tar"}));
  EXPECT_EQ(expandShards(dir / "x-{a,b}-{0..1}.tar"),
            (std::vector<std::string>{dir / "x-a-0.tar", dir / "x-a-1.tar", dir / "x-b-0.tar",
                                      dir / "x-b-1.tar"}));
  EXPECT_EQ(expandShards(dir / "val-000000.tar"), std::vector<std::string>{dir / "val-000000.tar"});
  const auto all = expandShards(dir.str());
  ASSERT_EQ(all.size(), 8u);
  EXPECT_EQ(all.front(), dir / "train-000000.tar");
  EXPECT_EQ(all.back(), dir / "x-b-1.tar");
  EXPECT_TRUE(std::is_sorted(all.begin(), all.end()));

  expectError([&] { expandShards(dir / "train-{000000..000003}.tar"); },
              {dir / "train-000003.tar", "does not exist"});
  expectError([&] { expandShards(dir / "train-{000000..000009}.tar"); },
              {dir / "train-000003.tar", "7 of the 10"});
  expectError([&] { expandShards(dir / "nope.tar"); }, {dir / "nope.tar", "does not exist"});
  expectError([&] { expandShards(dir / "train-{000000..000002.tar"); }, {"malformed", "'{' without '}'"});
  expectError([&] { expandShards(dir / "train-{2..0}.tar"); }, {"malformed", "goes down"});
  expectError([&] { expandShards(dir / "train-{a..b}.tar"); }, {"malformed"});
  expectError([&] { expandShards(dir / "t-{0..99999999}.tar"); }, {"malformed", "too long"});
  expectError([&] { expandShards(dir / "t-{a}.tar"); }, {"malformed"});
  TempDir empty;
  expectError([&] { expandShards(empty.str()); }, {empty.str(), "no .tar files"});
}

// ---- npy ---------------------------------------------------------------------

const std::vector<NpyType> kAll = {NpyType::kUint8, NpyType::kFloat16, NpyType::kFloat32,
                                   NpyType::kInt32, NpyType::kInt64};

template <typename T>
std::string bytesOf(const std::vector<T>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
}

TEST(Npy, EveryDtypeMapsWithShapeAndData) {
  TempDir dir;
  struct Case {
    NpyType type;
    std::vector<int64_t> shape;
    std::string data;
    int64_t item;
  };
  const std::vector<Case> cases = {
      {NpyType::kUint8, {4, 3, 2, 2}, bytesOf(std::vector<uint8_t>(48, 7)), 1},
      {NpyType::kFloat16, {5, 3}, bytesOf(std::vector<uint16_t>{0x3c00, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14}), 2},
      {NpyType::kFloat32, {3, 2}, bytesOf(std::vector<float>{1.5f, -2, 3, 4, 5, 6}), 4},
      {NpyType::kInt32, {4}, bytesOf(std::vector<int32_t>{0, 1, 2, 3}), 4},
      {NpyType::kInt64, {3}, bytesOf(std::vector<int64_t>{9, 8, 1LL << 40}), 8},
  };
  for (const auto& c : cases) {
    const std::string path = dir / (std::string(toString(c.type)) + ".npy");
    const std::string file = makeNpy(c.type, c.shape, c.data);
    writeBytes(path, file);
    const NpyArray a = mapNpy(path, kAll);
    EXPECT_EQ(a.path, path);
    EXPECT_EQ(a.type, c.type);
    EXPECT_EQ(a.shape, c.shape);
    EXPECT_EQ(a.itemBytes(), c.item);
    EXPECT_EQ(a.rowBytes(), static_cast<int64_t>(c.data.size()) / c.shape[0]);
    ASSERT_NE(a.mapping, nullptr);
    EXPECT_EQ(std::string(reinterpret_cast<const char*>(a.data), c.data.size()), c.data) << toString(c.type);
    EXPECT_EQ((a.data - static_cast<const uint8_t*>(a.mapping.get())) % 64, 0);
    // In memory: data inside the buffer, no mapping.
    const NpyArray b = parseNpy(reinterpret_cast<const uint8_t*>(file.data()), file.size(), "mem", kAll);
    EXPECT_EQ(b.mapping, nullptr);
    EXPECT_EQ(b.data, reinterpret_cast<const uint8_t*>(file.data()) + (file.size() - c.data.size()));
    EXPECT_EQ(b.shape, c.shape);
  }
}

std::string npyWithHeader(const std::string& dict, int major = 1, const std::string& data = "") {
  std::string out = "\x93NUMPY";
  out += static_cast<char>(major);
  out += '\0';
  const size_t n = dict.size();
  out += static_cast<char>(n & 0xff);
  out += static_cast<char>((n >> 8) & 0xff);
  if (major >= 2) {
    out += static_cast<char>((n >> 16) & 0xff);
    out += static_cast<char>((n >> 24) & 0xff);
  }
  return out + dict + data;
}

NpyArray parseText(const std::string& file, const std::vector<NpyType>& allowed = kAll) {
  return parseNpy(reinterpret_cast<const uint8_t*>(file.data()), file.size(), "t.npy", allowed);
}

TEST(Npy, HeaderVariants) {
  // Version 2.0, keys in another order, double quotes, odd whitespace, no trailing comma.
  const std::string data(2 * 3 * 4, '\1');
  NpyArray a = parseText(npyWithHeader("{ \"shape\" :(2 ,3,) ,'fortran_order':False,\n'descr':'<f4'}\n", 2, data));
  EXPECT_EQ(a.type, NpyType::kFloat32);
  EXPECT_EQ(a.shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(a.rowBytes(), 12);
  a = parseText(npyWithHeader("{'descr': '<u1', 'fortran_order': False, 'shape': (5,)}", 3, "abcde"));
  EXPECT_EQ(a.type, NpyType::kUint8);
  EXPECT_EQ(a.shape, std::vector<int64_t>{5});
  a = parseText(npyWithHeader("{'descr': '=i8', 'fortran_order': False, 'shape': (1L, 1)}", 1, std::string(8, '\0')));
  EXPECT_EQ(a.type, NpyType::kInt64);
  // A zero-length dimension needs no data.
  a = parseText(npyWithHeader("{'descr': '<f2', 'fortran_order': False, 'shape': (0, 100000000000)}"));
  EXPECT_EQ(a.shape[0], 0);
  // Extra bytes after the data are fine.
  const std::string extra = npyWithHeader("{'descr': '|u1', 'fortran_order': False, 'shape': (2,)}", 1, "abcdef");
  a = parseText(extra);  // `a.data` points into `extra`
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(a.data), 2), "ab");
}

TEST(Npy, Errors) {
  TempDir dir;
  const std::string ok_data(16, '\0');
  auto with = [&](const std::string& descr, const std::string& rest = "'fortran_order': False, 'shape': (4,)") {
    return npyWithHeader("{'descr': '" + descr + "', " + rest + "}", 1, ok_data);
  };
  expectError([&] { parseText("\x93NUMPZ\x01\x00"); }, {"t.npy", "not a .npy file", "magic"});
  expectError([&] { parseText(std::string("PK\x03\x04", 4) + std::string(100, '\0')); }, {"t.npy", "not a .npy file"});
  expectError([&] { parseText(npyWithHeader("{}", 4)); }, {"t.npy", "version 4.0"});
  expectError([&] { parseText(with("<c8")); }, {"t.npy", "unsupported dtype '<c8'", "float32"});
  expectError([&] { parseText(with("|b1")); }, {"unsupported dtype '|b1'"});
  expectError([&] { parseText(with("|f4")); }, {"unsupported dtype '|f4'"});
  expectError([&] { parseText(with(">f4")); }, {"t.npy", "big-endian", "astype('<f4')"});
  expectError([&] { parseText(with("<i8"), {NpyType::kInt32}); }, {"int64", "not accepted", "int32"});
  expectError([&] { parseText(with("<f4", "'fortran_order': True, 'shape': (2, 2)")); },
              {"t.npy", "fortran_order", "np.ascontiguousarray"});
  expectError([&] { parseText(with("<f4", "'fortran_order': False, 'shape': (5,)")); },
              {"t.npy", "shorter than the shape", "(5,)", "16 bytes"});
  expectError([&] { parseText(with("<f4", "'fortran_order': False, 'shape': (4294967296, 4294967296, 4294967296)")); },
              {"t.npy", "shorter than the shape"});
  expectError([&] { parseText(with("<f4", "'fortran_order': False, 'shape': ()")); }, {"t.npy", "scalar"});
  // Malformed headers.
  for (const std::string& bad :
       {std::string("{'descr': '<f4' 'fortran_order': False, 'shape': (4,)}"),
        std::string("{'descr': '<f4', 'fortran_order': False}"),
        std::string("{'descr': '<f4', 'fortran_order': False, 'shape': (4,), 'extra': 1}"),
        std::string("{'descr': '<f4', 'fortran_order': Maybe, 'shape': (4,)}"),
        std::string("{'descr': '<f4', 'fortran_order': False, 'shape': (-4,)}"),
        std::string("{'descr': '<f4', 'fortran_order': False, 'shape': (4,), 'shape': (4,)}"),
        std::string("{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (4,)}"),
        std::string("{'descr': '<f4, 'fortran_order': False, 'shape': (4,)}"),
        std::string("{'descr': '<f4', 'fortran_order': False, 'shape': (4,)} x"),
        std::string("{'descr': '<f4', 'fortran_order': False, 'shape': (4"),
        std::string("")}) {
    expectError([&] { parseText(npyWithHeader(bad, 1, ok_data)); }, {"t.npy", "malformed .npy header"});
  }
  // Header length past the end of the file.
  std::string cut = with("<f4");
  expectError([&] { parseText(cut.substr(0, 30)); }, {"t.npy", "truncated"});
  // mapNpy: missing, empty.
  expectError([&] { mapNpy(dir / "none.npy", kAll); }, {dir / "none.npy", "cannot open"});
  writeBytes(dir / "empty.npy", "");
  expectError([&] { mapNpy(dir / "empty.npy", kAll); }, {dir / "empty.npy", "empty"});
  writeBytes(dir / "short.npy", makeNpy(NpyType::kFloat32, {10, 10}, std::string(399, '\0')));
  expectError([&] { mapNpy(dir / "short.npy", kAll); }, {dir / "short.npy", "shorter than the shape", "(10, 10)"});
}

// ---- image folder ------------------------------------------------------------

void touchDir(const std::string& path, int64_t sec) {
  struct timespec ts[2];
  ts[0].tv_sec = ts[1].tv_sec = sec;
  ts[0].tv_nsec = ts[1].tv_nsec = 123;
  ASSERT_EQ(::utimensat(AT_FDCWD, path.c_str(), ts, 0), 0) << path;
}

/// ROOT/train/{a_cat,b_dog,c_fish} and ROOT/val likewise.
void makeFolder(const TempDir& dir) {
  for (const char* f : {"train/b_dog/2.jpg", "train/b_dog/10.JPG", "train/b_dog/sub/deep/0.png",
                        "train/b_dog/sub/1.jpeg", "train/b_dog/a.png", "train/a_cat/x.jpg",
                        "train/c_fish/y.PNG", "val/a_cat/v.jpg", "val/b_dog/w.jpg", "val/c_fish/z.png"}) {
    writeBytes(dir / f, "img");
  }
  writeBytes(dir / "train/b_dog/README.txt", "not an image");
  writeBytes(dir / "train/b_dog/.hidden.jpg", "AppleDouble");
  writeBytes(dir / "train/notes.txt", "beside the classes");
}

TEST(ImageFolder, WalkSortsClassesAndFiles) {
  TempDir dir;
  makeFolder(dir);
  const ImageList list = walkImageFolder(dir.str() + "/");
  EXPECT_EQ(list.classes, (std::vector<std::string>{"a_cat", "b_dog", "c_fish"}));
  ASSERT_TRUE(list.has_val);
  std::vector<std::pair<std::string, int64_t>> train;
  for (const auto& e : list.train) train.emplace_back(e.path, e.label);
  EXPECT_EQ(train, (std::vector<std::pair<std::string, int64_t>>{
                       {"train/a_cat/x.jpg", 0},
                       {"train/b_dog/10.JPG", 1},
                       {"train/b_dog/2.jpg", 1},
                       {"train/b_dog/a.png", 1},
                       {"train/b_dog/sub/1.jpeg", 1},
                       {"train/b_dog/sub/deep/0.png", 1},
                       {"train/c_fish/y.PNG", 2}}));
  ASSERT_EQ(list.val.size(), 3u);
  EXPECT_EQ(list.val[2].path, "val/c_fish/z.png");
  EXPECT_EQ(list.val[2].label, 2);
  EXPECT_EQ(list.skipped, 3);  // README.txt, .hidden.jpg, train/notes.txt
  std::vector<std::string> dirs;
  for (const auto& d : list.dirs) dirs.push_back(d.first);
  for (const char* d : {".", "train", "val", "train/a_cat", "train/b_dog", "train/b_dog/sub",
                        "train/b_dog/sub/deep", "train/c_fish", "val/c_fish"}) {
    EXPECT_NE(std::find(dirs.begin(), dirs.end(), d), dirs.end()) << d;
  }
  EXPECT_EQ(dirs.size(), 11u);
}

TEST(ImageFolder, NoValAndSymlinkLoops) {
  TempDir dir;
  writeBytes(dir / "train/c0/a.jpg", "i");
  writeBytes(dir / "elsewhere/b.jpg", "i");
  fs::create_directory_symlink(dir / "train/c0", dir / "train/c0/loop");
  fs::create_directory_symlink(dir / "elsewhere", dir / "train/c0/linked");
  const ImageList list = walkImageFolder(dir.str());
  EXPECT_FALSE(list.has_val);
  EXPECT_TRUE(list.val.empty());
  ASSERT_EQ(list.train.size(), 2u);
  EXPECT_EQ(list.train[0].path, "train/c0/a.jpg");
  EXPECT_EQ(list.train[1].path, "train/c0/linked/b.jpg");
}

std::vector<std::pair<std::string, int64_t>> pathsAndLabels(const std::vector<ImageEntry>& entries) {
  std::vector<std::pair<std::string, int64_t>> out;
  for (const auto& e : entries) out.emplace_back(e.path, e.label);
  return out;
}

// Note [each file once]: links to ".", the parent, the split, ROOT, "/", a sibling
// class and the other split add nothing; a folder outside reached by two links, and
// a file reached by a link and in place, count once.
TEST(ImageFolder, SymlinkedFoldersCountEachFileOnce) {
  TempDir dir;
  for (const char* f : {"train/a/1.jpg", "train/a/sub/2.jpg", "train/b/3.jpg", "val/a/v.jpg",
                        "val/b/w.jpg", "outside/o.jpg", "outside/deep/p.jpg", "lone.jpg"}) {
    writeBytes(dir / f, "img");
  }
  fs::create_directory_symlink(".", dir / "train/a/self");
  fs::create_directory_symlink("..", dir / "train/a/sub/up");      // train/a
  fs::create_directory_symlink("../..", dir / "train/a/split");    // train/
  fs::create_directory_symlink("../../..", dir / "train/b/root");  // ROOT
  fs::create_directory_symlink("/", dir / "train/b/top");
  fs::create_directory_symlink("../a", dir / "train/b/sibling");
  fs::create_directory_symlink("../../val/a", dir / "train/b/val_a");
  fs::create_directory_symlink(dir / "outside", dir / "train/a/out1");
  fs::create_directory_symlink(dir / "outside", dir / "train/b/out2");
  fs::create_directory_symlink(dir / "outside/deep", dir / "train/b/out3");
  fs::create_symlink("../a/1.jpg", dir / "train/b/again.jpg");     // in place in a
  fs::create_symlink(dir / "lone.jpg", dir / "train/a/lone1.jpg");  // outside, twice
  fs::create_symlink(dir / "lone.jpg", dir / "train/b/lone2.jpg");
  const ImageList list = walkImageFolder(dir.str());
  EXPECT_EQ(pathsAndLabels(list.train), (std::vector<std::pair<std::string, int64_t>>{
                                            {"train/a/1.jpg", 0},
                                            {"train/a/lone1.jpg", 0},
                                            {"train/a/out1/deep/p.jpg", 0},
                                            {"train/a/out1/o.jpg", 0},
                                            {"train/a/sub/2.jpg", 0},
                                            {"train/b/3.jpg", 1}}));
  EXPECT_EQ(pathsAndLabels(list.val), (std::vector<std::pair<std::string, int64_t>>{
                                          {"val/a/v.jpg", 0}, {"val/b/w.jpg", 1}}));
  EXPECT_TRUE(list.bad.empty());
}

TEST(ImageFolder, AClassFolderThatIsAnotherIsNamed) {
  TempDir dir;
  writeBytes(dir / "train/a/1.jpg", "img");
  fs::create_directory_symlink("a", dir / "train/b");
  expectError([&] { walkImageFolder(dir.str()); },
              {"class folder " + dir.str() + "/train/b is " + dir.str() + "/train/a", "walked already"});
  fs::remove(dir / "train/b");
  fs::create_directory_symlink("..", dir / "train/b");
  expectError([&] { walkImageFolder(dir.str()); },
              {"class folder " + dir.str() + "/train/b leads to", "holds the data root"});
}

// A file named like an image that is not a regular file is named with its kind,
// not counted among the "other files".
TEST(ImageFolder, ImageNamesThatAreNotFilesAreNamedWithTheirKind) {
  TempDir dir;
  writeBytes(dir / "train/a/ok.jpg", "img");
  writeBytes(dir / "train/b/ok.png", "img");
  fs::create_directories(dir / "elsewhere");
  fs::create_symlink("../../elsewhere/gone.jpg", dir / "train/a/dangling.jpg");
  fs::create_symlink("/dev/null", dir / "train/a/null.png");
  ASSERT_EQ(::mkfifo((dir / "train/b/pipe.jpg").c_str(), 0600), 0) << std::strerror(errno);
  ASSERT_EQ(::mkfifo((dir / "train/b/pipe.txt").c_str(), 0600), 0);  // not an image name
  fs::create_symlink("loop.jpg", dir / "train/b/loop.jpg");
  const ImageList list = walkImageFolder(dir.str());
  EXPECT_EQ(list.train.size(), 2u);
  EXPECT_EQ(list.skipped, 1);  // pipe.txt
  std::vector<std::pair<std::string, std::string>> bad;
  for (const auto& b : list.bad) bad.emplace_back(b.path, b.kind);
  std::sort(bad.begin(), bad.end());
  ASSERT_EQ(bad.size(), 4u);
  EXPECT_EQ(bad[0], std::make_pair(std::string("train/a/dangling.jpg"),
                                   std::string("dangling symlink (to ../../elsewhere/gone.jpg)")));
  EXPECT_EQ(bad[1], std::make_pair(std::string("train/a/null.png"),
                                   std::string("symlink to a character device (/dev/null)")));
  EXPECT_EQ(bad[2].first, "train/b/loop.jpg");
  EXPECT_NE(bad[2].second.find("symlink whose target cannot be reached"), std::string::npos) << bad[2].second;
  EXPECT_EQ(bad[3], std::make_pair(std::string("train/b/pipe.jpg"), std::string("FIFO")));
  // The cache keeps them, and is stale once a dangling link's target appears
  // (outside every folder walked, so no folder's time changes).
  const ImageList back = parseImageList(serializeImageList(list), "c");
  ASSERT_EQ(back.bad.size(), 4u);
  EXPECT_EQ(back.bad[0].path, list.bad[0].path);
  EXPECT_EQ(back.bad[0].kind, list.bad[0].kind);
  EXPECT_TRUE(imageListCurrent(back, dir.str()));
  writeBytes(dir / "elsewhere/gone.jpg", "img");
  EXPECT_FALSE(imageListCurrent(back, dir.str()));
  EXPECT_EQ(walkImageFolder(dir.str()).train.size(), 3u);
}

// Note [list paths stay under the root].
TEST(ImageList, PathsThatLeaveTheRootAreRefusedUnlessAllowed) {
  TempDir dir;
  int64_t classes = 0;
  for (const char* path : {"../../etc/passwd", "/etc/passwd", "a/../../x.jpg", "./../x.jpg"}) {
    writeBytes(dir / "list.txt", std::string("ok/a.jpg 0\n# c\n") + path + " 1\n");
    expectError([&] { readImageList(dir / "list.txt", &classes); },
                {dir / "list.txt:3", path, "leaves the data root", "data.list_outside_root: true"});
    const auto entries = readImageList(dir / "list.txt", &classes, /*outside_root_ok=*/true);
    ASSERT_EQ(entries.size(), 2u);
    EXPECT_EQ(entries[1].path, path);
    EXPECT_EQ(entries[1].line, 3);
  }
  writeBytes(dir / "list.txt", "a/../b.jpg 0\nc/./..d.jpg 1\n..x/y.jpg 1\n");  // all inside
  EXPECT_EQ(readImageList(dir / "list.txt", &classes).size(), 3u);
}

std::string labelWhere(int64_t i) { return "y.npy row " + std::to_string(i); }

// Note [class count].
TEST(ClassCount, OneWildLabelIsRefusedNamingItsSample) {
  std::vector<int64_t> labels;
  for (int64_t i = 0; i < 40; ++i) labels.push_back(i % 8);
  labels[23] = 999999;
  expectError([&] { classCount(labels, 0, labelWhere); },
              {"label 999999 in y.npy row 23: 9 distinct labels would make a 1000000-way head",
               "set data.classes if that is intended"});
  EXPECT_EQ(classCount(labels, 1000000, labelWhere), 1000000);  // data.classes says so
  expectError([&] { classCount(labels, 8, labelWhere); },
              {"label 999999 in y.npy row 23 is outside 0..7 (data.classes: 8)"});
  labels[23] = -1;
  expectError([&] { classCount(labels, 0, labelWhere); }, {"label -1 in y.npy row 23", "negative"});
  expectError([&] { classCount(labels, 8, labelWhere); }, {"label -1 in y.npy row 23 is outside 0..7"});
}

TEST(ClassCount, EmptyClassesAreListedAndHalfIsTheLine) {
  std::vector<int64_t> empty;
  EXPECT_EQ(classCount({0, 1, 2, 3, 4, 5, 7, 0}, 0, labelWhere, &empty), 8);
  EXPECT_EQ(empty, (std::vector<int64_t>{6}));
  EXPECT_EQ(classCount({0, 1, 2, 3}, 0, labelWhere, &empty), 4);
  EXPECT_TRUE(empty.empty());
  EXPECT_EQ(classCount({0, 3}, 0, labelWhere, &empty), 4);  // 2 of 4: half, accepted
  EXPECT_EQ(empty, (std::vector<int64_t>{1, 2}));
  expectError([&] { classCount({0, 4}, 0, labelWhere); }, {"label 4 in y.npy row 1: 2 distinct labels", "5-way"});
  EXPECT_EQ(classCount({0, 0}, 0, labelWhere, &empty), 2);  // at least 2 outputs
  EXPECT_EQ(classCount({0, 1}, 10, labelWhere, &empty), 10);
  EXPECT_EQ(classListText({6}), "6");
  EXPECT_EQ(classListText({1, 2, 5}), "1, 2 and 5");
  EXPECT_EQ(classListText({1, 2, 3, 4, 5, 6, 7, 8, 9, 10}), "1, 2, 3, 4, 5, 6, 7, 8, ... (10 in all)");
}

TEST(ImageFolder, Errors) {
  TempDir dir;
  expectError([&] { walkImageFolder(dir.str()); },
              {"data.path: " + dir.str() + " has no train/ folder (expected ROOT/train/<class>/...)"});
  expectError([&] { walkImageFolder(dir / "absent"); }, {dir / "absent", "not a directory"});
  fs::create_directories(dir / "train");
  expectError([&] { walkImageFolder(dir.str()); }, {"no class folder"});
  makeFolder(dir);
  writeBytes(dir / "val/d_owl/o.jpg", "i");
  expectError([&] { walkImageFolder(dir.str()); }, {"'d_owl'", "in " + dir.str() + "/val but not in", "/train"});
  fs::remove_all(dir / "val/d_owl");
  fs::remove_all(dir / "val/b_dog");
  expectError([&] { walkImageFolder(dir.str()); }, {"'b_dog'", "/train but not in " + dir.str() + "/val"});
  fs::remove_all(dir / "val");
  fs::create_directories(dir / "train/e_empty/sub");
  writeBytes(dir / "train/e_empty/sub/readme.md", "x");
  expectError([&] { walkImageFolder(dir.str()); }, {"class 'e_empty'", "no image"});
}

TEST(ImageList, ReadListFile) {
  TempDir dir;
  writeBytes(dir / "list.txt",
             "# comment\n\nimgs/a b.jpg 3\r\n  imgs/c.png\t0  \nimgs/d.jpg 1\n");
  int64_t classes = 0;
  const auto entries = readImageList(dir / "list.txt", &classes);
  EXPECT_EQ(classes, 4);
  ASSERT_EQ(entries.size(), 3u);
  EXPECT_EQ(entries[0].path, "imgs/a b.jpg");
  EXPECT_EQ(entries[0].label, 3);
  EXPECT_EQ(entries[1].path, "imgs/c.png");
  EXPECT_EQ(entries[1].label, 0);
  writeBytes(dir / "bad.txt", "a.jpg 1\n# x\nb.jpg cat\n");
  expectError([&] { readImageList(dir / "bad.txt", &classes); }, {dir / "bad.txt:3", "'cat'"});
  writeBytes(dir / "bad.txt", "a.jpg 1\nb.jpg\n");
  expectError([&] { readImageList(dir / "bad.txt", &classes); }, {dir / "bad.txt:2", "relative/path label"});
  writeBytes(dir / "bad.txt", "a.jpg -1\n");
  expectError([&] { readImageList(dir / "bad.txt", &classes); }, {dir / "bad.txt:1", "'-1'"});
  writeBytes(dir / "bad.txt", "# only comments\n");
  expectError([&] { readImageList(dir / "bad.txt", &classes); }, {dir / "bad.txt", "no entries"});
  expectError([&] { readImageList(dir / "none.txt", &classes); }, {dir / "none.txt", "cannot read"});
}

TEST(ImageList, SerializeRoundTripAndRejectTruncation) {
  TempDir dir;
  makeFolder(dir);
  writeBytes(dir / "train/a_cat/odd name\nwith newline 1.jpg", "i");
  ImageList list = walkImageFolder(dir.str());
  const std::string text = serializeImageList(list);
  const ImageList back = parseImageList(text, "cache.txt");
  EXPECT_EQ(back.classes, list.classes);
  EXPECT_EQ(back.has_val, list.has_val);
  EXPECT_EQ(back.skipped, list.skipped);
  EXPECT_EQ(back.dirs, list.dirs);
  ASSERT_EQ(back.train.size(), list.train.size());
  for (size_t i = 0; i < list.train.size(); ++i) {
    EXPECT_EQ(back.train[i].path, list.train[i].path);
    EXPECT_EQ(back.train[i].label, list.train[i].label);
  }
  ASSERT_EQ(back.val.size(), list.val.size());
  EXPECT_EQ(serializeImageList(back), text);
  // Every proper prefix (a cache file cut short) is rejected, naming the source.
  for (size_t n = 0; n < text.size(); ++n) {
    try {
      parseImageList(text.substr(0, n), "cache.txt");
      ADD_FAILURE() << "prefix of " << n << " bytes accepted";
    } catch (const ConfigError& e) {
      ASSERT_NE(std::string(e.what()).find("cache.txt: malformed image list"), std::string::npos) << e.what();
    }
  }
  expectError([&] { parseImageList(text + "x", "cache.txt"); }, {"cache.txt", "after 'end'"});
  std::string bad_label = text;
  bad_label.replace(bad_label.find("\n0 17 train/a_cat/x.jpg"), 3, "\n9 ");
  expectError([&] { parseImageList(bad_label, "cache.txt"); }, {"cache.txt", "label 9"});
  expectError([&] { parseImageList("batchdist-image-list 3\n", "c"); }, {"c: malformed"});
  expectError([&] { parseImageList("batchdist-image-list 1\n", "c"); }, {"c: malformed"});
  // A list with no val and no dirs round-trips too.
  ImageList small;
  small.classes = {"0", "1"};
  small.train = {{"p q.jpg", 1}};
  const ImageList s2 = parseImageList(serializeImageList(small), "s");
  EXPECT_FALSE(s2.has_val);
  ASSERT_EQ(s2.train.size(), 1u);
  EXPECT_EQ(s2.train[0].path, "p q.jpg");
}

TEST(ImageList, CurrentUntilAClassFolderChanges) {
  TempDir dir;
  makeFolder(dir);
  // Distinct, known mtimes whatever the filesystem's granularity.
  touchDir(dir / "train/b_dog/sub", 1600000000);
  ImageList list = walkImageFolder(dir.str());
  EXPECT_TRUE(imageListCurrent(list, dir.str()));
  EXPECT_TRUE(imageListCurrent(parseImageList(serializeImageList(list), "c"), dir.str() + "/"));
  writeBytes(dir / "train/b_dog/sub/new.jpg", "i");
  touchDir(dir / "train/b_dog/sub", 1600000001);
  EXPECT_FALSE(imageListCurrent(list, dir.str()));
  list = walkImageFolder(dir.str());
  EXPECT_TRUE(imageListCurrent(list, dir.str()));
  EXPECT_EQ(list.train.size(), 8u);
  fs::remove_all(dir / "val/c_fish");
  EXPECT_FALSE(imageListCurrent(list, dir.str()));
  EXPECT_FALSE(imageListCurrent(ImageList(), dir.str()));  // nothing recorded
}

}  // namespace

// ---- files a user names: regular files only ----------------------------------

namespace {

/// A listening AF_UNIX socket at `path` (open() of it fails with ENXIO).
void makeSocket(const std::string& path) {
  const int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0) << std::strerror(errno);
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  ASSERT_LT(path.size(), sizeof a.sun_path) << path;
  std::memcpy(a.sun_path, path.c_str(), path.size() + 1);
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0) << std::strerror(errno);
  ::close(fd);  // the socket file stays
}

}  // namespace

// Note [input files are regular files]: data.name: tokens with data.path a FIFO
// waited in open() for ever (mapFile opened before it looked), and so did a .npy,
// a tar shard and an image list; a device was mapped or read. Every reader now
// refuses them by what they are, before a byte is read; a symlink to one too.
TEST(InputFiles, WhatIsNotARegularFileIsRefusedByEveryReaderWithoutWaiting) {
  TempDir dir;
  const std::string fifo = dir / "fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0) << std::strerror(errno);
  fs::create_symlink(fifo, dir / "link.bin");
  makeSocket(dir / "sock");
  const std::vector<std::pair<std::string, std::string>> cases = {
      {fifo, "is a pipe (FIFO), not a regular file"},
      {dir / "link.bin", "is a pipe (FIFO), not a regular file"},
      {dir / "sock", "is a socket, not a regular file"},
      {"/dev/zero", "is a character device, not a regular file"}};
  int64_t classes = 0;
  for (const auto& c : cases) {
    const std::string path = c.first, kind = c.second;  // named, for the lambdas (C++17)
    SCOPED_TRACE(path);
    expectNoWaitOn(fifo, [&] {
      const InputFile f = openInputFile(path);
      EXPECT_EQ(f.fd, -1);
      EXPECT_EQ(f.why(), kind);
      expectError([&] { readFileBounded(path, 1 << 20, "data file (data.path)"); },
                  {path + ": data file (data.path) " + kind + "; give a regular file"});
      expectError([&] { mapTokens(path, "data.path", 65); }, {path + ": " + kind + " (check data.path"});
      expectError([&] { mapNpy(path, {NpyType::kFloat32}); }, {path + ": " + kind + " (check data.path"});
      expectError([&] { indexTar(path); }, {path + ": " + kind + " (expected a .tar shard)"});
      expectError([&] { readImageList(path, &classes, false); }, {"data.list: " + path + " " + kind});
    });
  }
  // A directory and a missing file keep their words.
  expectError([&] { readFileBounded(dir.str(), 100, "config file"); },
              {dir.str() + ": is a directory, not a config file"});
  expectError([&] { readFileBounded(dir / "none", 100, "config file"); },
              {dir / "none", ": cannot open config file (No such file or directory)"});
  expectError([&] { mapTokens(dir.str(), "data.path", 65); },
              {dir.str() + ": is a directory, not a regular file"});
  // A shard that is a FIFO is listed, so that indexTar names it: a directory of
  // shards left it out without a word, and a pattern called it missing.
  TempDir shards;
  writeBytes(shards / "a.tar", kEnd);
  ASSERT_EQ(::mkfifo((shards / "b.tar").c_str(), 0600), 0);
  EXPECT_EQ(expandShards(shards.str()), (std::vector<std::string>{shards / "a.tar", shards / "b.tar"}));
  EXPECT_EQ(expandShards(shards / "{a,b}.tar"),
            (std::vector<std::string>{shards / "a.tar", shards / "b.tar"}));
  // A regular file still reads, and the descriptor blocks as usual.
  writeBytes(dir / "ok.txt", "hello");
  EXPECT_EQ(readFileBounded(dir / "ok.txt", 100, "test file"), "hello");
  const InputFile ok = openInputFile(dir / "ok.txt");
  ASSERT_GE(ok.fd, 0);
  EXPECT_EQ(ok.size, 5u);
  EXPECT_EQ(::fcntl(ok.fd, F_GETFL) & O_NONBLOCK, 0);
}
