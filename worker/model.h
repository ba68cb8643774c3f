#pragma once
// Built-in models and optimizers.

#include <torch/torch.h>

#include <memory>
#include <string>
#include <vector>

#include "worker/config.h"

namespace batchdist::worker {

/// Builds the model of `cfg` for samples of `sample_shape` and `classes` outputs.
/// Throws ConfigError when the model does not fit the data (e.g. cnn on flat features).
torch::nn::Sequential buildModel(const ModelConfig& cfg, const std::vector<int64_t>& sample_shape,
                                 int64_t classes);

/// True if any submodule is a BatchNorm layer.
bool hasBatchNorm(const torch::nn::Module& model);

/// Parameters and buffers (BatchNorm running statistics), in a fixed order.
std::vector<torch::Tensor> modelState(const torch::nn::Module& model);

/// An optimizer whose learning rate is set every step (the plan owns the schedule).
class Optimizer {
 public:
  virtual ~Optimizer() = default;
  virtual void step(double lr) = 0;
  virtual void zeroGrad() = 0;
};

/// sgd (momentum, nesterov, weight decay), adamw, or lars.
std::unique_ptr<Optimizer> makeOptimizer(const OptimConfig& cfg, torch::nn::Module& model);

/// LARS trust ratio of one layer: eta * |w| / (|g| + wd * |w|), or 1 when either
/// norm is zero (You et al. 2017).
double larsTrustRatio(double weight_norm, double grad_norm, double weight_decay, double eta);

}  // namespace batchdist::worker

namespace batchdist::worker {
/// Whether the configured model has BatchNorm layers (known before building it).
inline bool modelHasBatchNorm(const ModelConfig& cfg) { return cfg.batchnorm; }
}  // namespace batchdist::worker
