#pragma once
// Optimizers: the plan owns the learning-rate schedule, so every optimizer takes
// its rate at each step.

#include <ATen/core/Tensor.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "worker/config/config.h"

namespace batchdist::worker {

// StepKernels (optim.kernels) is declared with the config (worker/config/config.h).

/// What `asked` runs as for tensors on CUDA or not (never kAuto): kFused only
/// where this LibTorch has the fused kernels.
StepKernels resolveStepKernels(StepKernels asked, bool on_cuda);

/// An optimizer whose learning rate is set every step (the plan owns the schedule).
class Optimizer {
 public:
  virtual ~Optimizer() = default;
  virtual void step(double lr) = 0;
  virtual void zeroGrad() = 0;
  /// How step() runs (resolved: never kAuto).
  virtual StepKernels kernels() const = 0;
  /// Everything the next step depends on (SGD momentum, Adam moments and step
  /// counts, LARS momentum) as a torch::serialize archive, in memory.
  virtual std::string saveState() = 0;
  /// Restores saveState()'s bytes into the tensors this optimizer updates (not
  /// copies of them). Throws Error when they do not fit (another optimizer or model).
  virtual void loadState(const std::string& bytes, const at::Device& device) = 0;

  // Note [optimizer state vectors]: the same state, tensor by tensor, as element-wise
  // vectors (each tensor's, flattened, in the order the optimizer was given its
  // tensors) and a step count per tensor. A sharded checkpoint (Note [sharded
  // checkpoint]) moves the state this way, so that any slicing of the tensors can
  // write it and any other read it. An optimizer with no state for a tensor yet
  // (before its first step) reads as zeros and step 0, which is what its first
  // step would start from.

  /// The vectors each tensor carries: sgd with momentum and lars "momentum",
  /// adamw "exp_avg", "exp_avg_sq"; sgd without momentum none.
  virtual std::vector<std::string> stateNames() const = 0;
  /// Tensor i's vector k, flattened (numel of tensor i).
  virtual at::Tensor stateVector(std::size_t i, std::size_t k) = 0;
  /// Overwrites tensor i's vector k with `values` (numel of tensor i, any device).
  virtual void setStateVector(std::size_t i, std::size_t k, const at::Tensor& values) = 0;
  /// Tensor i's step count (adamw's bias correction); 0 where none is kept.
  virtual int64_t stepCount(std::size_t i) = 0;
  virtual void setStepCount(std::size_t i, int64_t steps) = 0;
  /// Bytes of the state this optimizer holds now (none before its first step).
  virtual int64_t stateBytes() = 0;

  /// Whether step() reads whole layers' gradient norms (LARS's trust ratio).
  virtual bool needsWholeGradNorms() const { return false; }
  /// The next step's whole-layer gradient norms, one per tensor given (Note
  /// [sharded gradients]: no rank holds a whole layer's gradient, the strategy
  /// sums them); used by that step only. Ignored by optimizers that read none.
  virtual void setWholeGradNorms(std::vector<double> /*norms*/) {}
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
/// Its step runs as cfg.kernels says (resolveStepKernels).
std::unique_ptr<Optimizer> makeOptimizer(const OptimConfig& cfg, std::vector<at::Tensor> params);
/// The same over tensors that may be pieces of parameters.
std::unique_ptr<Optimizer> makeOptimizer(const OptimConfig& cfg, std::vector<OptimizerParam> params);

/// Note [gradient clipping]: scales the gradients of `params` so that their
/// global L2 norm is at most `max_norm`, and returns the norm before clipping.
/// Called on the synchronised gradient (every rank holds the same one, so every
/// rank clips alike) once per optimizer step, after the fp16 scaler's unscale:
/// under accumulation it sees the whole step's gradient, never a micro-batch's.
double clipGradNorm(const std::vector<at::Tensor>& params, double max_norm);
/// What clipGradNorm multiplies the gradients by at global norm `norm`: 1 when
/// the norm is within `max_norm` or not finite (the fp16 scaler has already
/// skipped such a step, and otherwise the health check names it).
double clipCoefficient(double norm, double max_norm);

/// LARS trust ratio of one layer: eta * |w| / (|g| + wd * |w|), or 1 when either
/// norm is zero (You et al. 2017).
double larsTrustRatio(double weight_norm, double grad_norm, double weight_decay, double eta);

}  // namespace batchdist::worker
