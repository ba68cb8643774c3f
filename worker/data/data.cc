#include "worker/data/data.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <sstream>
#include <tuple>

#include "common/error.h"
#include "worker/data/labels.h"
#include "worker/data/pipeline.h"
#include "worker/data/sources/npy.h"
#include "worker/data/sources/tokens.h"
#include "worker/plan/plan.h"
#include "worker/common/files.h"
#include "worker/common/torch_error.h"
#include "worker/common/util.h"

extern "C" const char batchdist_digits_begin[];
extern "C" const char batchdist_digits_end[];

namespace batchdist::worker {
namespace {

int64_t product(const std::vector<int64_t>& v) {
  return std::accumulate(v.begin(), v.end(), int64_t{1}, std::multiplies<int64_t>());
}

/// Largest data file read into memory (the loader keeps whole data sets in memory).
constexpr std::uintmax_t kMaxDataBytes = std::uintmax_t{16} << 30;

// Note [input files are regular files]: a data file is read whole by every rank,
// and again by `plan` and `batchdist slurm`, so it must be a file that reads the
// same each time. A device or pipe is refused before a byte is read: /dev/zero was
// read up to a 1 GiB stream bound first (2.2 GB resident per rank), and a pipe
// could be read by one rank only.
std::string readFile(const std::string& path) {
  return readFileBounded(path, kMaxDataBytes, "data file (data.path)",
                         "every rank reads a data file whole, and more than once, so give "
                         "data.path a file (save a pipe's output to one first)");
}

Dataset synthetic(const DataConfig& cfg, int64_t seed) {
  // Class centres plus Gaussian noise: learnable, seeded, any size and shape.
  auto gen = at::detail::createCPUGenerator(static_cast<uint64_t>(seed) * 7919 + 17);
  const int64_t dim = product(cfg.shape);
  auto centres = at::randn({cfg.classes, dim}, gen, at::kFloat);
  auto y = at::randint(cfg.classes, {cfg.samples}, gen, at::kLong);
  auto x = centres.index_select(0, y) + cfg.noise * at::randn({cfg.samples, dim}, gen, at::kFloat);
  std::vector<int64_t> full{cfg.samples};
  full.insert(full.end(), cfg.shape.begin(), cfg.shape.end());
  return {x.reshape(full).contiguous(), y, cfg.shape, cfg.classes};
}

Dataset syntheticImages(const DataConfig& cfg, int64_t seed) {
  // Class templates with spatial structure (a 4x4 pattern per channel, upsampled),
  // plus noise: a convnet learns them, and any size works for benchmarks.
  if (cfg.shape.size() != 3) {
    throw ConfigError(strCat("data.shape: synthetic_images needs [C, H, W], got ",
                             shapeText(cfg.shape)));
  }
  auto gen = at::detail::createCPUGenerator(static_cast<uint64_t>(seed) * 7919 + 29);
  const int64_t c = cfg.shape[0], h = cfg.shape[1], w = cfg.shape[2];
  auto templates = at::upsample_bilinear2d(at::rand({cfg.classes, c, 4, 4}, gen, at::kFloat),
                                           {h, w}, /*align_corners=*/false);
  auto y = at::randint(cfg.classes, {cfg.samples}, gen, at::kLong);
  auto x = templates.index_select(0, y) +
           cfg.noise * 0.25 * at::randn({cfg.samples, c, h, w}, gen, at::kFloat);
  x = (x.clamp(0, 1) * 255).round().to(at::kByte);
  Dataset d{x.contiguous(), y, cfg.shape, cfg.classes};
  d.x_scale = 1.0 / 255.0;
  return d;
}

std::string fileIn(const std::string& dir, const std::string& name) {
  return (dir.empty() ? std::string(".") : dir) + "/" + name;
}

Dataset concat(const std::vector<Dataset>& parts) {
  std::vector<at::Tensor> xs, ys;
  for (const auto& p : parts) {
    xs.push_back(p.x);
    ys.push_back(p.target);
  }
  Dataset d = parts.front();
  d.x = at::cat(xs);
  d.target = at::cat(ys);
  return d;
}

}  // namespace

std::string embeddedDigitsCsv() {
  return std::string(batchdist_digits_begin, batchdist_digits_end - batchdist_digits_begin);
}

Dataset parseCsv(const std::string& text, const std::string& source, int64_t classes,
                 std::vector<int64_t> sample_shape, double scale) {
  std::vector<float> features;
  std::vector<int64_t> labels;
  int64_t width = -1;
  int64_t line_no = 0;
  std::size_t pos = 0;
  std::vector<double> row;
  while (pos < text.size()) {
    std::size_t end = text.find('\n', pos);
    if (end == std::string::npos) end = text.size();
    std::string line = text.substr(pos, end - pos);
    pos = end + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.find_first_not_of(" \t") == std::string::npos) continue;
    row.clear();
    const char* p = line.c_str();
    for (int64_t col = 1;; ++col) {
      char* after = nullptr;
      errno = 0;
      const double v = std::strtod(p, &after);
      while (after && (*after == ' ' || *after == '\t')) ++after;
      if (after == p || errno != 0 || (*after != ',' && *after != '\0') || !std::isfinite(v)) {
        std::string cell(p, std::strcspn(p, ","));
        throw ConfigError(strCat(source, ":", line_no, ": column ", col,
                                 ": expected a number, got '", cell, "'"));
      }
      row.push_back(v);
      if (*after == '\0') break;
      p = after + 1;
    }
    if (width < 0) {
      width = static_cast<int64_t>(row.size());
      if (width < 2) {
        throw ConfigError(strCat(source, ":", line_no,
                                 ": expected feature columns followed by a label column, got ",
                                 width, " column"));
      }
    } else if (static_cast<int64_t>(row.size()) != width) {
      throw ConfigError(strCat(source, ":", line_no, ": expected ", width,
                               " columns (like the first row), got ", row.size()));
    }
    const double label = row.back();
    if (label != std::floor(label) || label < 0 || label >= static_cast<double>(classes)) {
      throw ConfigError(strCat(source, ":", line_no, ": label ", label, " is not an integer in 0..",
                               classes - 1, " (data.classes = ", classes, ")"));
    }
    labels.push_back(static_cast<int64_t>(label));
    for (int64_t i = 0; i + 1 < width; ++i) features.push_back(static_cast<float>(row[i] * scale));
  }
  if (labels.empty()) throw ConfigError(strCat(source, ": no data rows"));
  const int64_t n = static_cast<int64_t>(labels.size());
  const int64_t dim = width - 1;
  if (product(sample_shape) != dim) sample_shape = {dim};
  std::vector<int64_t> full{n};
  full.insert(full.end(), sample_shape.begin(), sample_shape.end());
  auto x = at::tensor(features, at::kFloat).reshape(full).contiguous();
  auto y = at::tensor(labels, at::kLong);
  return {x, y, sample_shape, classes};
}

Dataset subset(const Dataset& d, const std::vector<int64_t>& rows) {
  auto idx = at::tensor(rows, at::kLong);
  Dataset out;
  out.as_given = d.as_given;
  if (d.examples) {  // Note [program data]: read through rows
    out.examples = d.examples;
    out.rows = d.rows.defined() ? d.rows.index_select(0, idx) : idx;
    out.sample_shape = d.sample_shape;
    return out;
  }
  // Token windows (Note [tokens]): the target is a view of the file too.
  out.target = d.tokens ? d.target : d.target.index_select(0, idx).contiguous();
  out.tokens = d.tokens;
  out.sample_shape = d.sample_shape;
  out.classes = d.classes;
  out.x_scale = d.x_scale;
  if (d.source) {
    out.source = d.source->subset(rows);
  } else if (d.mapped) {
    out.x = d.x;  // a mapped file: keep the mapping, select through rows
    out.rows = d.rows.defined() ? d.rows.index_select(0, idx) : idx;
    out.mapped = true;
  } else {
    out.x = d.x.index_select(0, idx).contiguous();
  }
  return out;
}

namespace {

/// The rows of x (and of a token set's target) that samples `idx` are.
at::Tensor rowsOf(const Dataset& d, const at::Tensor& idx) {
  return d.rows.defined() ? d.rows.index_select(0, idx) : idx;
}

/// Note [tokens]: stored ids as int64. A uint16 file is mapped as int16, so its
/// ids from 32768 up read negative until masked.
at::Tensor tokenIds(const at::Tensor& raw) {
  auto ids = raw.to(at::kLong);
  return raw.scalar_type() == at::kShort ? ids.bitwise_and_(0xFFFF) : ids;
}

}  // namespace

namespace {
std::vector<int64_t> indexList(const at::Tensor& idx) {
  const auto t = idx.to(at::kCPU, at::kLong).contiguous();
  return std::vector<int64_t>(t.data_ptr<int64_t>(), t.data_ptr<int64_t>() + t.numel());
}
}  // namespace

at::Tensor Dataset::gather(const at::Tensor& idx) const {
  return x.index_select(0, rowsOf(*this, idx));
}

at::Tensor Dataset::inputs(const at::Tensor& idx) const {
  if (tokens) return tokens->ids(x, rowsOf(*this, idx));
  if (examples) return batch(indexList(idx)).first;
  if (as_given) return gather(idx);
  auto b = gather(idx).to(at::kFloat);
  if (x_scale != 1.0) b.mul_(x_scale);
  return b;
}

at::Tensor Dataset::targets(const at::Tensor& idx) const {
  if (tokens) return tokens->ids(target, rowsOf(*this, idx));
  if (examples) return batch(indexList(idx)).second;
  return target.index_select(0, idx);
}

std::pair<at::Tensor, at::Tensor> Dataset::batch(const std::vector<int64_t>& idx) const {
  if (!examples) {
    const auto t = at::tensor(idx, at::kLong);
    return {inputs(t), targets(t)};
  }
  at::Tensor bx, bt;
  std::vector<int64_t> rows_of = idx;
  if (rows.defined()) {
    const auto* r = rows.data_ptr<int64_t>();
    for (auto& i : rows_of) i = r[i];
  }
  try {
    std::tie(bx, bt) = examples->get(rows_of);
  } catch (const c10::OutOfMemoryError&) {
    throw;
  } catch (const std::bad_alloc&) {
    throw;
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    throw TrainingError(strCat("data.name: program: the data set's get() failed on ", idx.size(),
                               " indices from ", rows_of.empty() ? 0 : rows_of.front(), ": ",
                               messageOf(e)));
  }
  const auto n = static_cast<int64_t>(idx.size());
  if (!bx.defined() || !bt.defined() || bx.dim() == 0 || bt.dim() == 0 || bx.size(0) != n ||
      bt.size(0) != n) {
    throw TrainingError(strCat(
        "data.name: program: the data set's get() of ", n, " indices returned x of shape ",
        bx.defined() ? shapeText(bx.sizes().vec()) : std::string("(undefined)"), " and target of shape ",
        bt.defined() ? shapeText(bt.sizes().vec()) : std::string("(undefined)"),
        "; return both stacked, [", n, ", ...]"));
  }
  return {bx, bt};
}

at::Tensor TokenSource::ids(const at::Tensor& view, const at::Tensor& rows) const {
  auto out = tokenIds(view.index_select(0, rows));
  if (out.numel() == 0 || (out.min().item<int64_t>() >= 0 && out.max().item<int64_t>() < vocab)) {
    return out;
  }
  // The first id out of range, in the batch's order, and where it is in the file.
  const auto flat = out.reshape({-1});
  const int64_t k = at::nonzero(at::logical_or(flat.lt(0), flat.ge(vocab)))[0][0].item<int64_t>();
  const int64_t t = view.size(1);
  const int64_t offset =
      view.storage_offset() + rows[k / t].item<int64_t>() * view.stride(0) + k % t;
  const int64_t value = flat[k].item<int64_t>();
  const std::string fix = value >= vocab ? strCat("raise model.vocab to the tokenizer's vocabulary "
                                                  "size (at least ", value + 1, ")")
                                         : "token ids are not negative: is the file token ids?";
  throw ConfigError(strCat(path, ": token ", offset, " (byte offset ",
                           header_bytes + offset * item_bytes, ") is ", value,
                           ", outside model.vocab's 0..", vocab - 1, "; ", fix));
}

Dataset parseCifar(const std::string& bytes, const std::string& source, int64_t label_bytes,
                   int64_t classes) {
  const int64_t pixels = 3 * 32 * 32;
  const int64_t record = label_bytes + pixels;
  const int64_t size = static_cast<int64_t>(bytes.size());
  if (size == 0 || size % record != 0) {
    throw ConfigError(strCat(source, ": ", size, " bytes is not a whole number of ", record,
                             "-byte CIFAR records (", label_bytes, " label byte(s) + 3072 pixels); "
                             "the record at offset ", (size / record) * record,
                             " is truncated or the file is not CIFAR binary"));
  }
  const int64_t n = size / record;
  auto x = at::empty({n, 3, 32, 32}, at::kByte);
  auto y = at::empty({n}, at::kLong);
  auto* xp = x.data_ptr<uint8_t>();
  auto* yp = y.data_ptr<int64_t>();
  for (int64_t i = 0; i < n; ++i) {
    const auto* rec = reinterpret_cast<const uint8_t*>(bytes.data()) + i * record;
    const int64_t label = rec[label_bytes - 1];
    if (label >= classes) {
      throw ConfigError(strCat(source, ": offset ", i * record + label_bytes - 1, ": label ", label,
                               " is outside 0..", classes - 1,
                               " (CIFAR-10 has 1 label byte, CIFAR-100 2: coarse, fine)"));
    }
    yp[i] = label;
    std::memcpy(xp + i * pixels, rec + label_bytes, pixels);
  }
  Dataset d{x, y, {3, 32, 32}, classes};
  d.x_scale = 1.0 / 255.0;
  return d;
}

namespace {

uint32_t bigEndian32(const std::string& b, std::size_t off) {
  const auto* p = reinterpret_cast<const uint8_t*>(b.data()) + off;
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | p[3];
}

}  // namespace

Dataset parseIdx(const std::string& images, const std::string& image_source,
                 const std::string& labels, const std::string& label_source) {
  if (images.size() < 16 || bigEndian32(images, 0) != 0x00000803) {
    throw ConfigError(strCat(image_source, ": offset 0: expected the idx3-ubyte magic 0x00000803 "
                             "(unsigned bytes, 3 dimensions); is the file gzipped? unpack it first"));
  }
  if (labels.size() < 8 || bigEndian32(labels, 0) != 0x00000801) {
    throw ConfigError(strCat(label_source, ": offset 0: expected the idx1-ubyte magic 0x00000801"));
  }
  const int64_t n = bigEndian32(images, 4);
  const int64_t rows = bigEndian32(images, 8);
  const int64_t cols = bigEndian32(images, 12);
  if (n == 0 || rows == 0 || cols == 0) {
    throw ConfigError(strCat(image_source, ": offset 4: the header declares ", n, " images of ",
                             rows, "x", cols, " pixels; a data set needs at least one image of at "
                             "least 1x1"));
  }
  // Each factor < 2^32, so the product needs 96 bits; it is compared with the
  // file size before anything is allocated.
  const unsigned __int128 want = 16 + static_cast<unsigned __int128>(n) * rows * cols;
  if (static_cast<unsigned __int128>(images.size()) != want) {
    throw ConfigError(strCat(image_source, ": header says ", n, " images of ", rows, "x", cols,
                             " (", (want >> 64) != 0 ? std::string("over 2^64") : std::to_string(static_cast<uint64_t>(want)),
                             " bytes), but the file has ",
                             images.size(), " bytes",
                             static_cast<unsigned __int128>(images.size()) < want ? " (truncated)" : ""));
  }
  const int64_t nl = bigEndian32(labels, 4);
  if (nl != n) {
    throw ConfigError(strCat(label_source, ": offset 4: ", nl, " labels for ", n, " images in ",
                             image_source));
  }
  if (static_cast<int64_t>(labels.size()) != 8 + n) {
    throw ConfigError(strCat(label_source, ": expected ", 8 + n, " bytes, found ", labels.size(),
                             static_cast<int64_t>(labels.size()) < 8 + n ? " (truncated)" : ""));
  }
  auto x = at::empty({n, 1, rows, cols}, at::kByte);
  std::memcpy(x.data_ptr<uint8_t>(), images.data() + 16, n * rows * cols);
  auto y = at::empty({n}, at::kLong);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t label = static_cast<uint8_t>(labels[8 + i]);
    if (label > 9) {
      throw ConfigError(strCat(label_source, ": offset ", 8 + i, ": label ", label,
                               " is outside 0..9"));
    }
    y.data_ptr<int64_t>()[i] = label;
  }
  Dataset d{x, y, {1, rows, cols}, 10};
  d.x_scale = 1.0 / 255.0;
  return d;
}

namespace {

Dataset loadDigits(const DataConfig& cfg, const std::string& base_dir, std::string* origin) {
  if (cfg.path.empty()) {
    *origin = "embedded digits (UCI optical digits, 1797 samples)";
    return parseCsv(embeddedDigitsCsv(), "embedded digits.csv", 10, {1, 8, 8}, 1.0 / 16.0);
  }
  const auto path = resolvePath(cfg.path, base_dir);
  *origin = path;
  return parseCsv(readFile(path), path, 10, {1, 8, 8}, 1.0 / 16.0);
}

/// data.path: the directory of the binary version (data_batch_1..5.bin +
/// test_batch.bin, or train.bin + test.bin for CIFAR-100). The test file is the
/// validation set. Nothing is downloaded.
DataSplit loadCifar(const DataConfig& cfg, const std::string& base_dir) {
  const auto dir = resolvePath(cfg.path, base_dir);
  const bool ten = cfg.name == DataName::kCifar10;
  const int64_t label_bytes = ten ? 1 : 2;
  const int64_t classes = ten ? 10 : 100;
  std::vector<Dataset> parts;
  const std::vector<std::string> train_files =
      ten ? std::vector<std::string>{"data_batch_1.bin", "data_batch_2.bin", "data_batch_3.bin",
                                     "data_batch_4.bin", "data_batch_5.bin"}
          : std::vector<std::string>{"train.bin"};
  for (const auto& f : train_files) {
    const auto path = fileIn(dir, f);
    parts.push_back(parseCifar(readFile(path), path, label_bytes, classes));
  }
  const auto test_path = fileIn(dir, ten ? "test_batch.bin" : "test.bin");
  DataSplit split;
  split.origin = strCat(toString(cfg.name), " binary in ", dir);
  split.train = concat(parts);
  split.val = parseCifar(readFile(test_path), test_path, label_bytes, classes);
  return split;
}

/// data.path: the directory of the four unpacked idx files (MNIST or Fashion-MNIST).
DataSplit loadMnist(const DataConfig& cfg, const std::string& base_dir) {
  const auto dir = resolvePath(cfg.path, base_dir);
  auto pair = [&](const std::string& prefix) {
    const auto images = fileIn(dir, prefix + "-images-idx3-ubyte");
    const auto labels = fileIn(dir, prefix + "-labels-idx1-ubyte");
    return parseIdx(readFile(images), images, readFile(labels), labels);
  };
  DataSplit split;
  split.origin = "idx files in " + dir;
  split.train = pair("train");
  split.val = pair("t10k");
  return split;
}

/// Seeded split of `all` into train and validation: the same on every rank,
/// whatever the world size.
/// Splits `all` (from split->origin, named in errors) into train and validation.
void splitSeeded(const Dataset& all, double val_fraction, int64_t seed, DataSplit* split) {
  const int64_t n = all.size();
  const int64_t n_val = valCount(n, val_fraction);
  if (n - n_val < 2) {
    throw ConfigError(strCat(split->origin, ": holds ", n, n == 1 ? " sample" : " samples",
                             n_val > 0 ? strCat(", and data.val_fraction: ", val_fraction,
                                                " keeps ", n_val, " for validation")
                                       : std::string(),
                             "; training needs at least 2: add samples",
                             n_val > 0 ? ", or lower data.val_fraction" : ""));
  }
  const auto perm = seededPermutation(n, static_cast<uint64_t>(seed), -1);
  std::vector<int64_t> val_rows(perm.begin(), perm.begin() + n_val);
  std::vector<int64_t> train_rows(perm.begin() + n_val, perm.end());
  split->train = subset(all, train_rows);
  split->val = n_val > 0 ? subset(all, val_rows) : Dataset{};
  split->val.sample_shape = all.sample_shape;
  split->val.classes = all.classes;
  split->val.x_scale = all.x_scale;
}


/// Labels as an int64 tensor; classes = the largest + 1 (at least 2).
at::Tensor labelTensor(const std::vector<int64_t>& labels) {
  return at::tensor(labels, at::kLong);
}

/// A decoded source's Dataset: 3 x size x size uint8 samples, labels in memory.
Dataset decodedSet(std::shared_ptr<const Source> source, const std::vector<int64_t>& labels,
                   int64_t classes, const DataConfig& cfg) {
  Dataset d;
  d.source = std::move(source);
  d.target = labelTensor(labels);
  d.sample_shape = {3, cfg.image_size, cfg.image_size};
  d.classes = classes;
  d.x_scale = 1.0 / 255.0;
  return d;
}

std::string runHere(const std::function<std::string()>& fn) { return fn(); }

/// Rank 0 makes the text, every rank gets it (DataContext::from_rank0).
std::string fromRank0(const DataContext& ctx, const std::function<std::string()>& fn) {
  return ctx.from_rank0 ? ctx.from_rank0(fn) : runHere(fn);
}

uint64_t fnv1a(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (const unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

/// Note [image list cache]: rank 0 walks the folder once and keeps the list next to
/// the outputs, keyed by the folder's path; it is reused while every directory it
/// walked keeps its modification time (a file added or removed changes its
/// directory's), so a second run on 1.28 M files stats ~1000 folders instead.
std::string imageListText(const std::string& root, const DataContext& ctx) {
  namespace fs = std::filesystem;
  std::string cache;
  if (!ctx.cache_dir.empty()) {
    std::error_code ec;
    const auto abs = fs::absolute(root, ec).lexically_normal().string();
    char name[64];
    std::snprintf(name, sizeof name, "image_folder-%016llx.list",
                  static_cast<unsigned long long>(fnv1a(abs)));
    cache = (fs::path(ctx.cache_dir) / name).string();
    if (fs::exists(cache, ec)) {
      try {
        auto text = readFileBounded(cache, std::uintmax_t{4} << 30, "image list cache");
        const auto list = parseImageList(text, cache);
        if (imageListCurrent(list, root)) {
          if (ctx.note) ctx.note(strCat("data: image list from ", cache, " (the folder is unchanged)"));
          return text;
        }
      } catch (const Error&) {
        // A damaged or stale cache is rebuilt.
      }
    }
  }
  const double t0 = monotonicSeconds();
  const auto list = walkImageFolder(root);
  auto text = serializeImageList(list);
  if (ctx.note) {
    ctx.note(strCat("data: listed ", root, " in ", strCat(std::lround((monotonicSeconds() - t0) * 1000)),
                    " ms: ", list.train.size(), " train / ", list.val.size(), " val images, ",
                    list.classes.size(), " classes", list.skipped ? strCat(", ", list.skipped, " other files skipped") : ""));
  }
  if (!cache.empty()) {
    std::error_code ec;
    fs::create_directories(ctx.cache_dir, ec);
    try {
      writeFileAtomic(cache, text);  // Note [atomic writes]
    } catch (const Error&) {
      // best effort: a run does not need its cache
    }
  }
  return text;
}

std::vector<int64_t> labelsOf(const std::vector<ImageEntry>& entries) {
  std::vector<int64_t> out;
  out.reserve(entries.size());
  for (const auto& e : entries) out.push_back(e.label);
  return out;
}

/// Note [class count] for labels read from files (`what` names them in the
/// warning about classes without a sample, given to rank 0's ctx.warn).
int64_t headClasses(const std::vector<int64_t>& labels, const DataConfig& cfg,
                    const std::function<std::string(int64_t)>& where, const std::string& what,
                    const DataContext& ctx) {
  std::vector<int64_t> empty;
  const int64_t classes = classCount(labels, cfg.classes_given ? cfg.classes : 0, where, &empty);
  if (!empty.empty() && ctx.warn) {
    const bool one = empty.size() == 1;
    ctx.warn(strCat("data: class", one ? " " : "es ", classListText(empty), " of 0..", classes - 1,
                    one ? " has" : " have", " no sample in ", what, " (", classes - empty.size(),
                    " of ", classes, " classes used); the head has ", classes,
                    " outputs. Fix the labels, or set data.classes: ", classes,
                    " if that is intended"));
  }
  return classes;
}

/// Note [each file once]: what the walk found named like an image but not a
/// regular file becomes a data error (and a warning on rank 0).
std::vector<DataErrorRecord> walkErrors(const ImageList& list, const std::string& root,
                                        const DataContext& ctx) {
  std::vector<DataErrorRecord> out;
  for (const auto& b : list.bad) {
    out.push_back({root + "/" + b.path, strCat(b.kind, ", not a regular file: not a sample"), -1});
  }
  if (ctx.warn) {
    for (std::size_t i = 0; i < out.size() && i < kErrorsListed; ++i) {
      ctx.warn(strCat("data: skipping ", out[i].where, ": ", out[i].reason));
    }
    if (out.size() > kErrorsListed) {
      ctx.warn(strCat("data: ", out.size() - kErrorsListed, " more such files; report.json's "
                      "data_errors counts them all"));
    }
  }
  return out;
}

/// data.list: "relative/path label" lines, classes from the labels (or data.classes).
DataSplit loadImageList(const DataConfig& cfg, int64_t seed, const std::string& base_dir,
                        const DataContext& ctx) {
  DataSplit split;
  const auto list_path = resolvePath(cfg.list, base_dir);
  const auto root = cfg.path.empty() ? std::filesystem::path(list_path).parent_path().string()
                                     : resolvePath(cfg.path, base_dir);
  int64_t max_classes = 0;
  auto entries = readImageList(list_path, &max_classes, cfg.list_outside_root);
  const auto labels = labelsOf(entries);
  const auto where = [&](int64_t i) { return strCat(list_path, ":", entries[i].line); };
  const auto classes = headClasses(labels, cfg, where, list_path, ctx);
  split.origin = strCat("image list ", list_path, " (images under ", root, ")");
  const auto all = decodedSet(imageFileSource(root, std::move(entries)), labels, classes, cfg);
  splitSeeded(all, cfg.val_fraction, seed, &split);
  return split;
}

DataSplit loadImageFolder(const DataConfig& cfg, int64_t seed, const std::string& base_dir,
                          const DataContext& ctx) {
  if (!cfg.list.empty()) return loadImageList(cfg, seed, base_dir, ctx);
  DataSplit split;
  const auto root = resolvePath(cfg.path, base_dir);
  const auto text = fromRank0(ctx, [&] { return imageListText(root, ctx); });
  auto list = parseImageList(text, "the image list of " + root);
  auto classes = static_cast<int64_t>(list.classes.size());
  if (cfg.classes_given) {
    if (cfg.classes < classes) {
      throw ConfigError(strCat("data.classes: ", cfg.classes, " is below the ", classes,
                               " class folders of ", root, "/train; raise it, or remove it (the "
                               "folders decide)"));
    }
    classes = cfg.classes;
  }
  split.origin = strCat("image folder ", root, " (", classes, " classes)");
  split.skipped_files = list.skipped;
  split.bad_files = walkErrors(list, root, ctx);
  const auto train_labels = labelsOf(list.train);
  const auto train = decodedSet(imageFileSource(root, std::move(list.train)), train_labels,
                                std::max<int64_t>(classes, 2), cfg);
  if (list.has_val) {
    const auto val_labels = labelsOf(list.val);
    split.train = train;
    split.val = decodedSet(imageFileSource(root, std::move(list.val)), val_labels,
                           std::max<int64_t>(classes, 2), cfg);
  } else {
    splitSeeded(train, cfg.val_fraction, seed, &split);
  }
  return split;
}

/// The shards' index as text (rank 0 indexes, the others parse): one line per
/// shard ("S path skipped"), then one per sample ("offset size label key member").
std::string tarIndexText(const std::vector<std::string>& paths) {
  std::ostringstream out;
  for (const auto& p : paths) {
    const auto shard = indexTar(p);
    out << "S\t" << shard.skipped_members << '\t' << shard.path << '\n';
    for (const auto& x : shard.samples) {
      out << x.image_offset << '\t' << x.image_size << '\t' << x.label << '\t' << x.key << '\t'
          << x.image_member << '\n';
    }
  }
  return out.str();
}

std::vector<TarShard> parseTarIndex(const std::string& text) {
  std::vector<TarShard> shards;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    std::vector<std::string> f;
    std::size_t pos = 0;
    for (int k = 0; k < 4; ++k) {
      const auto tab = line.find('\t', pos);
      if (tab == std::string::npos) break;
      f.push_back(line.substr(pos, tab - pos));
      pos = tab + 1;
      if (f.size() == 2 && f[0] == "S") break;
    }
    f.push_back(line.substr(pos));
    if (f[0] == "S") {
      shards.emplace_back();
      shards.back().skipped_members = std::stoll(f[1]);
      shards.back().path = f[2];
    } else {
      TarSample x;
      x.image_offset = std::stoll(f[0]);
      x.image_size = std::stoll(f[1]);
      x.label = std::stoll(f[2]);
      x.key = f[3];
      x.image_member = f[4];
      shards.back().samples.push_back(std::move(x));
    }
  }
  return shards;
}

struct TarSet {
  std::shared_ptr<const Source> source;
  std::vector<int64_t> labels;
  int64_t skipped = 0;
  std::vector<TarShard> shards;
};

TarSet loadShards(const std::string& pattern, const DataContext& ctx) {
  const auto text = fromRank0(ctx, [&] {
    const double t0 = monotonicSeconds();
    auto t = tarIndexText(expandShards(pattern));
    if (ctx.note) {
      ctx.note(strCat("data: indexed ", pattern, " in ",
                      std::lround((monotonicSeconds() - t0) * 1000), " ms (headers only)"));
    }
    return t;
  });
  TarSet set;
  set.shards = parseTarIndex(text);
  for (const auto& shard : set.shards) {
    set.skipped += shard.skipped_members;
    for (const auto& x : shard.samples) {
      set.labels.push_back(x.label);
    }
  }
  if (set.labels.empty()) throw ConfigError(strCat("data.path: ", pattern, ": the shards hold no samples"));
  return set;
}

DataSplit loadWebdataset(const DataConfig& cfg, int64_t seed, const std::string& base_dir,
                         const DataContext& ctx) {
  DataSplit split;
  const auto pattern = resolvePath(cfg.path, base_dir);
  auto train = loadShards(pattern, ctx);
  const auto where = [&](int64_t i) {
    for (const auto& shard : train.shards) {
      const auto n = static_cast<int64_t>(shard.samples.size());
      if (i < n) return strCat(shard.path, " member ", shard.samples[i].key, ".cls");
      i -= n;
    }
    return std::string("?");
  };
  const int64_t classes = headClasses(train.labels, cfg, where, pattern, ctx);
  split.origin = strCat("webdataset ", pattern, " (", train.shards.size(), " shard(s), ", classes,
                        " classes)");
  split.skipped_files = train.skipped;
  const auto all = decodedSet(tarSource(train.shards), train.labels, classes, cfg);
  if (cfg.val_path.empty()) {
    splitSeeded(all, cfg.val_fraction, seed, &split);
    return split;
  }
  const auto val_pattern = resolvePath(cfg.val_path, base_dir);
  auto val = loadShards(val_pattern, ctx);
  for (const auto& shard : val.shards) {
    for (const auto& x : shard.samples) {
      if (x.label >= classes) {
        throw ConfigError(strCat(shard.path, ": member ", x.key, ".cls: label ", x.label,
                                 " is outside ",
                                 cfg.classes_given ? "data.classes' " : "the training shards' ",
                                 "classes 0..", classes - 1));
      }
    }
  }
  split.train = all;
  split.val = decodedSet(tarSource(val.shards), val.labels, classes, cfg);
  return split;
}

/// y.npy's values as a tensor: int32/int64 labels (int64), or float32/float64
/// targets of regression (float32, N or N x k: Note [task choice]). For a module's
/// own loss (`module_targets`, Note [module loss]) any shape N x ..., integers as
/// int64 (not labels: no range), floats as float32.
at::Tensor npyTargets(const NpyArray& y, const std::string& y_path, int64_t n, bool module_targets) {
  if (y.type == NpyType::kFloat32 || y.type == NpyType::kFloat64) {
    if (!module_targets && y.shape.size() != 1 && y.shape.size() != 2) {
      throw ConfigError(strCat(y_path, ": expected N float targets or N x k, got shape ",
                               shapeText(y.shape)));
    }
    auto t = at::from_blob(const_cast<uint8_t*>(y.data), y.shape,
                           at::TensorOptions().dtype(y.type == NpyType::kFloat32 ? at::kFloat
                                                                                 : at::kDouble))
                 .to(at::kFloat, /*non_blocking=*/false, /*copy=*/true);
    if (!at::isfinite(t).all().item<bool>()) {
      const auto bad = at::nonzero(at::logical_not(at::isfinite(t)))[0][0].item<int64_t>();
      throw ConfigError(strCat(y_path, ": target of sample ", bad, " is not finite (NaN or inf)"));
    }
    return t;
  }
  if (module_targets) {
    return at::from_blob(const_cast<uint8_t*>(y.data), y.shape,
                         at::TensorOptions().dtype(y.type == NpyType::kInt32 ? at::kInt : at::kLong))
        .to(at::kLong, /*non_blocking=*/false, /*copy=*/true);
  }
  if (y.shape.size() != 1) {
    throw ConfigError(strCat(y_path, ": expected a 1-D array of N labels, got shape ",
                             shapeText(y.shape)));
  }
  std::vector<int64_t> labels(n);
  for (int64_t i = 0; i < n; ++i) {
    int64_t v = 0;
    if (y.type == NpyType::kInt32) {
      int32_t t;
      std::memcpy(&t, y.data + 4 * i, 4);
      v = t;
    } else {
      std::memcpy(&v, y.data + 8 * i, 8);
    }
    if (v < 0 || v >= (int64_t{1} << 24)) {
      throw ConfigError(strCat(y_path, ": label ", v, " of sample ", i,
                               " is outside 0..", (int64_t{1} << 24) - 1));
    }
    labels[i] = v;
  }
  return at::tensor(labels, at::kLong);
}

/// x.npy (N x ..., uint8/float16/float32) and y.npy (N, int32/int64 labels; or N
/// or N x k, float32/float64 targets; a module's own loss: any N x ...), mapped.
Dataset loadNpyPair(const std::string& x_path, const std::string& y_path, bool module_targets) {
  auto x = mapNpy(x_path, {NpyType::kUint8, NpyType::kFloat16, NpyType::kFloat32});
  auto y = mapNpy(y_path, {NpyType::kInt32, NpyType::kInt64, NpyType::kFloat32, NpyType::kFloat64});
  if (x.shape.empty() || x.shape[0] < 1) {
    throw ConfigError(strCat(x_path, ": expected N x ... samples (at least one), got shape ",
                             shapeText(x.shape)));
  }
  if (y.shape.empty() || y.shape[0] != x.shape[0]) {
    throw ConfigError(strCat(y_path, ": ", y.shape.empty() ? 0 : y.shape[0], " labels for ",
                             x.shape[0], " samples in ", x_path));
  }
  const int64_t n = x.shape[0];
  const auto dtype = x.type == NpyType::kUint8     ? at::kByte
                     : x.type == NpyType::kFloat16 ? at::kHalf
                                                   : at::kFloat;
  auto keep = x.mapping;
  Dataset d;
  d.x = at::from_blob(const_cast<uint8_t*>(x.data), x.shape, [keep](void*) mutable { keep.reset(); },
                      at::TensorOptions().dtype(dtype));
  d.mapped = true;
  d.target = npyTargets(y, y_path, n, module_targets);
  d.sample_shape.assign(x.shape.begin() + 1, x.shape.end());
  if (d.sample_shape.empty()) d.sample_shape = {1};
  d.x = d.x.view([&] {
    std::vector<int64_t> full{n};
    full.insert(full.end(), d.sample_shape.begin(), d.sample_shape.end());
    return full;
  }());
  d.classes = 0;  // Note [class count]: loadNpy decides, over both splits
  if (x.type == NpyType::kUint8) d.x_scale = 1.0 / 255.0;
  return d;
}

std::vector<int64_t> labelVector(const at::Tensor& y) {
  const auto* p = y.data_ptr<int64_t>();
  return std::vector<int64_t>(p, p + y.numel());
}

/// Note [class count] over y.npy then val_y.npy (absent: undefined `val_y`).
int64_t npyClasses(const DataConfig& cfg, const std::string& dir, const at::Tensor& y,
                   const at::Tensor& val_y, const DataContext& ctx) {
  if (ctx.module_targets) {
    // Note [module loss]: the module's targets as they are: no classes; both files alike.
    const auto what = [](const at::Tensor& t) {
      const std::vector<int64_t> row(t.sizes().begin() + 1, t.sizes().end());
      return strCat(t.is_floating_point() ? "float" : "integer", " targets of shape ",
                    shapeText(row), " per sample");
    };
    if (val_y.defined() && what(val_y) != what(y)) {
      throw ConfigError(strCat(fileIn(dir, "val_y.npy"), ": ", what(val_y), ", but y.npy has ",
                               what(y), "; give both alike"));
    }
    return 0;
  }
  if (y.is_floating_point() || (val_y.defined() && val_y.is_floating_point())) {
    // Regression targets (Note [task choice]): no classes; both files alike.
    const auto what = [](const at::Tensor& t) {
      if (!t.is_floating_point()) return std::string("integer labels");
      const int64_t k = t.dim() == 1 ? 1 : t.size(1);
      return strCat(k, " float target", k == 1 ? "" : "s", " per sample");
    };
    if (val_y.defined() && what(val_y) != what(y)) {
      throw ConfigError(strCat(fileIn(dir, "val_y.npy"), ": ", what(val_y), ", but y.npy has ", what(y),
                               "; give both alike"));
    }
    return 0;
  }
  auto labels = labelVector(y);
  const auto n = static_cast<int64_t>(labels.size());
  if (val_y.defined()) {
    const auto v = labelVector(val_y);
    labels.insert(labels.end(), v.begin(), v.end());
  }
  const auto where = [&](int64_t i) {
    return i < n ? strCat(fileIn(dir, "y.npy"), " row ", i)
                 : strCat(fileIn(dir, "val_y.npy"), " row ", i - n);
  };
  const auto what = val_y.defined() ? dir + "/{y,val_y}.npy" : fileIn(dir, "y.npy");
  return headClasses(labels, cfg, where, what, ctx);
}

/// Note [tokens]: the windows of a mapped token file, views of it.
Dataset tokenWindows(const TokenFile& f, const DataConfig& cfg) {
  const auto dtype = f.type == TokenType::kUint16  ? at::kShort
                     : f.type == TokenType::kInt32 ? at::kInt
                                                   : at::kLong;
  auto keep = f.mapping;
  const auto flat = at::from_blob(const_cast<uint8_t*>(f.data), {f.count},
                                  [keep](void*) mutable { keep.reset(); },
                                  at::TensorOptions().dtype(dtype));
  const int64_t t = cfg.seq_len, n = (f.count - 1) / t;
  Dataset d;
  d.x = flat.as_strided({n, t}, {t, 1}, 0);
  d.target = flat.as_strided({n, t}, {t, 1}, 1);
  d.sample_shape = {t};
  d.classes = cfg.vocab;  // the head: one logit per token id (Note [task choice])
  d.mapped = true;
  auto source = std::make_shared<TokenSource>();
  source->path = f.path;
  source->vocab = cfg.vocab;
  source->header_bytes = f.header_bytes;
  source->item_bytes = f.itemBytes();
  d.tokens = std::move(source);
  return d;
}

/// Windows [begin, begin + n) of a token set: narrowed views, nothing copied.
Dataset windowsOf(const Dataset& all, int64_t begin, int64_t n) {
  Dataset d = all;
  d.x = all.x.narrow(0, begin, n);
  d.target = all.target.narrow(0, begin, n);
  return d;
}

/// data.name: tokens (Note [tokens]): data.path's windows; validation is
/// data.val_path's, or else the last data.val_fraction of them, contiguous.
DataSplit loadTokens(const DataConfig& cfg, const std::string& base_dir) {
  const int64_t window = cfg.seq_len + 1;
  const auto path = resolvePath(cfg.path, base_dir);
  const TokenFile file = mapTokens(path, "data.path", window);
  auto all = tokenWindows(file, cfg);
  DataSplit split;
  split.origin = strCat("tokens ", path, " (", file.count, " ", toString(file.type), " tokens, ",
                        all.size(), " windows of ", cfg.seq_len, " + 1, memory-mapped)");
  if (!cfg.val_path.empty()) {
    const auto val_path = resolvePath(cfg.val_path, base_dir);
    split.train = std::move(all);
    split.val = tokenWindows(mapTokens(val_path, "data.val_path", window), cfg);
    split.origin += strCat("; validation ", val_path, " (", split.val.size(), " windows)");
    return split;
  }
  const int64_t n = all.size(), n_val = valCount(n, cfg.val_fraction);
  if (n - n_val < 1) {
    throw ConfigError(strCat(path, ": ", n, " window(s) of model.seq_len + 1 = ", window,
                             " tokens, and data.val_fraction: ", cfg.val_fraction, " keeps ", n_val,
                             " for validation; training needs at least one: give more tokens or "
                             "data.val_path, or lower data.val_fraction or model.seq_len"));
  }
  split.train = windowsOf(all, 0, n - n_val);
  if (n_val > 0) {
    split.val = windowsOf(all, n - n_val, n_val);
  } else {
    split.val.sample_shape = all.sample_shape;
    split.val.classes = all.classes;
  }
  split.origin += strCat("; validation: the last ", n_val, " windows");
  return split;
}

DataSplit loadNpy(const DataConfig& cfg, int64_t seed, const std::string& base_dir,
                  const DataContext& ctx) {
  const auto dir = resolvePath(cfg.path, base_dir);
  DataSplit split;
  auto all = loadNpyPair(fileIn(dir, "x.npy"), fileIn(dir, "y.npy"), ctx.module_targets);
  const auto type = all.x.scalar_type() == at::kByte   ? "uint8"
                    : all.x.scalar_type() == at::kHalf ? "float16"
                                                       : "float32";
  split.origin = strCat("npy arrays in ", dir, " (", shapeText(all.sample_shape), " ", type,
                        " per sample, memory-mapped)");
  const bool has_val_x = std::filesystem::exists(fileIn(dir, "val_x.npy"));
  const bool has_val_y = std::filesystem::exists(fileIn(dir, "val_y.npy"));
  if (has_val_x != has_val_y) {
    throw ConfigError(strCat(dir, ": found ", has_val_x ? "val_x.npy without val_y.npy"
                                                       : "val_y.npy without val_x.npy",
                             "; give both or neither"));
  }
  if (!has_val_x) {
    all.classes = npyClasses(cfg, dir, all.target, at::Tensor(), ctx);
    splitSeeded(all, cfg.val_fraction, seed, &split);
    return split;
  }
  auto val = loadNpyPair(fileIn(dir, "val_x.npy"), fileIn(dir, "val_y.npy"), ctx.module_targets);
  if (val.sample_shape != all.sample_shape) {
    throw ConfigError(strCat(fileIn(dir, "val_x.npy"), ": samples of shape ",
                             shapeText(val.sample_shape), ", but x.npy's are ",
                             shapeText(all.sample_shape)));
  }
  if (val.x.scalar_type() != all.x.scalar_type()) {
    throw ConfigError(strCat(fileIn(dir, "val_x.npy"), ": element type differs from x.npy's"));
  }
  all.classes = val.classes = npyClasses(cfg, dir, all.target, val.target, ctx);
  split.train = all;
  split.val = val;
  return split;
}
}  // namespace

namespace {

/// Note [program data]: one part of the program's data set as a Dataset.
Dataset programPart(const ProgramData::Part& part, const char* which) {
  Dataset d;
  d.as_given = true;
  if (part.source) {
    d.examples = part.source;
    if (d.size() > 0) d.sample_shape = d.batch({0}).first.sizes().slice(1).vec();
  } else {
    if (!part.target.defined() || part.x.dim() == 0 || part.target.dim() == 0 ||
        part.x.size(0) != part.target.size(0)) {
      throw ConfigError(strCat(
          "data.name: program: the ", which, " tensors hold x of shape ", shapeText(part.x.sizes().vec()),
          " and target of shape ",
          part.target.defined() ? shapeText(part.target.sizes().vec()) : std::string("(undefined)"),
          "; both need the samples first, as many of each"));
    }
    d.x = part.x.contiguous();
    d.target = part.target.contiguous();
    d.sample_shape = d.x.sizes().slice(1).vec();
  }
  return d;
}

/// data.name: program: the given training and validation sets, or (no
/// validation set) the training set in `all`, to be split like any source's.
DataSplit loadProgramData(const DataConfig& cfg, Dataset* all) {
  if (!cfg.program || !cfg.program->train.given()) throw ConfigError(programOnlyMessage("data.name"));
  DataSplit split;
  split.origin = "the program's data set";
  Dataset train = programPart(cfg.program->train, "training");
  if (!cfg.program->val.given()) {  // held out by data.val_fraction, as for every source
    *all = std::move(train);
    return split;
  }
  split.train = std::move(train);
  split.val = programPart(cfg.program->val, "validation");
  if (split.train.size() < 2) {
    throw ConfigError(strCat("data.name: program: the training set holds ", split.train.size(),
                             " samples; training needs at least 2"));
  }
  return split;
}

}  // namespace

DataSplit loadData(const DataConfig& cfg, int64_t seed, const std::string& base_dir,
                   const DataContext& ctx) {
  DataSplit split;
  Dataset all;
  switch (cfg.name) {
    case DataName::kImageFolder:
      split = loadImageFolder(cfg, seed, base_dir, ctx);
      break;
    case DataName::kWebdataset:
      split = loadWebdataset(cfg, seed, base_dir, ctx);
      break;
    case DataName::kNpy:
      split = loadNpy(cfg, seed, base_dir, ctx);
      break;
    case DataName::kTokens:
      split = loadTokens(cfg, base_dir);
      break;
    case DataName::kCifar10:
    case DataName::kCifar100:
      split = loadCifar(cfg, base_dir);
      break;
    case DataName::kMnist:
      split = loadMnist(cfg, base_dir);
      break;
    case DataName::kDigits:
      all = loadDigits(cfg, base_dir, &split.origin);
      break;
    case DataName::kCsv: {
      const auto path = resolvePath(cfg.path, base_dir);
      split.origin = path;
      all = parseCsv(readFile(path), path, cfg.classes, cfg.shape);
      break;
    }
    case DataName::kSyntheticImages:
      split.origin = strCat("synthetic images ", cfg.samples, " x ", shapeText(cfg.shape), ", ",
                            cfg.classes, " classes");
      all = syntheticImages(cfg, seed);
      break;
    case DataName::kSynthetic:
      split.origin = strCat("synthetic ", cfg.samples, " x ", shapeText(cfg.shape), ", ",
                            cfg.classes, " classes");
      all = synthetic(cfg, seed);
      break;
    case DataName::kProgram:
      split = loadProgramData(cfg, &all);
      break;
  }
  split.name = toString(cfg.name);
  if (all.target.defined() || all.examples) splitSeeded(all, cfg.val_fraction, seed, &split);
  return split;
}

int64_t valCount(int64_t n, double val_fraction) {
  return static_cast<int64_t>(std::llround(static_cast<double>(n) * val_fraction));
}

DataInfo describeData(const DataConfig& cfg, int64_t seed, const std::string& base_dir,
                      const DataContext& ctx) {
  if (cfg.name == DataName::kSynthetic || cfg.name == DataName::kSyntheticImages) {
    const int64_t n_val = valCount(cfg.samples, cfg.val_fraction);
    return {cfg.samples - n_val, n_val, cfg.shape, cfg.classes};
  }
  const auto split = loadData(cfg, seed, base_dir, ctx);
  return {split.train.size(), split.val.size(), split.train.sample_shape, split.train.classes};
}

}  // namespace batchdist::worker
