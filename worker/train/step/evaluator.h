#pragma once
// Distributed evaluation: every validation sample counts exactly once over all
// ranks, with rank 0's BatchNorm statistics (as DDP's broadcast_buffers).

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>

#include "collective/communicator.h"
#include "worker/config/config.h"
#include "worker/data/data.h"
#include "worker/data/loader.h"
#include "worker/task/metrics.h"

namespace batchdist::worker {

class Model;
class Task;

struct EvalResult {
  double loss = 0;
  Metrics metrics;  ///< the task's, over every validation sample (empty: none)
  int64_t samples = 0;
};

/// Evaluates a model on the validation set, this rank's shard of it, with the
/// task's sums (Note [task]). Holds references to the communicator, the model, the
/// task and the validation set; each must outlive it.
class Evaluator {
 public:
  /// `val`: the validation set (it may be empty). `loader`: its decoded form for a
  /// decoded source (Note [loader]), else null: the in-memory samples are then
  /// gathered here and normalised by `transform` (the evaluation transform).
  /// `eval_per_gpu`: batch.eval_per_gpu (0: the per-GPU batch, at least 256);
  /// `precision`: train.precision (the forward's autocast).
  Evaluator(collective::Communicator& comm, Model& model, const Task& task, const Dataset& val,
            std::unique_ptr<Loader> loader, Transform transform, at::Device device,
            Precision precision, int64_t eval_per_gpu);
  ~Evaluator();
  Evaluator(const Evaluator&) = delete;
  Evaluator& operator=(const Evaluator&) = delete;

  /// Takes rank 0's BatchNorm buffers, then evaluates this rank's shard of the
  /// validation set in chunks of batch.eval_per_gpu (0: max(`per_gpu`, 256));
  /// the task's sums and the sample count meet in one allreduce. Collective: a
  /// broadcast, then an allreduce, on every rank, validation set or not.
  EvalResult evaluate(int64_t per_gpu);

  /// The validation set's loader (a decoded source), else null: its bad files
  /// count in report.json's data_errors (gatherDataFigures).
  const Loader* loader() const { return loader_.get(); }

  /// The mean wall time of the evaluations so far (this rank); -1: none yet.
  double meanSeconds() const { return count_ > 0 ? seconds_ / count_ : -1; }

 private:
  collective::Communicator& comm_;
  Model& model_;
  const Task& task_;
  const Dataset& val_;
  std::unique_ptr<Loader> loader_;  ///< decoded validation sets (Note [loader])
  Transform transform_;
  at::Device device_;
  Precision precision_;
  int64_t eval_per_gpu_;
  double seconds_ = 0;
  int64_t count_ = 0;
};

}  // namespace batchdist::worker
