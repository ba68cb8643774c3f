#include "worker/train/shard/sharded_gradients.h"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <utility>

#include "collective/recording_comm.h"
#include "common/error.h"
#include "worker/train/shard/gradient_scatter.h"
#include "worker/train/shard/param_units.h"
#include "worker/train/shard/sharded_optimizer.h"

namespace batchdist::worker {
namespace {

/// Where the partial sums sit in sumGradients()' allreduce (Note [sharded gradients]).
constexpr std::size_t kLocalSq = collective::kSideSlots, kShardSq = kLocalSq + 1,
                      kLayers = kShardSq + 1;

class ShardedGradientUpdate : public UpdateStrategyBase {
 public:
  /// `units` (Note [parameter units]): dist.shard: parameters; empty: gradients.
  ShardedGradientUpdate(const Config& cfg, collective::Communicator& comm,
                        std::vector<at::Tensor> params, std::vector<ParamUnit> units);

  void zeroGrad() override;
  void dropGrad() override { zeroGrad(); }
  void beforeBackward(int64_t micro, int64_t micros) override;
  /// dist.shard: gradients: nothing (sumGradients() closes the open round and makes
  /// the ones missed); parameters: Note [collective replay].
  void backwardFailed() override;
  collective::SideChannel sumGradients(const collective::SideChannel& side) override;
  void setMeasureNorms(bool on) override {
    measure_ = on && comm_.size() > 1;
    scatter_->setMeasureNorms(measure_);
  }
  const collective::GradSqNorms& lastNorms() const override { return norms_; }
  double lastSkewSeconds() const override { return 0; }

  bool step(double lr) override;
  Optimizer& optimizer() override { return *optimizer_; }
  UpdateMemory memory() const override;
  UnitHooks* unitHooks() override { return units_.get(); }

 private:
  /// The sum of |piece|^2 per parameter of this rank's pieces (LARS) and of all.
  std::vector<double> partialSums() const;
  collective::Communicator& comm_;
  std::vector<at::Tensor> params_;
  /// dist.shard: parameters: the units' and the scatter's communicator, each
  /// micro-batch a stretch (Note [collective replay]); outlives both.
  std::unique_ptr<collective::RecordingCommunicator> recorder_;
  std::unique_ptr<ParamUnits> units_;  ///< dist.shard: parameters only; outlives scatter_'s hooks
  std::unique_ptr<ShardedOptimizer> optimizer_;
  at::Tensor shard_;         ///< this rank's chunks of the summed gradient, end to end
  std::unique_ptr<GradientScatter> scatter_;  ///< Note [gradient scatter]: fills shard_
  int64_t micro_ = 0;        ///< the micro-batch running (beforeBackward's `micro`)
  int64_t micros_ = 1;       ///< the step's micro-batches (beforeBackward's `micros`)
  bool measure_ = false;
  collective::GradSqNorms norms_;
  std::vector<double> summed_;  ///< the last sumGradients()' allreduce
};

ShardedGradientUpdate::ShardedGradientUpdate(const Config& cfg, collective::Communicator& comm,
                                             std::vector<at::Tensor> params,
                                             std::vector<ParamUnit> units)
    : UpdateStrategyBase(cfg), comm_(comm), params_(std::move(params)) {
  if (params_.empty()) {
    throw ConfigError(strCat("dist.shard: ", toString(cfg.dist.shard),
                             ": the model has no trainable parameters"));
  }
  if (!units.empty()) {  // Note [parameter units]: a segment per unit
    recorder_ = std::make_unique<collective::RecordingCommunicator>(comm);
    units_ = std::make_unique<ParamUnits>(*recorder_, params_, std::move(units),
                                          cfg.dist.reshard_after_forward, cfg.dist.prefetch);
    optimizer_ = std::make_unique<ShardedOptimizer>(cfg.optim, comm, params_, units_->layout(),
                                                    units_->owned());
  } else {
    const auto element = static_cast<int64_t>(params_.front().element_size());
    const auto segment = static_cast<int64_t>(cfg.dist.bucket_mb * (1 << 20)) / element;
    optimizer_ = std::make_unique<ShardedOptimizer>(cfg.optim, comm, params_, std::max<int64_t>(1, segment));
  }
  shard_ = torch::zeros({optimizer_->layout().slice}, params_.front().options().requires_grad(false));
  optimizer_->useShardGradient(shard_);
  // Note [parameter units]: the reduce-scatters start from the hooks as under
  // gradients; they interleave with the gathers backward makes in one order on
  // every rank (the same backward, the segments' reverse order: units run
  // backward in it), the same in every micro-batch (Note [collective replay]).
  scatter_ = std::make_unique<GradientScatter>(recorder_ ? *recorder_ : comm, params_,
                                               optimizer_->layout(), shard_, cfg.dist.overlap,
                                               /*learn_order=*/!units_);
  if (units_) scatter_->setSegmentDone([u = units_.get()](std::size_t k) { u->gradientsIn(k); });
  zeroGrad();
}

void ShardedGradientUpdate::zeroGrad() { scatter_->beginStep(); }

void ShardedGradientUpdate::beforeBackward(int64_t micro, int64_t micros) {
  micro_ = micro;
  micros_ = std::max<int64_t>(1, micros);
  scatter_->beginRound();  // closes the last micro-batch's round: its collectives
  if (recorder_) recorder_->begin();
}

// Note [collective replay]: this rank left micro-batch micro_ early; the others
// go on gathering units and reduce-scattering through the rest of the step.
void ShardedGradientUpdate::backwardFailed() {
  if (!units_) return;
  units_->endBackward();  // waits for the prefetches in flight, frees every unit
  scatter_->abandonStep(micros_);
  if (recorder_->replayRest(micros_ - micro_ - 1)) return;
  throw TrainingError(strCat(
      "out of memory on rank ", comm_.rank(), " under dist.shard: parameters before a micro-batch "
      "had completed, so this rank cannot know which unit all-gathers and reduce-scatters the "
      "others are making (Note [collective replay]) and the run stops; lower batch.per_gpu "
      "(raising batch.accum keeps the global batch) or set model.recompute: on"));
}

std::vector<double> ShardedGradientUpdate::partialSums() const {
  const bool layers = optimizer_->needsWholeGradNorms();
  std::vector<double> out(kLayers + (layers ? params_.size() : 0), 0.0);
  const auto& pieces = optimizer_->pieces();
  if (pieces.empty()) return out;
  std::vector<at::Tensor> sq;
  for (const auto& piece : pieces) {
    sq.push_back(shard_.narrow(0, piece.owned, piece.length).to(torch::kDouble).square().sum());
  }
  const auto host = torch::stack(sq).cpu();
  const double* v = host.data_ptr<double>();
  for (std::size_t j = 0; j < pieces.size(); ++j) {
    out[kShardSq] += v[j];
    if (layers) out[kLayers + static_cast<std::size_t>(pieces[j].param)] += v[j];
  }
  return out;
}

collective::SideChannel ShardedGradientUpdate::sumGradients(const collective::SideChannel& side) {
  scatter_->endStep(micros_);
  if (recorder_) recorder_->end();  // the last micro-batch's round closed: a whole one
  if (units_) units_->endBackward();
  auto values = partialSums();
  std::copy(side.begin(), side.end(), values.begin());
  values[kLocalSq] = measure_ ? scatter_->localSq().item<double>() : 0.0;
  summed_ = comm_.allreduce(values, collective::ReduceOp::kSum);
  norms_ = collective::GradSqNorms();
  if (measure_) norms_ = {summed_[kLocalSq], summed_[kShardSq], true, micros_};
  collective::SideChannel out{};
  std::copy(summed_.begin(), summed_.begin() + collective::kSideSlots, out.begin());
  return out;
}

bool ShardedGradientUpdate::step(double lr) {
  torch::NoGradGuard no_grad;
  const double scale = lossScale();
  if (scaler_) {
    // Every rank has the same sum, so the same verdict (Note [sharded gradients]).
    if (!scaler_->update(!std::isfinite(summed_[kShardSq]))) return false;
    shard_.mul_(1.0 / scale);
  }
  double coef = 1;  // Note [gradient clipping] on the shard, by the global norm
  if (clip_norm_ > 0) coef = recordClip(std::sqrt(summed_[kShardSq]) / scale);
  if (coef != 1) shard_.mul_(coef);
  if (optimizer_->needsWholeGradNorms()) {
    std::vector<double> norms;
    for (std::size_t i = 0; i < params_.size(); ++i) {
      norms.push_back(std::sqrt(summed_[kLayers + i]) / scale * coef);
    }
    optimizer_->setWholeGradNorms(std::move(norms));
  }
  optimizer_->step(lr);
  return true;
}

UpdateMemory ShardedGradientUpdate::memory() const {
  constexpr double kMb = 1 << 20;
  UpdateMemory m;
  if (units_) {  // Note [parameter units]: the shard, and the units whole at most at once
    m.parameters_mb = static_cast<double>(units_->owned().nbytes() + units_->peakLiveBytes()) / kMb;
  } else {
    for (const auto& p : params_) m.parameters_mb += static_cast<double>(p.nbytes()) / kMb;
  }
  m.gradients_mb = static_cast<double>(shard_.nbytes()) / kMb;
  m.optimizer_state_mb = static_cast<double>(optimizer_->stateBytes()) / kMb;
  return m;
}

}  // namespace

std::unique_ptr<UpdateStrategy> makeShardedGradientUpdate(const Config& cfg,
                                                          collective::Communicator& comm,
                                                          std::vector<at::Tensor> params) {
  return std::make_unique<ShardedGradientUpdate>(cfg, comm, std::move(params), std::vector<ParamUnit>{});
}

std::unique_ptr<UpdateStrategy> makeShardedParameterUpdate(const Config& cfg,
                                                           collective::Communicator& comm,
                                                           std::vector<at::Tensor> params,
                                                           std::vector<ParamUnit> units) {
  if (units.empty()) {
    throw ConfigError("dist.shard: parameters: this model has no parameter units (Note [parameter "
                      "units]); use dist.shard: gradients");
  }
  return std::make_unique<ShardedGradientUpdate>(cfg, comm, std::move(params), std::move(units));
}

}  // namespace batchdist::worker
