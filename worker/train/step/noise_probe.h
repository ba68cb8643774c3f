#pragma once
// The gradient noise scale's probe, beside the update strategy: which steps
// measure (Note [noise cadence]), one rank's micro-batch sums, and the
// estimator they feed (Note [gradient noise scale] in noise_scale.h).

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "collective/grad_sync.h"
#include "worker/plan/plan.h"
#include "worker/train/step/noise_scale.h"
#include "worker/train/result.h"

namespace batchdist::worker {

/// One StepEngine's probe. Each step: beginStep() before the micro-batches,
/// afterMicroBatch() after each one's backward, afterSync() after the gradient
/// sum of a step that stands (a failed try is redone: Note [oom back-off]).
class NoiseProbe {
 public:
  /// `on`: train.noise_scale; `every`: train.noise_scale_every; `world`: ranks.
  NoiseProbe(bool on, int64_t every, int world) : on_(on), every_(every), world_(world) {}

  /// A step of `plan` with `real` real samples over all ranks whose gradients
  /// carry the loss scale `grad_scale` begins. Returns whether it measures the
  /// norms (UpdateStrategy::setMeasureNorms): every rank counts the same steps,
  /// so all agree whether this one carries its norm in the allreduce.
  bool beginStep(const Plan& plan, int64_t real, double grad_scale);
  /// Whether this step wants afterMicroBatch() (one rank with accumulation, measuring).
  bool wantsMicroBatches() const { return now_ && microNoise(plan_); }
  /// After micro-batch `k`'s backward: one rank with accumulation sums |d_k|^2.
  void afterMicroBatch(int64_t k, const std::vector<at::Tensor>& params, at::Device device);
  /// After the step's gradient sum, `norms` the update strategy's.
  void afterSync(const collective::GradSqNorms& norms);
  /// The estimate for the report, for `plan` (the split the run ended with);
  /// `local_grads`: every micro-batch left a local gradient of its own (Note
  /// [sharded gradients]: dist.shard: gradients on several ranks).
  NoiseScaleResult result(const Plan& plan, bool local_grads) const;

  NoiseScaleEstimator& estimator() { return estimator_; }
  const NoiseScaleEstimator& estimator() const { return estimator_; }
  /// Steps begun so far (Note [noise cadence]; an adaptive checkpoint keeps it).
  int64_t ticks() const { return ticks_; }
  void setTicks(int64_t ticks) { ticks_ = ticks; }

 private:
  /// One rank with accumulation: the micro-batches give B_small.
  bool microNoise(const Plan& plan) const { return on_ && world_ == 1 && plan.accum > 1; }

  bool on_;
  int64_t every_;
  int world_;
  NoiseScaleEstimator estimator_;
  Plan plan_;              ///< the current step's
  double grad_scale_ = 1;  ///< fp16 loss scale the current gradients carry
  int64_t step_real_ = 0;  ///< real samples of the current step, all ranks
  // Note [noise cadence]: steps started so far (the same count on every rank, OOM
  // retries included) and whether the current one measures the norms.
  int64_t ticks_ = 0;
  bool now_ = false;
  // The previous micro-batch's running gradient; sum of |d_k|^2; the step's |g|^2.
  std::vector<at::Tensor> micro_prev_;
  at::Tensor micro_sq_, micro_total_sq_;
};

}  // namespace batchdist::worker
