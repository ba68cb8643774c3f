// batchdist_make_data: writes the small image folders, WebDataset shards, .npy
// files and byte-level token files the tests, configs and benchmarks train on. The
// pictures are learnable: patternRgb's class pattern plus noise, JPEG/PNG-encoded
// with the decoders' own libraries (tests/image_fixtures.h). Deterministic for a
// given --seed.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "tests/image_fixtures.h"

namespace fs = std::filesystem;
using namespace batchdist;
using batchdist::worker::NpyType;

namespace {

constexpr char kUsage[] = R"(usage: batchdist_make_data MODE DIR [options]

Writes a small, learnable data set for the tests and benchmarks.

  batchdist_make_data image_folder DIR [--classes 4] [--train-per-class 24]
      [--val-per-class 8] [--size 64x48] [--png-every 5] [--seed 1] [--no-val]
    DIR/train/<class>/<n>.jpg (every --png-every'th a .png, 0 = none; sizes vary
    by up to 25 %; every 6th image in a <class>/more/ subfolder), DIR/val likewise,
    and one README.txt in the first train class folder (a non-image, skipped).
    Class folders are c0_cat, c1_dog, ... (zero-padded: byte order = label order).

  batchdist_make_data webdataset DIR [--shards 3] [--classes 4] [--samples 96]
      [--val-samples 32] [--size 64x48] [--seed 1]
    DIR/train-000000.tar ... (the samples split evenly) and DIR/val-000000.tar
    (--val-samples 0: none); members <key>.jpg and <key>.cls, and <key>.json in
    every 8th sample (an extra member, skipped); keys sample000000, ...

  batchdist_make_data npy DIR [--samples 120] [--shape 3x16x16]
      [--dtype uint8|float16|float32] [--classes 4] [--val 0|N]
      [--label-dtype int64|int32] [--targets 0|K] [--seed 1]
    DIR/x.npy (samples x shape) and DIR/y.npy (labels), and with --val N > 0
    DIR/val_x.npy and DIR/val_y.npy: a class prototype plus noise per sample.
    --targets K > 0: y.npy holds float32 regression targets instead (N values for
    K = 1, N x K otherwise): fixed random linear functions of the sample plus
    noise 0.01, so a linear model reaches a mean squared error near 1e-4.

  batchdist_make_data tokens --text FILE --out DIR [--val-fraction 0.1]
    DIR/train.bin and DIR/val.bin: byte-level tokens of FILE, each byte one token
    id 0..255, as little-endian uint16 (nanoGPT's train.bin/val.bin format) for
    data.name: tokens with model.vocab: 256 (no tokenizer needed). val.bin holds
    the last --val-fraction of the bytes (0: no val.bin).

Options take a value as "--name V" or "--name=V". Exit status: 0 done, 2 bad
arguments, 1 a read or write failed.
)";

struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// ---- arguments -----------------------------------------------------------------

struct Args {
  std::string mode, dir;
  std::map<std::string, std::string> values;
  std::set<std::string> flags;
};

Args parseArgs(int argc, char** argv, const std::map<std::string, std::set<std::string>>& options,
               const std::map<std::string, std::set<std::string>>& flags) {
  Args a;
  a.mode = argv[1];
  if (options.count(a.mode) == 0) {
    throw UsageError("unknown mode '" + a.mode +
                     "' (expected image_folder, webdataset, npy or tokens)");
  }
  int i = 2;
  const bool dir_option = options.at(a.mode).count("out") > 0;  // tokens: --out DIR
  if (!dir_option) {
    if (i >= argc || std::strncmp(argv[i], "--", 2) == 0) throw UsageError(a.mode + ": missing DIR");
    a.dir = argv[i++];
  }
  for (; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg.rfind("--", 0) != 0) throw UsageError(a.mode + ": unexpected argument '" + arg + "'");
    std::string name = arg.substr(2), value;
    const size_t eq = name.find('=');
    const bool inline_value = eq != std::string::npos;
    if (inline_value) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
    }
    if (flags.at(a.mode).count(name)) {
      if (inline_value) throw UsageError(a.mode + ": --" + name + " takes no value");
      a.flags.insert(name);
      continue;
    }
    if (!options.at(a.mode).count(name)) {
      throw UsageError(a.mode + ": unknown option '--" + name + "'");
    }
    if (!inline_value) {
      if (i + 1 >= argc) throw UsageError(a.mode + ": --" + name + " needs a value");
      value = argv[++i];
    }
    if (a.values.count(name)) throw UsageError(a.mode + ": --" + name + " given twice");
    a.values[name] = value;
  }
  if (dir_option) {
    if (!a.values.count("out") || a.values["out"].empty()) {
      throw UsageError(a.mode + ": missing --out DIR");
    }
    a.dir = a.values["out"];
  }
  return a;
}

int64_t intOpt(const Args& a, const std::string& name, int64_t def, int64_t lo, int64_t hi) {
  const auto it = a.values.find(name);
  if (it == a.values.end()) return def;
  const std::string& v = it->second;
  size_t used = 0;
  int64_t x = 0;
  try {
    x = std::stoll(v, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (v.empty() || used != v.size()) {
    throw UsageError(a.mode + ": --" + name + " '" + v + "' is not an integer");
  }
  if (x < lo || x > hi) {
    throw UsageError(a.mode + ": --" + name + " " + v + " is out of range [" + std::to_string(lo) +
                     ", " + std::to_string(hi) + "]");
  }
  return x;
}

/// "64x48" / "3x16x16": each dimension in [lo, hi].
std::vector<int64_t> dimsOpt(const Args& a, const std::string& name, const std::string& def,
                             size_t min_dims, size_t max_dims, int64_t lo, int64_t hi) {
  const auto it = a.values.find(name);
  const std::string v = it == a.values.end() ? def : it->second;
  std::vector<int64_t> dims;
  size_t pos = 0;
  bool ok = !v.empty();
  while (ok && pos <= v.size()) {
    const size_t x = v.find('x', pos);
    const std::string part = v.substr(pos, x == std::string::npos ? std::string::npos : x - pos);
    ok = !part.empty() && part.size() <= 9 &&
         part.find_first_not_of("0123456789") == std::string::npos;
    if (ok) dims.push_back(std::stoll(part));
    if (x == std::string::npos) break;
    pos = x + 1;
  }
  ok = ok && dims.size() >= min_dims && dims.size() <= max_dims;
  for (int64_t d : dims) ok = ok && d >= lo && d <= hi;
  if (!ok) {
    throw UsageError(a.mode + ": --" + name + " '" + v + "' is not " +
                     (max_dims == 2 ? "WIDTHxHEIGHT" : "DxDx...") + " with each in [" +
                     std::to_string(lo) + ", " + std::to_string(hi) + "]");
  }
  return dims;
}

std::string choiceOpt(const Args& a, const std::string& name, const std::string& def,
                      const std::set<std::string>& choices) {
  const auto it = a.values.find(name);
  const std::string v = it == a.values.end() ? def : it->second;
  if (!choices.count(v)) {
    std::string list;
    for (const auto& c : choices) list += (list.empty() ? "" : ", ") + c;
    throw UsageError(a.mode + ": --" + name + " '" + v + "' is not one of " + list);
  }
  return v;
}

// ---- deterministic randomness (the same bytes on every platform) ---------------

struct Rng {
  uint64_t s;
  explicit Rng(uint64_t seed) : s(seed * 0x9E3779B97F4A7C15ULL + 0x632BE59BD9B4E019ULL) {}
  uint64_t next() {
    uint64_t z = (s += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
  }
  double uniform() { return (next() >> 11) * (1.0 / 9007199254740992.0); }
  double normal() {
    const double u1 = uniform() + 1e-300, u2 = uniform();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  }
  int64_t below(int64_t n) { return static_cast<int64_t>(next() % static_cast<uint64_t>(n)); }
};

uint16_t toHalf(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint32_t sign = (x >> 16) & 0x8000;
  const int32_t e = static_cast<int32_t>((x >> 23) & 0xff);
  uint32_t mant = x & 0x7fffff;
  if (e == 0xff) return static_cast<uint16_t>(sign | 0x7c00 | (mant ? 0x200 : 0));
  const int32_t exp = e - 127 + 15;
  if (exp >= 31) return static_cast<uint16_t>(sign | 0x7c00);
  if (exp <= 0) {
    if (exp < -10) return static_cast<uint16_t>(sign);
    mant |= 0x800000;
    const int shift = 14 - exp;
    uint32_t half = mant >> shift;
    const uint32_t rem = mant & ((1u << shift) - 1), mid = 1u << (shift - 1);
    if (rem > mid || (rem == mid && (half & 1))) ++half;
    return static_cast<uint16_t>(sign | half);
  }
  uint32_t half = (static_cast<uint32_t>(exp) << 10) | (mant >> 13);
  const uint32_t rem = mant & 0x1fff;
  if (rem > 0x1000 || (rem == 0x1000 && (half & 1))) ++half;  // may carry into the exponent: fine
  return static_cast<uint16_t>(sign | half);
}

// ---- writers --------------------------------------------------------------------

void makeDirs(const fs::path& p) {
  std::error_code ec;
  fs::create_directories(p, ec);
  if (ec) throw std::runtime_error("cannot create " + p.string() + ": " + ec.message());
}

std::string className(int64_t k, int64_t classes) {
  static const char* kNames[] = {"cat", "dog", "bird", "fish", "frog", "horse", "ship", "truck", "plane", "deer"};
  const int width = static_cast<int>(std::to_string(classes - 1).size());
  char idx[32];
  std::snprintf(idx, sizeof idx, "%0*lld", width, static_cast<long long>(k));
  return std::string("c") + idx + "_" + (k < 10 ? kNames[k] : "class" + std::to_string(k));
}

/// A w x h picture of class `cls`, the size varied by up to +-25 %.
std::string picture(int64_t base_w, int64_t base_h, int64_t cls, uint64_t seed, bool png, Rng& rng) {
  const int w = std::max<int>(8, static_cast<int>(std::lround(base_w * (0.75 + 0.5 * rng.uniform()))));
  const int h = std::max<int>(8, static_cast<int>(std::lround(base_h * (0.75 + 0.5 * rng.uniform()))));
  const std::vector<uint8_t> rgb = testing::patternRgb(w, h, static_cast<int>(cls), seed);
  return png ? testing::encodePng(rgb.data(), w, h, testing::PngKind::kRgb8)
             : testing::encodeJpeg(rgb.data(), w, h, 3, 90);
}

void refuseExisting(const fs::path& p, const std::string& mode) {
  std::error_code ec;
  if (fs::exists(p, ec)) {
    throw UsageError(mode + ": " + p.string() + " already exists; remove it or pick another DIR");
  }
}

int imageFolder(const Args& a) {
  const int64_t classes = intOpt(a, "classes", 4, 1, 1000);
  const int64_t train_n = intOpt(a, "train-per-class", 24, 1, 1000000);
  const bool no_val = a.flags.count("no-val") > 0;
  const int64_t val_n = intOpt(a, "val-per-class", 8, no_val ? 0 : 1, 1000000);
  const auto size = dimsOpt(a, "size", "64x48", 2, 2, 8, 8192);
  const int64_t png_every = intOpt(a, "png-every", 5, 0, 1000000);
  const uint64_t seed = static_cast<uint64_t>(intOpt(a, "seed", 1, 0, INT64_MAX));
  const fs::path root(a.dir);
  refuseExisting(root / "train", a.mode);
  if (!no_val) refuseExisting(root / "val", a.mode);
  int64_t images = 0, pngs = 0;
  for (int split = 0; split < (no_val ? 1 : 2); ++split) {
    const char* name = split == 0 ? "train" : "val";
    const int64_t per_class = split == 0 ? train_n : val_n;
    for (int64_t c = 0; c < classes; ++c) {
      const fs::path cdir = root / name / className(c, classes);
      makeDirs(cdir);
      Rng rng(seed * 7919 + static_cast<uint64_t>(split * 1000003 + c));
      for (int64_t n = 0; n < per_class; ++n) {
        const bool png = png_every > 0 && n % png_every == png_every - 1;
        char file[64];
        std::snprintf(file, sizeof file, "%06lld.%s", static_cast<long long>(n), png ? "png" : "jpg");
        const fs::path dir = n % 6 == 5 ? cdir / "more" : cdir;
        if (n % 6 == 5) makeDirs(dir);
        const uint64_t pic_seed = seed * 1000000007ULL + static_cast<uint64_t>(split) * 7777777ULL +
                                  static_cast<uint64_t>(c) * 1000003ULL + static_cast<uint64_t>(n);
        testing::writeFile((dir / file).string(), picture(size[0], size[1], c, pic_seed, png, rng));
        ++images;
        pngs += png;
      }
    }
  }
  testing::writeFile((root / "train" / className(0, classes) / "README.txt").string(),
                     "Not an image: the reader skips and counts it.\n");
  std::printf("batchdist_make_data: wrote %lld images (%lld png) in %lld classes to %s/train%s\n",
              static_cast<long long>(images), static_cast<long long>(pngs),
              static_cast<long long>(classes), a.dir.c_str(), no_val ? "" : " and val");
  return 0;
}

int webDataset(const Args& a) {
  const int64_t shards = intOpt(a, "shards", 3, 1, 100000);
  const int64_t classes = intOpt(a, "classes", 4, 1, 1000000);
  const int64_t samples = intOpt(a, "samples", 96, 1, 100000000);
  const int64_t val_samples = intOpt(a, "val-samples", 32, 0, 100000000);
  const auto size = dimsOpt(a, "size", "64x48", 2, 2, 8, 8192);
  const uint64_t seed = static_cast<uint64_t>(intOpt(a, "seed", 1, 0, INT64_MAX));
  if (samples < shards) {
    throw UsageError(a.mode + ": --samples " + std::to_string(samples) + " is fewer than --shards " +
                     std::to_string(shards) + " (every shard needs a sample)");
  }
  const fs::path root(a.dir);
  makeDirs(root);
  for (const auto& e : fs::directory_iterator(root)) {
    const std::string n = e.path().filename().string();
    if ((n.rfind("train-", 0) == 0 || n.rfind("val-", 0) == 0) && e.path().extension() == ".tar") {
      throw UsageError(a.mode + ": " + e.path().string() +
                       " already exists; remove the old shards or pick another DIR");
    }
  }
  Rng rng(seed * 104729 + 17);
  int64_t key = 0;
  auto writeShard = [&](const fs::path& path, int64_t count) {
    std::vector<std::pair<std::string, std::string>> members;
    for (int64_t i = 0; i < count; ++i, ++key) {
      char k[32];
      std::snprintf(k, sizeof k, "sample%06lld", static_cast<long long>(key));
      const int64_t label = rng.below(classes);
      members.emplace_back(std::string(k) + ".jpg",
                           picture(size[0], size[1], label, seed * 1000000007ULL + key, false, rng));
      members.emplace_back(std::string(k) + ".cls", std::to_string(label));
      if (key % 8 == 7) {
        members.emplace_back(std::string(k) + ".json",
                             "{\"key\": \"" + std::string(k) + "\", \"label\": " + std::to_string(label) + "}");
      }
    }
    testing::writeFile(path.string(), testing::makeTar(members));
  };
  for (int64_t s = 0; s < shards; ++s) {
    char name[32];
    std::snprintf(name, sizeof name, "train-%06lld.tar", static_cast<long long>(s));
    writeShard(root / name, (s + 1) * samples / shards - s * samples / shards);
  }
  if (val_samples > 0) writeShard(root / "val-000000.tar", val_samples);
  std::printf("batchdist_make_data: wrote %lld samples in %lld shards to %s/train-{000000..%06lld}.tar%s\n",
              static_cast<long long>(samples), static_cast<long long>(shards), a.dir.c_str(),
              static_cast<long long>(shards - 1),
              val_samples > 0 ? (" and " + std::to_string(val_samples) + " in val-000000.tar").c_str() : "");
  return 0;
}

/// --targets: K fixed random weight rows over a sample's `row` values (seeded).
std::vector<std::vector<double>> targetWeights(int64_t targets, int64_t row, uint64_t seed) {
  std::vector<std::vector<double>> w(static_cast<size_t>(targets));
  Rng rng(seed * 7919 + 17);
  for (auto& r : w) {
    r.resize(static_cast<size_t>(row));
    for (auto& v : r) v = rng.normal() / std::sqrt(static_cast<double>(row));
  }
  return w;
}

void writeNpyPair(const fs::path& xpath, const fs::path& ypath, int64_t n, const std::vector<int64_t>& shape,
                  NpyType type, NpyType label_type, int64_t classes,
                  const std::vector<std::vector<float>>& prototypes, uint64_t seed,
                  const std::vector<std::vector<double>>& targets = {}) {
  std::vector<int64_t> full = {n};
  full.insert(full.end(), shape.begin(), shape.end());
  int64_t row = 1;
  for (int64_t d : shape) row *= d;
  std::ofstream x(xpath, std::ios::binary | std::ios::trunc);
  std::ofstream y(ypath, std::ios::binary | std::ios::trunc);
  if (!x || !y) throw std::runtime_error("cannot write " + xpath.string() + " / " + ypath.string());
  const std::string xh = testing::makeNpy(type, full, "");
  const auto k = static_cast<int64_t>(targets.size());
  const std::string yh = k == 0   ? testing::makeNpy(label_type, {n}, "")
                         : k == 1 ? testing::makeNpy(NpyType::kFloat32, {n}, "")
                                  : testing::makeNpy(NpyType::kFloat32, {n, k}, "");
  std::vector<double> values(static_cast<size_t>(row));
  x.write(xh.data(), static_cast<std::streamsize>(xh.size()));
  y.write(yh.data(), static_cast<std::streamsize>(yh.size()));
  Rng rng(seed);
  std::string buf;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t label = rng.below(classes);
    buf.clear();
    for (int64_t j = 0; j < row; ++j) {
      const double v = std::min(1.0, std::max(0.0, prototypes[label][j] + 0.15 * rng.normal()));
      values[static_cast<size_t>(j)] = v;
      if (type == NpyType::kUint8) {
        buf += static_cast<char>(std::lround(v * 255));
      } else if (type == NpyType::kFloat16) {
        const uint16_t h = toHalf(static_cast<float>(v));
        buf.append(reinterpret_cast<const char*>(&h), 2);
      } else {
        const float f = static_cast<float>(v);
        buf.append(reinterpret_cast<const char*>(&f), 4);
      }
    }
    x.write(buf.data(), static_cast<std::streamsize>(buf.size()));
    if (k > 0) {
      for (const auto& w : targets) {
        double t = 0;
        for (int64_t j = 0; j < row; ++j) t += w[static_cast<size_t>(j)] * values[static_cast<size_t>(j)];
        const float f = static_cast<float>(t + 0.01 * rng.normal());
        y.write(reinterpret_cast<const char*>(&f), 4);
      }
    } else if (label_type == NpyType::kInt64) {
      y.write(reinterpret_cast<const char*>(&label), 8);
    } else {
      const int32_t l = static_cast<int32_t>(label);
      y.write(reinterpret_cast<const char*>(&l), 4);
    }
  }
  x.close();
  y.close();
  if (!x || !y) throw std::runtime_error("writing " + xpath.string() + " / " + ypath.string() + " failed");
}

int npy(const Args& a) {
  const int64_t samples = intOpt(a, "samples", 120, 1, 1000000000);
  const auto shape = dimsOpt(a, "shape", "3x16x16", 1, 4, 1, 1 << 20);
  const std::string dtype = choiceOpt(a, "dtype", "uint8", {"uint8", "float16", "float32"});
  const int64_t classes = intOpt(a, "classes", 4, 1, 1000000);
  const int64_t val = intOpt(a, "val", 0, 0, 1000000000);
  const std::string label_dtype = choiceOpt(a, "label-dtype", "int64", {"int64", "int32"});
  const int64_t targets = intOpt(a, "targets", 0, 0, 4096);
  const uint64_t seed = static_cast<uint64_t>(intOpt(a, "seed", 1, 0, INT64_MAX));
  int64_t row = 1;
  for (int64_t d : shape) {
    row *= d;
    if (row > (int64_t{1} << 24)) throw UsageError(a.mode + ": --shape has more than 2^24 elements per sample");
  }
  if (classes > 4096 && classes * row > (int64_t{1} << 28)) {
    throw UsageError(a.mode + ": --classes x --shape is too large for the class prototypes");
  }
  const NpyType type = dtype == "uint8" ? NpyType::kUint8 : dtype == "float16" ? NpyType::kFloat16 : NpyType::kFloat32;
  const NpyType label_type = label_dtype == "int64" ? NpyType::kInt64 : NpyType::kInt32;
  // A smooth random prototype per class: the samples are it plus noise.
  std::vector<std::vector<float>> prototypes(static_cast<size_t>(classes));
  for (int64_t c = 0; c < classes; ++c) {
    Rng rng(seed * 31337 + static_cast<uint64_t>(c));
    const double f1 = 1 + rng.uniform() * 6, f2 = 1 + rng.uniform() * 6, ph = rng.uniform() * 6.283;
    const double bias = 0.2 + 0.6 * rng.uniform();
    prototypes[c].resize(static_cast<size_t>(row));
    for (int64_t j = 0; j < row; ++j) {
      const double t = static_cast<double>(j) / static_cast<double>(row);
      prototypes[c][j] = static_cast<float>(bias + 0.3 * std::sin(6.283 * f1 * t + ph) * std::cos(6.283 * f2 * t * 3));
    }
  }
  const fs::path root(a.dir);
  makeDirs(root);
  const auto weights = targetWeights(targets, row, seed);
  writeNpyPair(root / "x.npy", root / "y.npy", samples, shape, type, label_type, classes, prototypes, seed * 2 + 1,
               weights);
  if (val > 0) {
    writeNpyPair(root / "val_x.npy", root / "val_y.npy", val, shape, type, label_type, classes, prototypes,
                 seed * 2 + 2, weights);
  }
  std::printf("batchdist_make_data: wrote %s/x.npy (%lld samples, %s) and y.npy (%s)%s\n", a.dir.c_str(),
              static_cast<long long>(samples), dtype.c_str(),
              targets > 0 ? ("float32 targets x " + std::to_string(targets)).c_str() : label_dtype.c_str(),
              val > 0 ? (", val_x.npy / val_y.npy (" + std::to_string(val) + ")").c_str() : "");
  return 0;
}

/// --NAME as a number in [lo, hi].
double realOpt(const Args& a, const std::string& name, double def, double lo, double hi) {
  const auto it = a.values.find(name);
  if (it == a.values.end()) return def;
  const std::string& v = it->second;
  size_t used = 0;
  double x = 0;
  try {
    x = std::stod(v, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (v.empty() || used != v.size() || !(x >= lo && x <= hi)) {
    throw UsageError(a.mode + ": --" + name + " '" + v + "' is not a number in [" +
                     std::to_string(lo) + ", " + std::to_string(hi) + "]");
  }
  return x;
}

/// `bytes` as little-endian uint16 token ids, one per byte (Note [tokens]).
void writeByteTokens(const fs::path& path, const std::string& bytes) {
  std::string out(bytes.size() * 2, '\0');
  for (size_t i = 0; i < bytes.size(); ++i) out[2 * i] = bytes[i];  // the high byte stays 0
  std::ofstream f(path, std::ios::binary);
  f.write(out.data(), static_cast<std::streamsize>(out.size()));
  f.close();
  if (!f) throw std::runtime_error("writing " + path.string() + " failed");
}

int tokens(const Args& a) {
  const auto it = a.values.find("text");
  if (it == a.values.end() || it->second.empty()) throw UsageError(a.mode + ": missing --text FILE");
  const double val_fraction = realOpt(a, "val-fraction", 0.1, 0.0, 0.9);
  if (!fs::is_regular_file(it->second)) {
    throw std::runtime_error("--text " + it->second + ": not a regular file");
  }
  std::ifstream in(it->second, std::ios::binary);
  if (!in) throw std::runtime_error("cannot read --text " + it->second);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) throw std::runtime_error("reading --text " + it->second + " failed");
  const auto n = static_cast<int64_t>(text.size());
  const auto n_val = static_cast<int64_t>(std::llround(static_cast<double>(n) * val_fraction));
  if (n - n_val < 2 || (val_fraction > 0 && n_val < 2)) {
    char f[32];
    std::snprintf(f, sizeof f, "%g", val_fraction);
    throw UsageError(a.mode + ": --text " + it->second + " has " + std::to_string(n) +
                     " bytes: too few for train.bin and val.bin at --val-fraction " + f);
  }
  const fs::path root(a.dir);
  makeDirs(root);
  writeByteTokens(root / "train.bin", text.substr(0, static_cast<size_t>(n - n_val)));
  if (n_val > 0) writeByteTokens(root / "val.bin", text.substr(static_cast<size_t>(n - n_val)));
  std::printf("batchdist_make_data: wrote %s/train.bin (%lld tokens)%s: byte-level, vocab 256\n",
              a.dir.c_str(), static_cast<long long>(n - n_val),
              n_val > 0 ? (" and val.bin (" + std::to_string(n_val) + " tokens)").c_str() : "");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "batchdist_make_data: missing MODE\n\n%s", kUsage);
    return 2;
  }
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--help" || arg == "-h" || (i == 1 && arg == "help")) {
      std::fputs(kUsage, stdout);
      return 0;
    }
  }
  const std::map<std::string, std::set<std::string>> options = {
      {"image_folder", {"classes", "train-per-class", "val-per-class", "size", "png-every", "seed"}},
      {"webdataset", {"shards", "classes", "samples", "val-samples", "size", "seed"}},
      {"npy", {"samples", "shape", "dtype", "classes", "val", "label-dtype", "targets", "seed"}},
      {"tokens", {"text", "out", "val-fraction"}}};
  const std::map<std::string, std::set<std::string>> flags = {
      {"image_folder", {"no-val"}}, {"webdataset", {}}, {"npy", {}}, {"tokens", {}}};
  try {
    const Args a = parseArgs(argc, argv, options, flags);
    if (a.mode == "image_folder") return imageFolder(a);
    if (a.mode == "webdataset") return webDataset(a);
    if (a.mode == "tokens") return tokens(a);
    return npy(a);
  } catch (const UsageError& e) {
    std::fprintf(stderr, "batchdist_make_data: %s (see batchdist_make_data --help)\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "batchdist_make_data: %s\n", e.what());
    return 1;
  }
}
