#include "worker/train/step/noise_probe.h"

#include <torch/torch.h>

#include "common/error.h"

namespace batchdist::worker {

bool NoiseProbe::beginStep(const Plan& plan, int64_t real, double grad_scale) {
  plan_ = plan;
  step_real_ = real;
  grad_scale_ = grad_scale;
  micro_sq_ = micro_total_sq_ = torch::Tensor();
  now_ = on_ && ticks_++ % every_ == 0;
  return now_;
}

// One rank, a micro-batches: d_k, micro-batch k's share of the gradient, is the
// running gradient minus the previous one (a copy of the gradients kept for it);
// sum_k |d_k|^2 plays sum_r |g_r|^2 with a micro-batches in place of W ranks.
void NoiseProbe::afterMicroBatch(int64_t k, const std::vector<at::Tensor>& params,
                                 at::Device device) {
  if (!wantsMicroBatches()) return;
  torch::NoGradGuard no_grad;
  if (micro_prev_.size() != params.size()) micro_prev_.assign(params.size(), torch::Tensor());
  auto sq = torch::zeros({}, torch::TensorOptions().dtype(torch::kDouble).device(device));
  auto total = sq.clone();
  const bool first = !micro_sq_.defined();
  const bool last = k == plan_.accum - 1;
  for (std::size_t i = 0; i < params.size(); ++i) {
    const auto& g = params[i].grad();
    if (!g.defined()) continue;
    const auto flat = g.reshape({-1});
    if (first || !micro_prev_[i].defined()) {
      sq += torch::dot(flat, flat).to(torch::kDouble);
      micro_prev_[i] = flat.clone();
    } else {
      const auto d = flat - micro_prev_[i];
      sq += torch::dot(d, d).to(torch::kDouble);
      micro_prev_[i].copy_(flat);
    }
    if (last) total += torch::dot(flat, flat).to(torch::kDouble);
  }
  micro_sq_ = first ? sq : micro_sq_ + sq;
  if (last) micro_total_sq_ = total;
}

void NoiseProbe::afterSync(const collective::GradSqNorms& n) {
  if (microNoise(plan_)) {
    if (!micro_total_sq_.defined() || step_real_ != plan_.global) return;
    const auto x = noiseSample(micro_sq_.item<double>(), micro_total_sq_.item<double>(),
                               grad_scale_, plan_.accum, plan_.per_gpu);
    estimator_.add(x.small_sq, x.b_small, x.big_sq, x.b_big);
    return;
  }
  // A padded (or uneven, last_batch: keep) step has ranks of different real
  // batch sizes: Note [gradient noise scale] assumes equal ones, so it is left out.
  if (!n.valid || step_real_ != plan_.global) return;
  // Under dist.shard: gradients one local gradient per micro-batch (n.parts).
  const auto x = noiseSample(n.local_sum, n.summed, grad_scale_, world_ * n.parts,
                             plan_.per_gpu * plan_.accum / n.parts);
  estimator_.add(x.small_sq, x.b_small, x.big_sq, x.b_big);  // skips an fp16 overflow
}

NoiseScaleResult NoiseProbe::result(const Plan& plan, bool local_grads) const {
  NoiseScaleResult r;
  const bool micro = microNoise(plan);
  // Note [sharded gradients]: a local gradient per micro-batch, so B_small = per_gpu.
  r.b_small = micro || local_grads ? plan.per_gpu : plan.per_gpu * plan.accum;
  r.b_big = plan.global;
  r.steps = estimator_.steps();
  r.measured = estimator_.steps() > 0;
  if (!on_) {
    r.why_not = "train.noise_scale is off";
  } else if (world_ < 2 && plan.accum < 2) {
    r.why_not = "it needs two batch sizes: at least 2 ranks (per rank and global), or "
                "batch.accum > 1 on one rank (micro-batch and step)";
  } else if (!r.measured) {
    r.why_not = "no step with every sample real was measured";
  }
  if (r.measured) {
    r.b_simple = estimator_.bSimple();
    r.grad_sq = estimator_.gradSq();
    r.trace = estimator_.trace();
    // |G|^2 is estimated without bias but with a spread of about tr(S) / B_big per
    // step: far below B_simple its average can come out <= 0.
    if (r.b_simple <= 0) {
      r.why_not = strCat("the smoothed |G|^2 estimate is not positive: the gradient's signal is "
                         "below what the global batch of ", plan.global,
                         " resolves, so B_simple is far above it");
    }
  }
  return r;
}

}  // namespace batchdist::worker
