#pragma once
// Optimizers: the plan owns the learning-rate schedule, so every optimizer takes
// its rate at each step.

#include <ATen/core/Tensor.h>

#include <memory>
#include <string>
#include <vector>

#include "worker/config/config.h"

namespace batchdist::worker {

/// An optimizer whose learning rate is set every step (the plan owns the schedule).
class Optimizer {
 public:
  virtual ~Optimizer() = default;
  virtual void step(double lr) = 0;
  virtual void zeroGrad() = 0;
  /// Everything the next step depends on (SGD momentum, Adam moments and step
  /// counts, LARS momentum) as a torch::serialize archive, in memory.
  virtual std::string saveState() = 0;
  /// Restores saveState()'s bytes into the tensors this optimizer updates (not
  /// copies of them). Throws Error when they do not fit (another optimizer or model).
  virtual void loadState(const std::string& bytes, const at::Device& device) = 0;
};

/// A tensor an optimizer updates, and the parameter it is part of: the same
/// tensor, or under dist.shard: optimizer a 1-D piece of it (Note [shard layout]).
/// The rules that look at a parameter as a whole look at `whole`: adamw's decay
/// (by its dimensions) and LARS's trust ratio (its norms and its gradient's).
struct OptimizerParam {
  at::Tensor tensor;
  at::Tensor whole;
};

/// sgd (momentum, nesterov, weight decay), adamw, or lars, over `params`.
/// adamw decays only the tensors of 2 or more dimensions (weights), as GPT-2 and
/// nanoGPT do: biases and norm parameters in a second group without decay.
std::unique_ptr<Optimizer> makeOptimizer(const OptimConfig& cfg, std::vector<at::Tensor> params);
/// The same over tensors that may be pieces of parameters.
std::unique_ptr<Optimizer> makeOptimizer(const OptimConfig& cfg, std::vector<OptimizerParam> params);

/// Note [gradient clipping]: scales the gradients of `params` so that their
/// global L2 norm is at most `max_norm`, and returns the norm before clipping.
/// Called on the synchronised gradient (every rank holds the same one, so every
/// rank clips alike) once per optimizer step, after the fp16 scaler's unscale:
/// under accumulation it sees the whole step's gradient, never a micro-batch's.
double clipGradNorm(const std::vector<at::Tensor>& params, double max_norm);

/// LARS trust ratio of one layer: eta * |w| / (|g| + wd * |w|), or 1 when either
/// norm is zero (You et al. 2017).
double larsTrustRatio(double weight_norm, double grad_norm, double weight_decay, double eta);

}  // namespace batchdist::worker
