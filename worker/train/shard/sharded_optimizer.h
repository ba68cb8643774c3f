#pragma once
// dist.shard: optimizer (ZeRO-1) and gradients (ZeRO-2): each rank keeps and steps
// the optimizer state of its 1/W of the parameters, then the parameters are
// all-gathered (Note [sharded optimizer]).

#include <ATen/core/Tensor.h>

#include <memory>
#include <vector>

#include "collective/communicator.h"
#include "worker/config/config.h"
#include "worker/model/optimizer.h"
#include "worker/train/shard/shard_layout.h"

namespace batchdist::worker {

/// Note [sharded optimizer]: under dist.shard: optimizer the gradients are summed
/// as under plain data parallel (every rank holds the whole summed gradient, so
/// its readers, Note [update strategy], are unchanged), but the optimizer holds
/// state for rank r's slice of Note [shard layout] only, and steps only that:
///  - at construction the trainable parameters are moved into one flat buffer of
///    W x n elements (set_data: the same parameter objects, now views of it), so
///    rank r's slice is one contiguous range, and an inner optimizer (sgd, adamw,
///    lars: Optimizer over OptimizerParam) is built over the pieces, 1-D views of
///    that range, each knowing the parameter it is part of (adamw's decay rule,
///    LARS's whole-layer norms);
///  - step(lr) points each piece's gradient at its range of the parameter's
///    summed gradient, steps the inner optimizer (which updates the pieces, and so
///    the parameters, in place), and all-gathers the slices in place
///    (Communicator::allgatherInto), so every rank holds every updated parameter
///    for the next forward, the health check, evaluation and checkpoints.
/// The element-wise rules (sgd, adamw, lars given the whole-layer ratio) do per
/// element what they do on the whole tensor, so the updates equal the unsharded
/// run's (tests/shard_test.cc measures how closely). Optimizer state per rank:
/// 1/W of the unsharded one (the last ranks' slices may hold the pad instead of
/// parameters). The parameters need one dtype (a ConfigError names the others).
/// Under dist.shard: gradients (Note [sharded gradients]) the layout has a segment
/// per bucket, each all-gathered on its own, and the pieces' gradients are views of
/// the rank's shard of the summed gradient (useShardGradient) instead of ranges of
/// the parameters' (which that strategy frees); LARS then takes each layer's
/// gradient norm from the strategy (setWholeGradNorms), since no rank holds a
/// whole layer's gradient.
class ShardedOptimizer : public Optimizer {
 public:
  /// `segment_elements`: Note [shard layout]'s segment size (0: one segment).
  ShardedOptimizer(const OptimConfig& cfg, collective::Communicator& comm,
                   std::vector<at::Tensor> params, int64_t segment_elements = 0);
  /// Under dist.shard: parameters (Note [parameter units]): the pieces are views
  /// of `owned` (this rank's shard of the parameters, in `layout`, which
  /// ParamUnits keeps), and step() all-gathers nothing: the next forward gathers
  /// each unit as it runs.
  ShardedOptimizer(const OptimConfig& cfg, collective::Communicator& comm,
                   std::vector<at::Tensor> params, ShardLayout layout, at::Tensor owned);

  void step(double lr) override;
  void zeroGrad() override;
  StepKernels kernels() const override { return inner_->kernels(); }
  std::string saveState() override;
  /// A sharded state is not one rank's bytes: Note [sharded checkpoint] writes and
  /// reads it. These two throw Error, naming that.
  void loadState(const std::string& bytes, const at::Device& device) override;
  // Note [optimizer state vectors] over this rank's pieces (i: a piece).
  std::vector<std::string> stateNames() const override { return inner_->stateNames(); }
  at::Tensor stateVector(std::size_t i, std::size_t k) override { return inner_->stateVector(i, k); }
  void setStateVector(std::size_t i, std::size_t k, const at::Tensor& values) override {
    inner_->setStateVector(i, k, values);
  }
  int64_t stepCount(std::size_t i) override { return inner_->stepCount(i); }
  void setStepCount(std::size_t i, int64_t steps) override { inner_->setStepCount(i, steps); }
  int64_t stateBytes() override { return inner_->stateBytes(); }
  bool needsWholeGradNorms() const override { return inner_->needsWholeGradNorms(); }
  /// `norms`: one per parameter (not per piece), as the inner optimizer's whole.
  void setWholeGradNorms(std::vector<double> norms) override;

  /// From now on each piece's gradient is its range of `shard` (this rank's
  /// chunks end to end, layout().slice elements), not of its parameter's gradient.
  void useShardGradient(at::Tensor shard) { shard_grad_ = std::move(shard); }

  const ShardLayout& layout() const { return layout_; }
  /// This rank's pieces, in flat order (Note [shard layout]).
  const std::vector<ShardPiece>& pieces() const { return pieces_; }
  /// The trainable parameters, in order.
  const std::vector<at::Tensor>& params() const { return params_; }
  /// An unsharded optimizer of the same config over the same parameters (to read
  /// an unsharded checkpoint's state: Note [sharded checkpoint]).
  std::unique_ptr<Optimizer> makeWhole() const { return makeOptimizer(cfg_, params_); }

 private:
  OptimConfig cfg_;
  collective::Communicator& comm_;
  std::vector<at::Tensor> params_;
  void buildInner(const at::Tensor& space, bool owned);

  ShardLayout layout_;
  at::Tensor flat_;                  ///< W x n elements: every parameter, then the pad (undefined
                                     ///< under dist.shard: parameters)
  std::vector<ShardPiece> pieces_;   ///< this rank's
  std::vector<at::Tensor> tensors_;  ///< pieces_' views of flat_, what inner_ steps
  std::unique_ptr<Optimizer> inner_;
  at::Tensor shard_grad_;            ///< Note [sharded gradients]; undefined under ZeRO-1
};

}  // namespace batchdist::worker
