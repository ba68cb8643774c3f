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

/// sgd (momentum, nesterov, weight decay), adamw, or lars, over `params`.
std::unique_ptr<Optimizer> makeOptimizer(const OptimConfig& cfg, std::vector<at::Tensor> params);

/// LARS trust ratio of one layer: eta * |w| / (|g| + wd * |w|), or 1 when either
/// norm is zero (You et al. 2017).
double larsTrustRatio(double weight_norm, double grad_norm, double weight_decay, double eta);

}  // namespace batchdist::worker
