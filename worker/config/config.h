#pragma once
// Config: YAML -> typed, validated structs. Validated once, at load; everything
// downstream trusts these values. No torch here: the config is pure data.

#include <nlohmann/json.hpp>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/error.h"

namespace batchdist::worker {

class ProgramModule;  // worker/model/program_model.h
struct ProgramData;   // worker/data/data.h

// Closed sets: parsed once at load (Section::choice), compared as enums
// everywhere else, and named by toString() in messages and reports.
enum class LastBatch { kDrop, kPad, kKeep };
enum class BatchAdapt { kOff, kGoodput, kWarmup };
enum class AdaptGain { kAdascale, kLinear };
enum class LrScaling { kLinear, kSqrt, kNone };
enum class Schedule { kConstant, kStep, kCosine };
enum class TaskKind { kAuto, kClassification, kRegression, kLanguageModel, kModuleLoss };
enum class ModelName { kMlp, kCnn, kResnet18, kResnet50, kTorchscript, kGpt, kProgram };
enum class ResnetStem { kCifar, kImagenet };
enum class Recompute { kOff, kOn, kAuto };  ///< Note [activation recompute] (worker/model/recompute.h); auto: Note [lever search]
enum class DataName { kDigits, kCsv, kSynthetic, kSyntheticImages, kCifar10, kCifar100, kMnist,
                      kImageFolder, kWebdataset, kNpy, kTokens, kProgram };
enum class OnError { kSkip, kFail };
enum class DataCache { kNone, kRam };
enum class OptimName { kSgd, kAdamw, kLars };
/// How an optimizer runs its step (optim.kernels; Note [multi-tensor step] in
/// worker/model/optimizer.cc):
///   kPerTensor   parameter by parameter (torch::optim's loop; lars's own);
///   kMultiTensor ATen's multi-tensor ops over each group: the same update
///                bitwise (lars within 1e-6: its trust ratios on the device);
///   kFused       one fused kernel per group (Note [fused optimizer steps] in
///                common/device_compat.h) for sgd and adamw where this LibTorch
///                has them (within 1e-6 of torch::optim's), else kMultiTensor;
///                lars: kMultiTensor;
///   kAuto        on CUDA kFused, on the CPU kPerTensor.
enum class StepKernels { kAuto, kPerTensor, kMultiTensor, kFused };
enum class DeviceKind { kAuto, kCpu, kCuda };
enum class Precision { kFp32, kBf16, kFp16 };
/// train.memory_format (Note [channels last] in worker/model/model.h).
enum class MemoryFormat { kAuto, kChannelsLast, kContiguous };
enum class DistBackend { kAuto, kGloo, kMpi, kNccl };
enum class Shard { kNone, kOptimizer, kGradients, kParameters, kAuto };  ///< Note [shard layout] (worker/train/shard/shard_layout.h); auto: Note [lever search]
enum class Objective { kThroughput, kMaxFit };
enum class ResumeMode { kOff, kAuto };
enum class ProgressMode { kAuto, kBar, kLines, kOff };

/// The names of a closed set, in schema order (the first is not necessarily the default).
template <typename E>
struct EnumNames;
#define BATCHDIST_ENUM_NAMES(E, ...)                                     \
  template <>                                                           \
  struct EnumNames<E> {                                                 \
    static constexpr std::pair<E, const char*> kNames[] = {__VA_ARGS__}; \
  }
BATCHDIST_ENUM_NAMES(LastBatch, {LastBatch::kDrop, "drop"}, {LastBatch::kPad, "pad"},
                     {LastBatch::kKeep, "keep"});
BATCHDIST_ENUM_NAMES(BatchAdapt, {BatchAdapt::kOff, "off"}, {BatchAdapt::kGoodput, "goodput"},
                     {BatchAdapt::kWarmup, "warmup"});
BATCHDIST_ENUM_NAMES(AdaptGain, {AdaptGain::kAdascale, "adascale"}, {AdaptGain::kLinear, "linear"});
BATCHDIST_ENUM_NAMES(LrScaling, {LrScaling::kLinear, "linear"}, {LrScaling::kSqrt, "sqrt"},
                     {LrScaling::kNone, "none"});
BATCHDIST_ENUM_NAMES(Schedule, {Schedule::kConstant, "constant"}, {Schedule::kStep, "step"},
                     {Schedule::kCosine, "cosine"});
BATCHDIST_ENUM_NAMES(TaskKind, {TaskKind::kAuto, "auto"},
                     {TaskKind::kClassification, "classification"},
                     {TaskKind::kRegression, "regression"},
                     {TaskKind::kLanguageModel, "language_model"},
                     {TaskKind::kModuleLoss, "module_loss"});
BATCHDIST_ENUM_NAMES(ModelName, {ModelName::kMlp, "mlp"}, {ModelName::kCnn, "cnn"},
                     {ModelName::kResnet18, "resnet18"}, {ModelName::kResnet50, "resnet50"},
                     {ModelName::kTorchscript, "torchscript"}, {ModelName::kGpt, "gpt"},
                     {ModelName::kProgram, "program"});
BATCHDIST_ENUM_NAMES(ResnetStem, {ResnetStem::kCifar, "cifar"}, {ResnetStem::kImagenet, "imagenet"});
BATCHDIST_ENUM_NAMES(Recompute, {Recompute::kOff, "off"}, {Recompute::kOn, "on"},
                     {Recompute::kAuto, "auto"});
BATCHDIST_ENUM_NAMES(DataName, {DataName::kDigits, "digits"}, {DataName::kCsv, "csv"},
                     {DataName::kSynthetic, "synthetic"},
                     {DataName::kSyntheticImages, "synthetic_images"},
                     {DataName::kCifar10, "cifar10"}, {DataName::kCifar100, "cifar100"},
                     {DataName::kMnist, "mnist"}, {DataName::kImageFolder, "image_folder"},
                     {DataName::kWebdataset, "webdataset"}, {DataName::kNpy, "npy"},
                     {DataName::kTokens, "tokens"}, {DataName::kProgram, "program"});
BATCHDIST_ENUM_NAMES(OnError, {OnError::kSkip, "skip"}, {OnError::kFail, "fail"});
BATCHDIST_ENUM_NAMES(DataCache, {DataCache::kNone, "none"}, {DataCache::kRam, "ram"});
BATCHDIST_ENUM_NAMES(OptimName, {OptimName::kSgd, "sgd"}, {OptimName::kAdamw, "adamw"},
                     {OptimName::kLars, "lars"});
BATCHDIST_ENUM_NAMES(StepKernels, {StepKernels::kAuto, "auto"},
                     {StepKernels::kPerTensor, "per_tensor"},
                     {StepKernels::kMultiTensor, "multi_tensor"}, {StepKernels::kFused, "fused"});
BATCHDIST_ENUM_NAMES(DeviceKind, {DeviceKind::kAuto, "auto"}, {DeviceKind::kCpu, "cpu"},
                     {DeviceKind::kCuda, "cuda"});
BATCHDIST_ENUM_NAMES(Precision, {Precision::kFp32, "fp32"}, {Precision::kBf16, "bf16"},
                     {Precision::kFp16, "fp16"});
BATCHDIST_ENUM_NAMES(MemoryFormat, {MemoryFormat::kAuto, "auto"},
                     {MemoryFormat::kChannelsLast, "channels_last"},
                     {MemoryFormat::kContiguous, "contiguous"});
BATCHDIST_ENUM_NAMES(DistBackend, {DistBackend::kAuto, "auto"}, {DistBackend::kGloo, "gloo"},
                     {DistBackend::kMpi, "mpi"}, {DistBackend::kNccl, "nccl"});
BATCHDIST_ENUM_NAMES(Shard, {Shard::kNone, "none"}, {Shard::kOptimizer, "optimizer"},
                     {Shard::kGradients, "gradients"}, {Shard::kParameters, "parameters"},
                     {Shard::kAuto, "auto"});
BATCHDIST_ENUM_NAMES(Objective, {Objective::kThroughput, "throughput"},
                     {Objective::kMaxFit, "max_fit"});
BATCHDIST_ENUM_NAMES(ResumeMode, {ResumeMode::kOff, "off"}, {ResumeMode::kAuto, "auto"});
BATCHDIST_ENUM_NAMES(ProgressMode, {ProgressMode::kAuto, "auto"}, {ProgressMode::kBar, "bar"},
                     {ProgressMode::kLines, "lines"}, {ProgressMode::kOff, "off"});
#undef BATCHDIST_ENUM_NAMES

/// The name of `v` ("fp16", "max_fit", ...).
template <typename E>
const char* toString(E v) {
  for (const auto& [e, name] : EnumNames<E>::kNames) {
    if (e == v) return name;
  }
  return "?";
}

/// The value named `name`, if any.
template <typename E>
std::optional<E> parseEnum(std::string_view name) {
  for (const auto& [e, n] : EnumNames<E>::kNames) {
    if (name == n) return e;
  }
  return std::nullopt;
}

/// The one form of a message about a config key: "SOURCE: KEY: WHAT" (SOURCE is
/// the config file). A key an override set is named by it instead: "--set KEY:
/// WHAT" (setName), which the config reader says itself.
ConfigError keyError(const std::string& source, const std::string& key, const std::string& what);

/// Where the overrides ("key.path=value") of a config came from: the command
/// line's --set, or the C++ library's Settings::set. Messages name a key an
/// override set as its user wrote it: "--set batch.global" or
/// Settings::set("batch.global").
enum class SetsFrom { kCommandLine, kSettings };
std::string setName(SetsFrom from, const std::string& path);

/// Note [task] in worker/task/task.h; Note [task choice] in worker/task/task.cc.
struct TaskConfig {
  TaskKind name = TaskKind::kAuto;           ///< auto: from the data (float targets: regression; tokens: language_model)
                                             ///< and the model (a TorchScript forward(x, target): module_loss)
};

struct ModelConfig {
  ModelName name = ModelName::kMlp;
  std::string path;                          ///< torchscript: the .pt file (relative to the config)
  double flops_per_sample = 0;               ///< torchscript: training FLOPs of a sample (Note [mfu]; 0: unknown)
  ResnetStem stem = ResnetStem::kCifar;      ///< resnet: cifar (3x3, no pool) | imagenet (7x7/2 + pool)
  bool sync_batchnorm = false;               ///< BatchNorm statistics over all ranks (built-ins)
  std::vector<int64_t> hidden{128, 64};     ///< mlp hidden widths
  std::vector<int64_t> channels{16, 32};    ///< cnn conv widths
  bool batchnorm = true;
  double dropout = 0.0;
  Recompute recompute = Recompute::kOff;     ///< gpt/resnet blocks, mlp layers: Note [activation recompute]
  int64_t outputs = 0;                       ///< the head's width (0: from the data: classes, or the targets' k)
  // gpt (Note [gpt] in worker/model/gpt.h); model.dropout above is its dropout.
  int64_t layers = 2;                        ///< transformer blocks
  int64_t heads = 2;                         ///< attention heads (model.embed divisible by it)
  int64_t embed = 64;                        ///< embedding width
  int64_t vocab = 256;                       ///< token ids 0 .. vocab-1 (256: bytes)
  int64_t seq_len = 64;                      ///< the longest sequence (learned positions)
  /// model.name: program: the module and loss function a program handed over
  /// (Note [program parts] in worker/model/program_model.h).
  std::shared_ptr<ProgramModule> program;
};

struct DataConfig {
  DataName name = DataName::kDigits;
  std::string path;                          ///< digits: optional (embedded copy); csv: required
  std::string val_path;                      ///< webdataset: the validation shards; tokens: the validation tokens
  std::string list;                          ///< image_folder: "relative/path label" lines, instead of walking
  bool list_outside_root = false;            ///< data.list may name files outside the data root
  int64_t samples = 4096;                    ///< synthetic: number of samples
  std::vector<int64_t> shape{64};            ///< synthetic: per-sample feature shape
  int64_t classes = 10;                      ///< synthetic/csv: number of classes; others: the head's, when given
  bool classes_given = false;                ///< data.classes was set (else the labels decide: Note [class count])
  double val_fraction = 0.2;                 ///< held-out share (seeded split)
  double noise = 0.5;                        ///< synthetic: class-conditional noise
  // Loader (Note [loader]): worker threads batch ahead into a bounded queue.
  int64_t workers = 0;                       ///< 0: batches are made on the training thread
  bool workers_auto = true;                  ///< auto: decoded sources get the rank's share of cores less one
  int64_t prefetch = 2;                      ///< batches ready ahead of the step
  bool pin_memory = true;                    ///< CUDA: page-locked staging, async copies
  // Transforms, applied per batch on the training device.
  int64_t crop_padding = 0;                  ///< random crop with this zero padding (0: off)
  bool hflip = false;                        ///< random horizontal flip
  int64_t resize = 0;                        ///< bilinear resize to resize x resize (0: off)
  std::vector<double> mean;                  ///< normalize: per-channel mean (empty: off)
  std::vector<double> std;                   ///< normalize: per-channel std
  // Decoded image sources (image_folder, webdataset): Note [decode less].
  int64_t image_size = 224;                  ///< train crop / eval centre crop side
  std::vector<double> crop_scale{0.08, 1.0}; ///< RandomResizedCrop area fraction
  std::vector<double> crop_ratio{3.0 / 4.0, 4.0 / 3.0};  ///< ... and aspect ratio
  OnError on_error = OnError::kSkip;         ///< an undecodable file: skip (next good one) | fail
  DataCache cache = DataCache::kNone;        ///< ram: keep each read sample's encoded bytes
  int64_t cache_mb = 4096;                   ///< bound of the RAM cache per rank
  // tokens (Note [tokens] in worker/data/data.h): not data keys, but model.seq_len
  // and model.vocab, copied here by parseConfig (a window is seq_len + 1 tokens).
  int64_t seq_len = 64;
  int64_t vocab = 256;
  /// data.name: program: the data set a program handed over (Note [program
  /// parts] in worker/model/program_model.h).
  std::shared_ptr<const ProgramData> program;
  /// True for sources decoded per sample by the loader (image_folder, webdataset).
  bool decoded() const { return name == DataName::kImageFolder || name == DataName::kWebdataset; }
};

/// 0 means "derive from the others"; per_gpu_auto asks the batch search.
struct BatchConfig {
  int64_t global = 0;
  bool global_auto = false;
  /// Note [global tokens]: the global batch asked in tokens (0: not given); when
  /// given, `global` holds it in whole windows of model.seq_len tokens.
  int64_t global_tokens = 0;
  int64_t per_gpu = 0;
  bool per_gpu_auto = false;
  int64_t accum = 0;
  LastBatch last_batch = LastBatch::kDrop;
  int64_t min_per_gpu = 2;
  int64_t eval_per_gpu = 0;  ///< evaluation micro-batch (0: per_gpu)
  // Note [goodput] and Note [batch-size warmup] in worker/plan/adapt.h: an
  // adaptive global batch, opt-in.
  BatchAdapt adapt = BatchAdapt::kOff;  ///< goodput, warmup: `global` is the starting batch G0
  int64_t adapt_max = 0;                ///< ceiling of G (0: 16 x G0)
  int64_t adapt_every_steps = 100;      ///< re-decide G every this many steps (and at epoch ends)
  int64_t adapt_min_steps = 8;          ///< G never leaves an epoch fewer steps than this
  bool adapt_in_warmup = false;         ///< decide during the warmup too (Note [adaptive training])
  AdaptGain adapt_gain = AdaptGain::kAdascale;  ///< a step's worth in G0 steps (Note [goodput])
};

struct OptimConfig {
  OptimName name = OptimName::kSgd;
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
  /// sgd: every parameter; adamw and lars: weights of 2 or more dimensions only
  /// (biases, LayerNorm and BatchNorm parameters are not decayed).
  double weight_decay = 0.0;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double trust_coefficient = 0.001;          ///< lars eta
  StepKernels kernels = StepKernels::kAuto;  ///< how the step runs (the update is the same)
  /// Note [gradient clipping]: the synchronised gradient's global L2 norm is
  /// clipped to this once per step (0: off).
  double clip_grad_norm = 0.0;
};

struct TrainConfig {
  int64_t epochs = 10;
  int64_t seed = 0;
  DeviceKind device = DeviceKind::kAuto;
  int64_t max_steps = 0;                     ///< stop after this many optimizer steps (0: all)
  int64_t threads = 0;                       ///< intra-op threads per rank (0: cores / local ranks)
  bool check_finite = true;
  bool noise_scale = true;                   ///< estimate the gradient noise scale (W > 1)
  int64_t noise_scale_every = 4;             ///< ... from one step in this many (Note [noise cadence])
  Precision precision = Precision::kFp32;    ///< autocast; fp16 also scales the loss
  double loss_scale = 65536.0;               ///< fp16: initial loss scale
  int64_t scale_growth_interval = 2000;      ///< fp16: finite steps before the scale doubles
  MemoryFormat memory_format = MemoryFormat::kAuto;  ///< Note [channels last]
  bool cudnn_benchmark = true;               ///< Note [cudnn benchmark] (worker/device.h)
  double peak_tflops = 0;                    ///< one device's peak for MFU (Note [mfu]; 0: the table or measured)
  /// Note [oom back-off]: after a back-off, the larger per-GPU batch is tried
  /// again after this many steps (doubling after each retry that fails); 0: never.
  int64_t oom_recover_after_steps = 0;
  /// Rank 0's progress line (Note [progress output] in worker/common/console.h).
  ProgressMode progress = ProgressMode::kAuto;
};

/// What rank 0 writes besides report.json and metrics.jsonl.
struct ReportConfig {
  bool tensorboard = true;                   ///< OUTPUT/tensorboard/{train,search}/
  double sample_s = 0.5;                     ///< Note [system metrics]: sampling period (0: off)
};

/// Profiler traces (Note [step profiler] in worker/train/observe/profiler.h): steps of
/// this run, counted from its first, are skipped (`wait`), run with the profiler
/// prepared (`warmup`) and traced (`active`); 0 active steps: off.
struct ProfileConfig {
  int64_t wait = 5;
  int64_t warmup = 2;
  int64_t active = 0;        ///< traced steps (0: no trace)
  bool shapes = false;       ///< record the operators' input shapes
  bool memory = false;       ///< record allocations and frees
  bool stack = false;        ///< record source stacks (TorchScript and Python frames only)
  bool on() const { return active > 0; }
};

struct DistConfig {
  DistBackend backend = DistBackend::kAuto;
  double timeout_s = 300;
  std::string interface;
  double bucket_mb = 25;
  bool overlap = true;                       ///< reducer: allreduce during backward (false: after it)
  Shard shard = Shard::kNone;                ///< optimizer: ZeRO-1 (Note [sharded optimizer])
  /// dist.shard: parameters (Note [parameter units]): free a unit's gathered
  /// parameters after its forward (true, FSDP's default) or keep them until backward.
  bool reshard_after_forward = true;
  /// dist.shard: parameters: start the next unit's all-gather as a unit begins.
  bool prefetch = true;
};

struct SearchConfig {
  int64_t min = 8;
  int64_t max = 0;                           ///< 0: no cap other than memory
  int64_t multiple_of = 8;
  double memory_fraction = 0.9;
  int64_t memory_limit_mb = 0;               ///< CPU: resident-memory budget (0: none)
  int64_t warmup_steps = 1;                  ///< Note [search warm-up]
  // Note [adaptive timing] in worker/search/search.h.
  int64_t timed_steps = 5;                   ///< at least this many timed steps per candidate (2 of slow steps)
  int64_t max_steps = 1000;                  ///< at most this many
  double min_time_s = 0.3;                   ///< timed for at least this long
  double max_time_s = 1.0;                   ///< and at most this long, precise or not
  int64_t rounds = 3;                        ///< interleaved re-measuring rounds (0: none)
  Objective objective = Objective::kThroughput;
  double tolerance = 0.05;
  std::string cache;                         ///< cache file ("" -> <output>/search_cache.json)
  bool profile = false;                      ///< Note [search traces]: one step per candidate traced
};

/// Checkpoints (Note [checkpoint] in worker/train/checkpoint/checkpoint.h). Periodic ones when
/// every_steps or every_minutes is set (0: off); one when a stop signal ends the run.
struct CheckpointConfig {
  int64_t every_steps = 0;                   ///< 0: off
  bool every_steps_auto = false;             ///< Note [checkpoint interval]: from what they cost
  double every_minutes = 30;                 ///< 0: off (agreed over the ranks each step)
  int64_t keep = 2;                          ///< the newest K good checkpoints are kept
  std::string dir;                           ///< "" -> <output>/checkpoints
  bool on_signal = true;                     ///< SIGTERM/SIGUSR1/SIGINT stop: checkpoint first
  bool background = true;                    ///< periodic ones: files written while training goes on
  ResumeMode resume = ResumeMode::kOff;      ///< auto: newest valid checkpoint in dir, if any
};

/// `batchdist elastic` (launcher/elastic.h): how its supervisor watches the job
/// and when a lost host may come back. The ranks themselves ignore the section.
struct ElasticConfig {
  double heartbeat_s = 1;                    ///< each rank sends a heartbeat this often
  double heartbeat_timeout_s = 10;           ///< a rank silent this long is lost (its host with it)
  double stall_s = 300;                      ///< no step completed on any rank this long: a hang
  double readmit_s = 60;                     ///< a lost host answers this long before it rejoins
  double wait_s = 300;                       ///< below --min-ranks: wait this long for hosts
  double probe_timeout_s = 10;               ///< a host that cannot start a process this fast is gone
};

struct Config {
  std::string source;                        ///< file the config came from (for messages)
  std::string base_dir = ".";                ///< its directory: relative paths resolve here
  TaskConfig task;
  ModelConfig model;
  DataConfig data;
  BatchConfig batch;
  OptimConfig optim;
  TrainConfig train;
  DistConfig dist;
  SearchConfig search;
  CheckpointConfig checkpoint;
  ReportConfig report;
  ElasticConfig elastic;
  ProfileConfig profile;
  /// Every key with the value in force (defaults included), by section, in schema
  /// order: {"model": {"name": "mlp", ...}, ...}. The report, the search cache key
  /// and the cross-rank check read it.
  nlohmann::ordered_json resolved;
  /// Keys a rank may set differently from the others (its memory budget,
  /// interface, threads, cache file): "section.key".
  static const std::vector<std::string>& perRankKeys();
};

/// The memory levers a run trains under (Note [lever search] in
/// worker/search/levers.h): how the update is sharded and whether the model's
/// blocks recompute their activations. The config may say auto for either; the
/// trainer only ever sees concrete values (withLevers).
struct Levers {
  Shard shard = Shard::kNone;
  Recompute recompute = Recompute::kOff;
  bool operator==(const Levers& o) const { return shard == o.shard && recompute == o.recompute; }
  bool operator!=(const Levers& o) const { return !(*this == o); }
};
/// The message for `key` (model.name or data.name): program without a program
/// behind it (Note [program parts] in worker/model/program_model.h).
std::string programOnlyMessage(const char* key);
/// Why model.recompute cannot be on for `c` (cnn, TorchScript), or "" (Note [activation recompute]).
std::string recomputeUnsupported(const ModelConfig& c);

/// A key and what its value does not allow (both empty: allowed).
struct KeyReason {
  std::string key;
  std::string why;
};
/// Note [parameter units]: the first key whose value dist.shard: parameters does
/// not take yet (the model without units first), or nothing; the config refuses
/// it with parameters, and dist.shard: auto then does not weigh parameters.
KeyReason parametersUnsupported(const Config& cfg);
/// "plain", "shard optimizer", "recompute", "shard optimizer + recompute".
std::string leversText(const Levers& l);
/// {"shard": ..., "recompute": ...}: how search.json, report.json and a checkpoint's
/// manifest write levers (Note [lever search]).
nlohmann::ordered_json leversJson(const Levers& l);
/// The inverse of leversJson for concrete levers: none and off for a missing key
/// (or a `j` that is not an object). Throws std::invalid_argument on an unknown or auto value.
Levers leversFromJson(const nlohmann::json& j);
/// Whether either lever is auto.
bool hasAutoLevers(const Levers& l);
/// "dist.shard: auto", "model.recompute: auto" or both, joined by " and ".
std::string autoLeversText(const Levers& l);
/// The config's levers, auto included.
Levers configLevers(const Config& cfg);
/// `cfg` with `l` in force (dist.shard, model.recompute): a new value, for the one
/// component that trains under those levers; the resolved config keeps what the
/// user asked for (auto), so a resume of the run still matches it.
Config withLevers(Config cfg, const Levers& l);

/// Note [task choice]: data.name: tokens, model.name: gpt and the language-model
/// task go together. What is wrong with the config's pairing of them, if anything:
/// the key to name and the message (which names the other key too).
struct KeyProblem {
  std::string key;
  std::string what;
};
std::optional<KeyProblem> languageModelMismatch(const Config& cfg);

/// Largest config file read (a safeguard against /dev/zero and the like).
constexpr std::size_t kMaxConfigBytes = std::size_t{4} << 20;

/// Loads `path`, applies `overrides` ("key.path=value", value parsed as YAML, so
/// typed like the file), validates. Throws ConfigError naming file, key and value.
Config loadConfig(const std::string& path, const std::vector<std::string>& overrides = {},
                  SetsFrom sets_from = SetsFrom::kCommandLine);

/// Same, from YAML text (`source` names it in messages).
Config parseConfig(const std::string& yaml_text, const std::string& source,
                   const std::vector<std::string>& overrides = {},
                   SetsFrom sets_from = SetsFrom::kCommandLine);

/// Levenshtein distance, for "did you mean" hints.
std::size_t editDistance(const std::string& a, const std::string& b);

}  // namespace batchdist::worker
