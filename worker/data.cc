#include "worker/data.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <numeric>
#include <sstream>

#include "collective/error.h"
#include "worker/plan.h"

extern "C" const char batchdist_digits_begin[];
extern "C" const char batchdist_digits_end[];

namespace batchdist::worker {
namespace {

int64_t product(const std::vector<int64_t>& v) {
  return std::accumulate(v.begin(), v.end(), int64_t{1}, std::multiplies<int64_t>());
}

std::string shapeText(const std::vector<int64_t>& v) {
  std::string s = "[";
  for (std::size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}

std::string readFile(const std::string& path, const char* key) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    throw ConfigError(strCat(key, ": cannot open data file '", path, "' (", std::strerror(errno),
                             ")"));
  }
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string resolvePath(const std::string& path, const std::string& base_dir) {
  if (path.empty() || path[0] == '/' || base_dir.empty()) return path;
  return base_dir + "/" + path;
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
  return {d.x.index_select(0, idx).contiguous(), d.y.index_select(0, idx).contiguous(),
          d.sample_shape, d.classes};
}

DataSplit loadData(const DataConfig& cfg, int64_t seed, const std::string& base_dir) {
  DataSplit split;
  split.name = cfg.name;
  Dataset all;
  if (cfg.name == "digits") {
    if (cfg.path.empty()) {
      split.origin = "embedded digits (UCI optical digits, 1797 samples)";
      all = parseCsv(embeddedDigitsCsv(), "embedded digits.csv", 10, {1, 8, 8}, 1.0 / 16.0);
    } else {
      const auto path = resolvePath(cfg.path, base_dir);
      split.origin = path;
      all = parseCsv(readFile(path, "data.path"), path, 10, {1, 8, 8}, 1.0 / 16.0);
    }
  } else if (cfg.name == "csv") {
    if (cfg.path.empty()) {
      throw ConfigError("data.path: data.name: csv needs a path to a CSV file (numeric features, "
                        "then an integer label per line)");
    }
    const auto path = resolvePath(cfg.path, base_dir);
    split.origin = path;
    all = parseCsv(readFile(path, "data.path"), path, cfg.classes, cfg.shape);
  } else {
    split.origin = strCat("synthetic ", cfg.samples, " x ", shapeText(cfg.shape), ", ",
                          cfg.classes, " classes");
    all = synthetic(cfg, seed);
  }

  // Seeded split: the same on every rank, whatever the world size.
  const int64_t n = all.size();
  const int64_t n_val = valCount(n, cfg.val_fraction);
  if (n - n_val < 2) {
    throw ConfigError(strCat("data.val_fraction: ", cfg.val_fraction, " leaves ", n - n_val,
                             " of ", n, " samples for training"));
  }
  const auto perm = seededPermutation(n, static_cast<uint64_t>(seed), -1);
  std::vector<int64_t> val_rows(perm.begin(), perm.begin() + n_val);
  std::vector<int64_t> train_rows(perm.begin() + n_val, perm.end());
  split.train = subset(all, train_rows);
  split.val = n_val > 0 ? subset(all, val_rows) : Dataset{};
  split.val.sample_shape = all.sample_shape;
  split.val.classes = all.classes;
  return split;
}

int64_t valCount(int64_t n, double val_fraction) {
  return static_cast<int64_t>(std::llround(static_cast<double>(n) * val_fraction));
}

DataInfo describeData(const DataConfig& cfg, int64_t seed, const std::string& base_dir) {
  if (cfg.name == "synthetic") {
    const int64_t n_val = valCount(cfg.samples, cfg.val_fraction);
    return {cfg.samples - n_val, n_val, cfg.shape, cfg.classes};
  }
  const auto split = loadData(cfg, seed, base_dir);
  return {split.train.size(), split.val.size(), split.train.sample_shape, split.train.classes};
}

}  // namespace batchdist::worker
