#pragma once
// Config: YAML -> typed, validated structs. Validated once, at load; everything
// downstream trusts these values. No torch here: the config is pure data.

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace batchdist::worker {

enum class LastBatch { kDrop, kPad, kKeep };
enum class LrScaling { kLinear, kSqrt, kNone };
enum class Schedule { kConstant, kStep, kCosine };

const char* toString(LastBatch v);
const char* toString(LrScaling v);
const char* toString(Schedule v);

struct ModelConfig {
  std::string name = "mlp";                 ///< mlp | cnn | resnet18 | resnet50 | torchscript
  std::string path;                          ///< torchscript: the .pt file (relative to the config)
  std::string stem = "cifar";                ///< resnet: cifar (3x3, no pool) | imagenet (7x7/2 + pool)
  bool sync_batchnorm = false;               ///< BatchNorm statistics over all ranks (built-ins)
  std::vector<int64_t> hidden{128, 64};     ///< mlp hidden widths
  std::vector<int64_t> channels{16, 32};    ///< cnn conv widths
  bool batchnorm = true;
  double dropout = 0.0;
};

struct DataConfig {
  std::string name = "digits";  ///< digits | csv | synthetic | synthetic_images | cifar10 | cifar100 | mnist
  std::string path;                          ///< digits: optional (embedded copy); csv: required
  int64_t samples = 4096;                    ///< synthetic: number of samples
  std::vector<int64_t> shape{64};            ///< synthetic: per-sample feature shape
  int64_t classes = 10;                      ///< synthetic/csv: number of classes
  double val_fraction = 0.2;                 ///< held-out share (seeded split)
  double noise = 0.5;                        ///< synthetic: class-conditional noise
  // Loader (Note [loader]): worker threads batch ahead into a bounded queue.
  int64_t workers = 0;                       ///< 0: batches are made on the training thread
  int64_t prefetch = 2;                      ///< batches ready ahead of the step
  bool pin_memory = true;                    ///< CUDA: page-locked staging, async copies
  // Transforms, applied per batch on the training device.
  int64_t crop_padding = 0;                  ///< random crop with this zero padding (0: off)
  bool hflip = false;                        ///< random horizontal flip
  int64_t resize = 0;                        ///< bilinear resize to resize x resize (0: off)
  std::vector<double> mean;                  ///< normalize: per-channel mean (empty: off)
  std::vector<double> std;                   ///< normalize: per-channel std
};

/// 0 means "derive from the others"; per_gpu_auto asks the batch search.
struct BatchConfig {
  int64_t global = 0;
  bool global_auto = false;
  int64_t per_gpu = 0;
  bool per_gpu_auto = false;
  int64_t accum = 0;
  LastBatch last_batch = LastBatch::kDrop;
  int64_t min_per_gpu = 2;
  int64_t eval_per_gpu = 0;  ///< evaluation micro-batch (0: per_gpu)
};

struct OptimConfig {
  std::string name = "sgd";                  ///< sgd | adamw | lars
  double lr = 0.1;                           ///< rate at base_batch
  int64_t base_batch = 256;                  ///< global batch at which `lr` holds
  LrScaling lr_scaling = LrScaling::kLinear;
  double warmup_epochs = 0;
  int64_t warmup_steps = -1;                 ///< -1: from warmup_epochs
  Schedule schedule = Schedule::kConstant;
  double min_lr = 0.0;                       ///< cosine floor
  double step_gamma = 0.1;                   ///< step schedule factor
  std::vector<int64_t> milestones;           ///< step schedule epochs
  double momentum = 0.9;
  bool nesterov = false;
  double weight_decay = 0.0;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double trust_coefficient = 0.001;          ///< lars eta
};

struct TrainConfig {
  int64_t epochs = 10;
  int64_t seed = 0;
  std::string device = "auto";               ///< auto | cpu | cuda
  int64_t max_steps = 0;                     ///< stop after this many optimizer steps (0: all)
  int64_t threads = 0;                       ///< intra-op threads per rank (0: cores / local ranks)
  bool check_finite = true;
  std::string precision = "fp32";            ///< fp32 | bf16 | fp16 (autocast; fp16 scales the loss)
  double loss_scale = 65536.0;               ///< fp16: initial loss scale
  int64_t scale_growth_interval = 2000;      ///< fp16: finite steps before the scale doubles
};

struct DistConfig {
  std::string backend = "auto";              ///< auto | gloo | nccl
  double timeout_s = 300;
  std::string interface;
  double bucket_mb = 25;
};

struct SearchConfig {
  int64_t min = 8;
  int64_t max = 0;                           ///< 0: no cap other than memory
  int64_t multiple_of = 8;
  double memory_fraction = 0.9;
  int64_t memory_limit_mb = 0;               ///< CPU: resident-memory budget (0: none)
  int64_t warmup_steps = 2;
  int64_t timed_steps = 3;
  std::string objective = "throughput";      ///< throughput | max_fit
  double tolerance = 0.05;
  std::string cache;                         ///< cache file ("" -> <output>/search_cache.json)
};

struct Config {
  std::string source;                        ///< file the config came from (for messages)
  ModelConfig model;
  DataConfig data;
  BatchConfig batch;
  OptimConfig optim;
  TrainConfig train;
  DistConfig dist;
  SearchConfig search;
  /// Every key with the value in force (defaults included), as JSON, in schema order.
  std::vector<std::pair<std::string, std::string>> resolved;
};

/// Loads `path`, applies `overrides` ("key.path=value", value parsed as YAML, so
/// typed like the file), validates. Throws ConfigError naming file, key and value.
Config loadConfig(const std::string& path, const std::vector<std::string>& overrides = {});

/// Same, from YAML text (`source` names it in messages).
Config parseConfig(const std::string& yaml_text, const std::string& source,
                   const std::vector<std::string>& overrides = {});

/// The resolved config as a JSON object.
std::string resolvedJson(const Config& cfg);

/// Levenshtein distance, for "did you mean" hints.
std::size_t editDistance(const std::string& a, const std::string& b);

}  // namespace batchdist::worker
