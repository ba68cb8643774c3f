#pragma once
// Models: the built-ins (mlp, cnn, resnet18/50, gpt) and the user's own TorchScript
// module, behind one small interface the trainer uses.

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "collective/communicator.h"
#include "worker/config/config.h"
#include "worker/model/units.h"

namespace c10 {
struct IValue;
}  // namespace c10

namespace batchdist::worker {

/// Note [sync batchnorm failure]: with model.sync_batchnorm every training forward
/// makes one allreduce per BatchNorm layer (Note [sync batchnorm]). A rank that
/// runs out of memory inside forward would leave the others in the next one,
/// which its gradient buckets (Note [oom back-off]) then meet out of step: the
/// job aborts on the size mismatch, or waits until dist.timeout_s. So, around
/// each training forward (and its loss):
///  - every rank ends it with endForward(): one allreduce of one number, the count
///    of ranks whose forward failed. A failing rank first makes the BatchNorm
///    allreduces its forward did not reach, with zeros (their sizes: those of the
///    last complete forward, or the layers' order before the first), so the
///    others finish their forward and reach the same count;
///  - a count > 0 ends the forward on every rank before backward: no BatchNorm
///    backward allreduce and no bucket has started anywhere, so every rank goes on
///    to the reducer's finish() in step (Note [oom back-off] in
///    worker/train/oom_guard.h), which discards the step and backs off.
/// Why this one: the normal step pays one small allreduce per micro-batch, next
/// to the 2 L it already makes (ResNet-50: 106 -> 107); zero extra would need
/// the failure flag inside the last BatchNorm allreduce, which misses a failure
/// after it (the head, the loss), and after that the next collective is a
/// BatchNorm backward or a gradient bucket, in an order only autograd knows.
/// Not covered: an out-of-memory inside backward before its BatchNorm backward
/// allreduces are done (the reducer's finish() then meets them).
class SyncBatchNorm {
 public:
  explicit SyncBatchNorm(collective::Communicator& comm) : comm_(comm) {}
  collective::Communicator& comm() const { return comm_; }
  /// Whether a training forward synchronises: more than one rank, and no
  /// LocalBatchNorm alive.
  bool synchronising() const;
  /// BatchNorm layers that synchronise, known at construction.
  int64_t layers() const { return static_cast<int64_t>(layer_sizes_.size()); }

  /// Before a training forward: its collectives are counted from zero.
  void beginForward();
  /// After a training forward and its loss, on every rank, `failed` telling
  /// whether it threw here (out of memory). Collective when synchronising():
  /// a failing rank first makes the allreduces its forward did not reach.
  /// Returns how many ranks failed (0 when all went well).
  int64_t endForward(bool failed);
  /// Fault injection (BATCHDIST_FAULT_OOM, forward): the forward throws
  /// c10::OutOfMemoryError just before its collective number `index` (0-based).
  void failBeforeCollective(int64_t index) { fail_at_ = index; }

  // For the layers.
  void addLayer(int64_t numel) { layer_sizes_.push_back(numel); }
  /// Just before a layer's allreduce of `numel` floats (throws an injected fault).
  void beforeCollective(int64_t numel);

 private:
  collective::Communicator& comm_;
  std::vector<int64_t> layer_sizes_;  ///< construction order
  std::vector<int64_t> last_;         ///< the last complete forward's allreduces
  std::vector<int64_t> current_;      ///< this forward's so far
  int64_t fail_at_ = -1;
  int paused_ = 0;  ///< LocalBatchNorm scopes alive
  friend class LocalBatchNorm;
};

/// What the trainer needs of a model. Parameters and buffers come in a fixed
/// order, the same on every rank.
class Model {
 public:
  virtual ~Model() = default;
  virtual at::Tensor forward(const at::Tensor& x) = 0;
  /// Note [module loss] (worker/task/task.cc): whether forward takes the target
  /// too, forward(x, target), and returns its own loss (a TorchScript module).
  virtual bool takesTarget() const { return false; }
  /// That forward, its result as the module returned it (a tensor, a tuple or a
  /// dict); only where takesTarget(). Throws TrainingError naming the file when
  /// the module's code fails (out of memory: rethrown as it is).
  virtual c10::IValue forwardWithTarget(const at::Tensor& x, const at::Tensor& target);
  virtual std::vector<std::pair<std::string, at::Tensor>> namedParameters() const = 0;
  virtual std::vector<std::pair<std::string, at::Tensor>> namedBuffers() const = 0;
  virtual void train(bool on) = 0;
  virtual void to(const at::Device& device) = 0;
  /// The saved form (TorchScript modules as TorchScript, built-ins as a C++
  /// archive), in memory: the caller writes it with writeFileAtomic, so a full
  /// disk is an error with a cause, never a half-written model.pt.
  virtual std::string serialize() = 0;
  /// The model's synchronised BatchNorm (Note [sync batchnorm failure]); null
  /// without model.sync_batchnorm or BatchNorm layers.
  virtual SyncBatchNorm* syncBatchNorm() { return nullptr; }
  virtual bool hasBatchNorm() const = 0;
  /// Note [activation recompute] on or off from the next forward, the parameters
  /// as they are (the batch search switches levers on one model: Note [lever
  /// switch] in worker/train/step/step_measurer.cc). False, and nothing changed, where
  /// the model has no blocks to recompute (cnn, TorchScript) and `on` was asked.
  virtual bool setRecompute(bool on) { return !on; }
  /// e.g. "resnet18 (cifar stem), 11.2 M parameters".
  virtual std::string describe() const = 0;
  /// Note [channels last]: from now on the 4-D parameters are kept, and 4-D
  /// inputs taken, NHWC in memory (on: channels last; off: contiguous). Before
  /// the optimizer and the gradient synchroniser are built over the parameters.
  void setChannelsLast(bool on);
  bool channelsLast() const { return channels_last_; }
  /// Note [mfu] (worker/model/flops.h): the FLOPs of training one sample
  /// (forward and backward), 0 when unknown. buildModel sets it.
  double trainingFlopsPerSample() const { return flops_per_sample_; }
  void setTrainingFlopsPerSample(double flops) { flops_per_sample_ = flops; }

  /// Note [parameter units] (worker/model/units.h): the model's units, in order,
  /// covering its trainable parameters; empty for a model without (cnn, resnet,
  /// TorchScript, program).
  virtual std::vector<ParamUnit> units() const { return {}; }
  /// The hooks its forward runs each unit through (null: none, the default).
  void setUnitHooks(UnitHooks* hooks) { unit_hooks_ = hooks; }
  UnitHooks* unitHooks() const { return unit_hooks_; }

  std::vector<at::Tensor> parameters() const;
  /// The parameters that require grad: what the optimizer and the gradient
  /// synchroniser see (Note [frozen parameters] in worker/train/trainer.cc).
  std::vector<at::Tensor> trainableParameters() const;
  std::vector<at::Tensor> buffers() const;
  /// Parameters then buffers.
  std::vector<at::Tensor> state() const;

 protected:
  /// A 4-D input in the model's memory format (Note [channels last]); a no-op
  /// for a batch the loader already laid out so.
  at::Tensor laidOut(const at::Tensor& x) const;

 private:
  bool channels_last_ = false;
  double flops_per_sample_ = 0;
  UnitHooks* unit_hooks_ = nullptr;
};

/// Note [parameter units]: a scope in which every parameter of `model` is whole,
/// on every rank (a collective where the model's units are sharded; nothing
/// otherwise). `absorb_writes`: what the scope wrote into the parameters (a
/// restored checkpoint) is kept, as this rank's shard.
class WholeParameters {
 public:
  explicit WholeParameters(const Model& model, bool absorb_writes = false);
  ~WholeParameters();
  WholeParameters(const WholeParameters&) = delete;
  WholeParameters& operator=(const WholeParameters&) = delete;

 private:
  UnitHooks* hooks_;
  bool absorb_;
};

// Note [channels last]
// ~~~~~~~~~~~~~~~~~~~~
// Convolutions on CUDA (cuDNN's tensor-core kernels) run fastest on NHWC memory:
// given NCHW they transpose around every layer. train.memory_format picks the
// layout of the convolutional models' weights and image batches: channels_last
// (NHWC in memory, [N, C, H, W] in shape, as PyTorch's torch.channels_last),
// contiguous (NCHW), or auto: channels_last for cnn and resnet on CUDA, contiguous
// elsewhere (on the CPU the layouts are within a few per cent either way, and
// the CPU is not what this is for). What keeps it so:
//  - the model converts its 4-D parameters once, before the optimizer and the
//    gradient synchroniser see them (set_data: the same tensors), and lays out
//    a 4-D input on the way in (Model::laidOut; free when already so);
//  - the loader writes batches that way: the decoded sources' CPU path writes
//    NHWC floats straight from the decoder's HWC bytes, the CUDA path keeps the
//    NHWC order of the uint8 copy through the float conversion, the transform
//    ends in the format (Transform::laidOut), so the step makes no copy;
//  - the overlapped reducer's gradient views in its buckets take the
//    parameters' strides (Note [bucket view layout] in collective/reducer.cc),
//    so backward writes the gradients without a transposing copy.
// Under dist.shard (ZeRO-1/2) the parameters become views of the shard's flat
// buffer in their logical order (Note [shard layout]), so the weights are
// contiguous again there: the batches stay NHWC and the convolution converts the
// weight per call. Keeping them NHWC would need the shard layout in memory
// order: not done.
// The arithmetic is the same up to the convolution algorithms' order of sums:
// tests/equivalence_test.cc trains both layouts on the CPU to the same weights
// within tolerance. A TorchScript module follows train.memory_format when it
// says channels_last; auto leaves it contiguous (its layers are unknown).

/// Whether `model` is one of the built-in convolutional models (cnn, resnet18,
/// resnet50): channels-last by default on CUDA, fp32 at TF32's peak for MFU.
bool convolutional(const ModelConfig& model);

/// Note [channels last]: whether a run keeps image batches and convolution
/// weights NHWC in memory.
bool channelsLast(const TrainConfig& train, const ModelConfig& model, bool on_cuda);

/// A parameter count as describe() prints it ("11.17 M"): one format for every model.
std::string parameterCountText(int64_t n);

/// Builds the model of `cfg` for samples of `sample_shape` and `classes` outputs
/// (gpt: samples of [T] token ids, and model.vocab outputs per token; Note [gpt]).
/// TorchScript paths are resolved against `base_dir`. `comm` is used by
/// model.sync_batchnorm (may be null otherwise). Throws ConfigError when the model
/// does not fit the data, or the TorchScript file is missing, not TorchScript, or
/// its forward fails on a sample batch (naming the file and the shape tried). A
/// module whose forward takes the target is not tried here: its task probes it
/// with real targets (Task::probe, Note [module loss]).
std::unique_ptr<Model> buildModel(const ModelConfig& cfg, const std::vector<int64_t>& sample_shape,
                                  int64_t classes, const std::string& base_dir = "",
                                  collective::Communicator* comm = nullptr);

/// Whether the configured model has BatchNorm layers, before the trainer builds
/// it (loads TorchScript files to look, once per file and process).
bool modelHasBatchNorm(const ModelConfig& cfg, const std::string& base_dir = "");

/// Note [module loss]: whether the configured model is a TorchScript module whose
/// forward takes the target too (two inputs or more after self), before the
/// trainer builds it (loads the file to look, once per file and process). Throws
/// ConfigError when the file is missing or not TorchScript.
bool modelTakesTarget(const ModelConfig& cfg, const std::string& base_dir = "");

/// Note [sync batchnorm]: while a SyncBatchNorm layer trains, its batch statistics
/// are summed over all ranks (one allreduce per layer in forward and one in
/// backward), so every rank normalises with the global batch's mean and variance.
/// The batch search measures without it (a rank that runs out of memory
/// mid-forward could otherwise strand the others in a collective): while a
/// LocalBatchNorm lives, `model`'s layers normalise with their own rank's
/// statistics, as plain BatchNorm. Per model, not process-wide, and undone
/// however the scope is left (an exception included).
class LocalBatchNorm {
 public:
  explicit LocalBatchNorm(Model& model);
  ~LocalBatchNorm();
  LocalBatchNorm(const LocalBatchNorm&) = delete;
  LocalBatchNorm& operator=(const LocalBatchNorm&) = delete;

 private:
  SyncBatchNorm* sync_;
};

}  // namespace batchdist::worker
