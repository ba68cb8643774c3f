#include "worker/train/step/update_strategy.h"

#include <algorithm>
#include <cstddef>
#include <utility>

#include "worker/train/shard/sharded_gradients.h"
#include "worker/train/shard/sharded_optimizer.h"

namespace batchdist::worker {
namespace {

/// Plain data parallel (Note [update strategy]): an allreduce of the whole
/// gradient (the Reducer or the GradientSynchronizer), then the same whole step
/// on every rank.
class DataParallelUpdate : public UpdateStrategyBase {
 public:
  DataParallelUpdate(const Config& cfg, collective::Communicator& comm,
                     std::vector<at::Tensor> params);

  void zeroGrad() override { sync_->zeroGrad(); }
  void dropGrad() override { sync_->dropGrad(); }
  void beforeBackward(int64_t micro, int64_t micros) override {
    sync_->beforeBackward(micro == micros - 1);
  }
  void backwardFailed() override { sync_->backwardFailed(); }
  collective::SideChannel sumGradients(const collective::SideChannel& side) override {
    return sync_->sumGradients(side);
  }
  void setMeasureNorms(bool on) override { sync_->setMeasureNorms(on); }
  const collective::GradSqNorms& lastNorms() const override { return sync_->lastNorms(); }
  double lastSkewSeconds() const override { return sync_->lastSkewSeconds(); }

  bool step(double lr) override;
  Optimizer& optimizer() override { return *optimizer_; }
  UpdateMemory memory() const override;

 private:
  std::vector<at::Tensor> params_;  ///< the trainable ones (Note [frozen parameters])
  std::unique_ptr<Optimizer> optimizer_;
  std::unique_ptr<collective::GradientSync> sync_;  ///< Note [gradient sync]
};

DataParallelUpdate::DataParallelUpdate(const Config& cfg, collective::Communicator& comm,
                                       std::vector<at::Tensor> params)
    : UpdateStrategyBase(cfg), params_(std::move(params)) {
  // Note [sharded optimizer]: first, since it moves the parameters into its flat buffer.
  // dist.shard: gradients on one rank: the shard is the whole gradient (ZeRO-1's path).
  if (cfg.dist.shard == Shard::kOptimizer || cfg.dist.shard == Shard::kGradients ||
      cfg.dist.shard == Shard::kParameters) {
    optimizer_ = std::make_unique<ShardedOptimizer>(cfg.optim, comm, params_);
  } else {
    optimizer_ = makeOptimizer(cfg.optim, params_);
  }
  const auto bucket_bytes = static_cast<std::size_t>(cfg.dist.bucket_mb * (1 << 20));
  sync_ = collective::makeGradientSync(cfg.dist.overlap, comm, params_, bucket_bytes);
}

bool DataParallelUpdate::step(double lr) {
  // fp16: gradients are already summed over ranks, so every rank reaches the same verdict.
  if (scaler_ && !unscaleOrSkip(*scaler_, params_)) return false;  // the scale backed off
  // Note [gradient clipping]: the gradients are the synchronised ones (the same on
  // every rank) and, under fp16, already unscaled; once per step, whatever the accumulation.
  if (clip_norm_ > 0) recordClip(clipGradNorm(params_, clip_norm_));
  optimizer_->step(lr);
  return true;
}

UpdateMemory DataParallelUpdate::memory() const {
  constexpr double kMb = 1 << 20;
  UpdateMemory m;
  for (const auto& p : params_) {
    m.parameters_mb += static_cast<double>(p.nbytes()) / kMb;
    if (p.grad().defined()) m.gradients_mb += static_cast<double>(p.grad().nbytes()) / kMb;
  }
  m.optimizer_state_mb = static_cast<double>(optimizer_->stateBytes()) / kMb;
  return m;
}

}  // namespace

UpdateStrategyBase::UpdateStrategyBase(const Config& cfg) : clip_norm_(cfg.optim.clip_grad_norm) {
  if (cfg.train.precision == Precision::kFp16) {
    scaler_ = std::make_unique<LossScaler>(cfg.train.loss_scale, cfg.train.scale_growth_interval);
  }
}

double UpdateStrategyBase::recordClip(double norm) {
  ++clip_.steps;
  if (norm > clip_norm_) ++clip_.clipped;
  clip_.last_norm = norm;
  clip_.max_norm = std::max(clip_.max_norm, norm);
  return clipCoefficient(norm, clip_norm_);
}

bool shardsGradients(const DistConfig& dist, int64_t world) {
  return (dist.shard == Shard::kGradients || dist.shard == Shard::kParameters) && world > 1;
}

bool shardsParameters(const DistConfig& dist, int64_t world) {
  return dist.shard == Shard::kParameters && world > 1;
}

std::unique_ptr<UpdateStrategy> makeUpdateStrategy(const Config& cfg,
                                                   collective::Communicator& comm,
                                                   std::vector<at::Tensor> params,
                                                   std::vector<ParamUnit> units) {
  if (shardsParameters(cfg.dist, comm.size())) {
    return makeShardedParameterUpdate(cfg, comm, std::move(params), std::move(units));
  }
  if (shardsGradients(cfg.dist, comm.size())) {
    return makeShardedGradientUpdate(cfg, comm, std::move(params));
  }
  return std::make_unique<DataParallelUpdate>(cfg, comm, std::move(params));
}

}  // namespace batchdist::worker
