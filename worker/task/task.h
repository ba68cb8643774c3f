#pragma once
// Note [task]: what is specific to the objective lives in one object, the task;
// the trainer, the search and the outputs know only "a weighted loss over real
// samples and a list of named metrics".
//  - Loss: Task::perSampleLoss gives one fp32 loss per sample; the trainer weighs
//    it (Note [loss normalisation] in worker/train/trainer.cc: padding weighs 0,
//    the denominator is the global step's real samples, known on every rank), so
//    a task never sees the split G = m x a x W.
//  - Evaluation: each rank adds its validation batches to the task's sums
//    (addEvalSums), the sums are allreduced once, and metrics() turns the totals
//    into named figures. Every task's first sum is its summed loss (eval_loss).
//  - Metrics travel as a list of (name, value) in the task's order: in the
//    console, metrics.jsonl (eval_<name>), report.json (eval_<name>), report.html,
//    TensorBoard (eval/<name>) and the checkpoint's history (keyed).
//  - The task is chosen once (config `task:`, or inferred from the data: Note
//    [task choice] in worker/task/task.cc) and enters the search cache's key.
// The tasks: classification, regression, and the language model (token windows
// in, logits [n, T, vocab] out; its per-sample loss is the window's mean token
// cross-entropy: Note [language model] in worker/task/task.cc).
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
  virtual at::Tensor perSampleLoss(const at::Tensor& out, const at::Tensor& target) const = 0;

  /// How many evaluation sums the task keeps (the first: the summed loss).
  virtual int sumCount() const = 0;
  /// Adds one validation batch's sums to `sums` (sumCount() entries).
  virtual void addEvalSums(const at::Tensor& out, const at::Tensor& target,
                           std::vector<double>& sums) const = 0;
  /// The named metrics of the sums over all ranks and `samples` validation
  /// samples (> 0), in the task's order.
  virtual Metrics metrics(const std::vector<double>& sums, double samples) const = 0;
  virtual BestMetric best() const = 0;

  /// The dtype of the targets a data set must give.
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

/// The task of `kind` (TaskKind::kAuto is not a task: chooseTask() first).
std::unique_ptr<Task> makeTask(TaskKind kind);

struct DataSplit;

/// Note [task choice]: the run's task and its head, from task.name and the data.
struct TaskChoice {
  TaskKind kind = TaskKind::kClassification;
  std::string why;      ///< e.g. "task.name: auto, y.npy holds float targets"
  int64_t outputs = 0;  ///< the model head's width
};
/// Throws ConfigError when the config's task and the data's targets disagree.
TaskChoice chooseTask(const Config& cfg, const DataSplit& data);

}  // namespace batchdist::worker
