#pragma once
// Note [task]: what is specific to the objective lives in one object, the task;
// the trainer, the search and the outputs know only "a weighted loss over real
// samples and a list of named metrics".
//  - Forward and loss: the trainer hands the task the model and a batch
//    (forwardLoss); the task runs the model's forward (under the run's autocast)
//    and gives the batch's weighted loss sum_i w_i l_i of one fp32 loss l_i per
//    sample (perSampleLoss for a task that computes it from the outputs; a
//    module's own loss for module_loss: Note [module loss] in
//    worker/task/task.cc). The trainer divides it (Note [loss normalisation] in
//    worker/train/trainer.cc: padding weighs 0, the denominator is the global
//    step's real samples, known on every rank), so a task never sees the split
//    G = m x a x W. The batch search times the same step (the trainer's).
//  - Evaluation: each rank adds its validation batches to the task's sums
//    (forwardEvalSums, addEvalSums), the sums are allreduced once, and metrics()
//    turns the totals into named figures. Every task's first sum is its summed
//    loss (eval_loss).
//  - Metrics travel as a list of (name, value) in the task's order: in the
//    console, metrics.jsonl (eval_<name>), report.json (eval_<name>), report.html,
//    TensorBoard (eval/<name>) and the checkpoint's history (keyed).
//  - The task is chosen once (config `task:`, or inferred from the data and the
//    model: Note [task choice] in worker/task/task.cc) and enters the search
//    cache's key.
// The tasks: classification, regression, the language model (token windows in,
// logits [n, T, vocab] out; its per-sample loss is the window's mean token
// cross-entropy: Note [language model] in worker/task/task.cc), and a TorchScript
// module's own loss (module_loss: forward(x, target) returns it).
// A new task implements the interface below and gets one case in makeTask().

#include <ATen/core/Tensor.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "worker/config/config.h"
#include "worker/task/metrics.h"

namespace batchdist::worker {

class Model;
struct Batch;
struct Dataset;

/// The run's autocast for the model's forward (train.precision on the device);
/// the loss after it is fp32.
struct Autocast {
  at::Device device = at::kCPU;
  Precision precision = Precision::kFp32;
};

/// Which metric says "better", and in which direction.
struct BestMetric {
  std::string name;
  bool higher_is_better = true;
};

class Task {
 public:
  virtual ~Task() = default;
  virtual TaskKind kind() const = 0;

  /// One fp32 loss per sample, shape [n], for the model's outputs `out` ([n, ...],
  /// any floating dtype, autocast's included) against `target` (targetDtype()).
  /// (module_loss: the module computes it; calling this is an error.)
  virtual at::Tensor perSampleLoss(const at::Tensor& out, const at::Tensor& target) const = 0;
  /// The training forward of `batch` and its weighted loss sum_i w_i l_i, fp32
  /// 0-d (Note [task]): by default model.forward(x) under `autocast`, then
  /// perSampleLoss weighed by batch.w.
  virtual at::Tensor forwardLoss(Model& model, const Batch& batch, const Autocast& autocast) const;
  /// The evaluation forward of one validation batch (every sample weighs 1),
  /// added to `sums`: by default model.forward(x) under `autocast`, then
  /// addEvalSums.
  virtual void forwardEvalSums(Model& model, const at::Tensor& x, const at::Tensor& target,
                               const Autocast& autocast, std::vector<double>& sums) const;
  /// Before training, on every rank: a task that learns from the model what it
  /// returns (module_loss: its metrics, whether its loss is per sample) runs one
  /// forward on two samples of `train` (inputs of shape `input_shape`), so that a
  /// module that breaks the contract fails here, named, and not in the first
  /// step. `padded`: the plan pads the last batch (samples of weight 0). Throws
  /// ConfigError. Nothing by default (buildModel tried the model already).
  virtual void probe(Model& model, const Dataset& train, const std::vector<int64_t>& input_shape,
                     const Autocast& autocast, bool padded) {}

  /// How many evaluation sums the task keeps (the first: the summed loss).
  virtual int sumCount() const = 0;
  /// Adds one validation batch's sums to `sums` (sumCount() entries).
  virtual void addEvalSums(const at::Tensor& out, const at::Tensor& target,
                           std::vector<double>& sums) const = 0;
  /// The named metrics of the sums over all ranks and `samples` validation
  /// samples (> 0), in the task's order.
  virtual Metrics metrics(const std::vector<double>& sums, double samples) const = 0;
  virtual BestMetric best() const = 0;

  /// The dtype of the targets a data set must give (module_loss: Undefined, any).
  virtual at::ScalarType targetDtype() const = 0;
  /// Validation samples a rank evaluates at once, with training micro-batch
  /// `per_gpu` (data.eval_per_gpu unset): at least 256 by default; a task whose
  /// outputs are large per sample (a language model's T x vocab logits) keeps
  /// to the micro-batch, which is known to fit.
  virtual int64_t evalChunk(int64_t per_gpu) const { return std::max<int64_t>(per_gpu, 256); }
  /// The metrics in the run's closing line, e.g. "eval accuracy 98.61 %".
  virtual std::string describe(const Metrics& m) const;
  /// ... and in an epoch's line, e.g. "eval_acc 98.61 %".
  virtual std::string epochFigures(const Metrics& m) const;
};

/// The task of `kind` (TaskKind::kAuto is not a task: chooseTask() first);
/// `module`: module_loss's TorchScript file (named in its messages).
std::unique_ptr<Task> makeTask(TaskKind kind, const std::string& module = "");

struct DataSplit;

/// Note [task choice]: the run's task and its head, from task.name and the data.
struct TaskChoice {
  TaskKind kind = TaskKind::kClassification;
  std::string why;      ///< e.g. "task.name: auto, y.npy holds float targets"
  int64_t outputs = 0;  ///< the model head's width (module_loss: 0, none)
  std::string module;   ///< module_loss: the TorchScript file, resolved
};
/// Throws ConfigError when the config's task and the data's targets (or the
/// model's forward) disagree. Loads a TorchScript model.path to look at forward.
TaskChoice chooseTask(const Config& cfg, const DataSplit& data);

/// Note [module loss]: whether the run's task is module_loss (task.name module_loss,
/// or auto with a TorchScript model whose forward takes the target), known from
/// the config and the module before the data is loaded: its targets then pass as
/// they are (DataContext::module_targets).
bool trainsModuleLoss(const Config& cfg);

}  // namespace batchdist::worker
