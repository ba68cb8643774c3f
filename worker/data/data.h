#pragma once
// Data sets: the digits set (embedded in the binary), generic CSV, and a
// seeded synthetic classification set for tests and benchmarks.
//
// Note [tokens]: data.name: tokens maps one flat file of token ids (a .bin of
// little-endian uint16, or a 1-D .npy of uint16/int32/int64) and never copies it.
// With T = model.seq_len, sample i is the window of tokens [i*T, i*T + T] (T + 1
// tokens; consecutive windows share one): its input the first T, its target the
// last T (each position's next token), so N = (tokens - 1) / T. Dataset::x and
// Dataset::target are two strided views of the one mapped tensor ([N, T], strides
// {T, 1}, storage offsets 0 and 1), so every index path (gather, `rows`, the
// sharder's permutation, equal shards, drop/pad, resume, any world size) works on
// windows unchanged. Without data.val_path the last data.val_fraction of the
// windows are validation, contiguous (narrowed views): a seeded split would leave
// each validation window's text inside its training neighbours; the two halves
// share one token (training's last target is validation's first input). A batch
// becomes int64 ids [n, T], x and target alike, as its windows are gathered
// (Dataset::inputs, Dataset::targets: a uint16 file is mapped as int16, LibTorch
// 1.13 having no uint16, and masked with 0xFFFF); never float, never scaled or
// transformed. Every id a batch holds is checked there against model.vocab (a
// ConfigError naming the file, the token's offset and its value, before an
// embedding could index out of range): a min and a max over the batch. The file
// itself is never scanned at load (a full pass runs at ~13 ms per 100 MB from the
// page cache, but is disk-bound on a cold corpus of many GB, on every node).

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "worker/config/config.h"
#include "worker/data/source.h"

namespace batchdist::worker {

/// Note [tokens]: the file a token data set's windows view, for the ids check.
struct TokenSource {
  std::string path;
  int64_t vocab = 0;         ///< model.vocab: ids are 0 .. vocab-1
  int64_t header_bytes = 0;  ///< bytes before the first token (a .npy's header)
  int64_t item_bytes = 2;
  /// The windows `rows` (int64) of `view`, a token Dataset's x or target, as int64
  /// ids [n, T]. Throws ConfigError naming the file, the token's offset and its
  /// value when an id is outside 0..vocab-1.
  at::Tensor ids(const at::Tensor& view, const at::Tensor& rows) const;
};

/// Note [program data]: a data set a program hands over (Note [program parts] in
/// worker/model/program_model.h; batchdist::Dataset): its examples are read by
/// index, a micro-batch at once (get), by the loader's threads when data.workers
/// > 0 (then from several threads at once), else on the training thread. x and
/// target pass to the loss function as get() returns them (any dtype and shape
/// [n, ...]; no transform unless configured). A data set of whole tensors
/// (batchdist::TensorDataset) is held as one: gathered like any in-memory set.
class ExampleSource {
 public:
  virtual ~ExampleSource() = default;
  virtual int64_t size() const = 0;
  /// The examples `indices`, stacked: x [n, ...] and target [n, ...]. Throws.
  virtual std::pair<at::Tensor, at::Tensor> get(const std::vector<int64_t>& indices) const = 0;
};

/// data.name: program: the program's training and (optional) validation sets,
/// each either an ExampleSource or whole tensors (x, target).
struct ProgramData {
  struct Part {
    std::shared_ptr<const ExampleSource> source;
    at::Tensor x, target;  ///< whole tensors instead of a source
    bool given() const { return source != nullptr || x.defined(); }
  };
  Part train, val;
};

struct Dataset {
  at::Tensor x;                       ///< [N', sample_shape...], float32/16 or uint8; undefined for a Source
  at::Tensor target;                  ///< [N] int64 class labels (classification), [N] or [N, k] float (regression); tokens: [N, T] windows; a module's own loss: npy's [N, ...] as they are
  std::vector<int64_t> sample_shape;  ///< e.g. {1, 8, 8} or {64}; a Source: {3, size, size}
  int64_t classes = 0;
  double x_scale = 1.0;               ///< multiply x by this after float conversion (uint8: 1/255)
  /// Optional: sample i is x[rows[i]] (a split of a memory-mapped array is never copied).
  at::Tensor rows = {};
  bool mapped = false;  ///< x maps a file (npy): splits select through `rows`
  /// Decoded sources (Note [sources]): samples are read and decoded by the loader.
  std::shared_ptr<const Source> source = nullptr;
  /// Note [tokens]: x and target are windows of this file (both selected through `rows`).
  std::shared_ptr<const TokenSource> tokens = nullptr;
  /// Note [program data]: a program's examples, read by index (x and target undefined).
  std::shared_ptr<const ExampleSource> examples = nullptr;
  /// Note [program data]: x passes as it is (no float conversion, no scaling).
  bool as_given = false;
  int64_t size() const {
    return rows.defined() ? rows.size(0) : target.defined() ? target.size(0)
                                         : examples ? examples->size() : 0;
  }
  /// x and targets of the samples `idx` at once: a program's examples read once
  /// (Note [program data]), else inputs(idx) and targets(idx). Not for a Source.
  std::pair<at::Tensor, at::Tensor> batch(const std::vector<int64_t>& idx) const;
  /// x of the samples `idx` (int64), gathered through `rows`; not for a Source.
  at::Tensor gather(const at::Tensor& idx) const;
  /// The samples `idx` (int64) as the model takes them: gathered, float, times
  /// x_scale; token windows as int64 ids (Note [tokens]). Not for a Source.
  at::Tensor inputs(const at::Tensor& idx) const;
  /// Their targets (the task's dtype): target[idx]; token windows as int64 ids.
  at::Tensor targets(const at::Tensor& idx) const;
};

struct DataSplit {
  std::string name;
  std::string origin;  ///< where it came from (file, "embedded", "synthetic")
  Dataset train;
  Dataset val;
  int64_t skipped_files = 0;  ///< image_folder: files that are not images; tar: other members
  /// image_folder: files named like images that are not regular files (a dangling
  /// symlink, a FIFO, a device), found by the walk: named in data_errors.
  std::vector<DataErrorRecord> bad_files;
};

/// What loading needs from the job (defaults: a single process).
struct DataContext {
  /// Rank 0 runs the function and every rank gets its result (a collective in a
  /// job; an error on rank 0 is thrown on every rank). Default: run it here.
  std::function<std::string(const std::function<std::string()>&)> from_rank0;
  /// Where rank 0 keeps the image folder's list between runs ("": no cache).
  std::string cache_dir;
  /// Progress lines (rank 0), e.g. how long listing took.
  std::function<void(const std::string&)> note;
  /// Warnings (rank 0): bad files a walk found, classes without a sample.
  std::function<void(const std::string&)> warn;
  /// The task is a TorchScript module's own loss (Note [module loss] in
  /// worker/task/task.cc: trainsModuleLoss): npy's targets pass as they are, any
  /// shape N x ..., int32/int64 as int64 and float32/float64 as float32; no class
  /// count. Every other task keeps its targets' rules.
  bool module_targets = false;
};

/// Loads and splits the data set of `cfg.data` (seeded by `seed`). Relative paths
/// are resolved against `base_dir` (the config file's directory). Throws
/// ConfigError naming the file, line and what was expected.
DataSplit loadData(const DataConfig& cfg, int64_t seed, const std::string& base_dir,
                   const DataContext& ctx = {});

/// Parses CSV text: numeric features then an integer label in [0, classes) per
/// line. `source` names the text in messages.
Dataset parseCsv(const std::string& text, const std::string& source, int64_t classes,
                 std::vector<int64_t> sample_shape, double scale = 1.0);

/// The digits CSV compiled into the binary (UCI optical digits, 1797 rows).
std::string embeddedDigitsCsv();

/// Rows `rows` of `d` (a new Dataset sharing nothing with `d`).
Dataset subset(const Dataset& d, const std::vector<int64_t>& rows);

/// CIFAR binary records (the data_batch_*.bin layout): per image `label_bytes`
/// label bytes (1 for CIFAR-10; coarse + fine for CIFAR-100, the last is used)
/// then 3072 bytes, 3x32x32 channel-major. Throws ConfigError naming the file
/// and the offset of a truncated record or a label out of range.
Dataset parseCifar(const std::string& bytes, const std::string& source, int64_t label_bytes,
                   int64_t classes);

/// An MNIST/Fashion-MNIST idx pair (idx3-ubyte images, idx1-ubyte labels).
/// Throws ConfigError naming the file, the offset and what was expected.
Dataset parseIdx(const std::string& images, const std::string& image_source,
                 const std::string& labels, const std::string& label_source);

}  // namespace batchdist::worker

namespace batchdist::worker {

/// Size and shape of a data set without generating synthetic samples (for `plan`).
struct DataInfo {
  int64_t train_size = 0;
  int64_t val_size = 0;
  std::vector<int64_t> sample_shape;
  int64_t classes = 0;
};
DataInfo describeData(const DataConfig& cfg, int64_t seed, const std::string& base_dir,
                      const DataContext& ctx = {});

/// Validation samples for `n` samples at `val_fraction` (the rest train).
int64_t valCount(int64_t n, double val_fraction);

}  // namespace batchdist::worker
