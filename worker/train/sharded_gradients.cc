#include "worker/train/sharded_gradients.h"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <utility>

#include "worker/train/sharded_optimizer.h"

namespace batchdist::worker {
namespace {

/// Where the partial sums sit in sumGradients()' allreduce (Note [sharded gradients]).
constexpr std::size_t kLocalSq = collective::kSideSlots, kShardSq = kLocalSq + 1,
                      kLayers = kShardSq + 1;

class ShardedGradientUpdate : public UpdateStrategyBase {
 public:
  ShardedGradientUpdate(const Config& cfg, collective::Communicator& comm,
                        std::vector<at::Tensor> params);

  void zeroGrad() override;
  void dropGrad() override { zeroGrad(); }
  void beforeBackward(int64_t micro, int64_t micros) override;
  void backwardFailed() override;
  collective::SideChannel sumGradients(const collective::SideChannel& side) override;
  void setMeasureNorms(bool on) override { measure_ = on && comm_.size() > 1; }
  const collective::GradSqNorms& lastNorms() const override { return norms_; }
  double lastSkewSeconds() const override { return 0; }

  bool step(double lr) override;
  Optimizer& optimizer() override { return *optimizer_; }
  UpdateMemory memory() const override;

 private:
  /// The current micro-batch's gradients into the shard (one reduce-scatter per segment).
  void flush();
  /// The sum of |piece|^2 per parameter of this rank's pieces (LARS) and of all.
  std::vector<double> partialSums() const;
  collective::Communicator& comm_;
  std::vector<at::Tensor> params_;
  std::unique_ptr<ShardedOptimizer> optimizer_;
  at::Tensor shard_;         ///< this rank's chunks of the summed gradient, end to end
  int64_t micros_ = 1;       ///< the step's micro-batches (beforeBackward's `micros`)
  int64_t flushed_ = 0;      ///< reduce-scatters made this step
  bool measure_ = false;
  at::Tensor local_sq_;      ///< this step's own |g|^2, one term per micro-batch (double, on the device)
  collective::GradSqNorms norms_;
  std::vector<double> summed_;  ///< the last sumGradients()' allreduce
};

ShardedGradientUpdate::ShardedGradientUpdate(const Config& cfg, collective::Communicator& comm,
                                             std::vector<at::Tensor> params)
    : UpdateStrategyBase(cfg), comm_(comm), params_(std::move(params)) {
  const int64_t element = params_.empty() ? 4 : static_cast<int64_t>(params_.front().element_size());
  const auto segment = static_cast<int64_t>(cfg.dist.bucket_mb * (1 << 20)) / element;
  optimizer_ = std::make_unique<ShardedOptimizer>(cfg.optim, comm, params_, std::max<int64_t>(1, segment));
  shard_ = torch::zeros({optimizer_->layout().slice}, params_.front().options().requires_grad(false));
  optimizer_->useShardGradient(shard_);
  zeroGrad();
}

void ShardedGradientUpdate::zeroGrad() {
  for (auto& p : params_) p.mutable_grad() = at::Tensor();
  shard_.zero_();
  flushed_ = 0;
  local_sq_ = torch::zeros({}, shard_.options().dtype(torch::kDouble));
}

void ShardedGradientUpdate::beforeBackward(int64_t micro, int64_t micros) {
  micros_ = std::max<int64_t>(1, micros);
  if (micro > 0) flush();
}

// Every rank makes micros_ reduce-scatters a step (micros_ - 1 before the last
// backward, one in sumGradients()): a rank that failed makes the ones it missed.
void ShardedGradientUpdate::backwardFailed() {
  while (flushed_ < micros_ - 1) flush();
}

void ShardedGradientUpdate::flush() {
  torch::NoGradGuard no_grad;
  const auto& l = optimizer_->layout();
  for (const auto& s : l.segments) {
    if (s.chunk == 0) continue;
    auto buffer = torch::zeros({s.chunk * l.ranks}, shard_.options());
    for (int64_t i = s.first; i < s.end; ++i) {
      auto& p = params_[static_cast<std::size_t>(i)];
      if (!p.grad().defined()) continue;
      const auto g = p.grad().reshape({-1});
      if (measure_) local_sq_ += g.to(torch::kDouble).square().sum();  // read once, in sumGradients()
      buffer.narrow(0, l.starts[static_cast<std::size_t>(i)] - s.base, g.numel()).copy_(g);
      p.mutable_grad() = at::Tensor();  // freed: the shard holds its sum
    }
    auto mine = shard_.narrow(0, s.owned, s.chunk);
    if (flushed_ == 0) {
      comm_.reduceScatter(buffer, mine, collective::ReduceOp::kSum);
    } else {
      auto part = torch::empty_like(mine);
      comm_.reduceScatter(buffer, part, collective::ReduceOp::kSum);
      mine.add_(part);
    }
  }
  ++flushed_;
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
  flush();
  auto values = partialSums();
  std::copy(side.begin(), side.end(), values.begin());
  values[kLocalSq] = measure_ ? local_sq_.item<double>() : 0.0;
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
  for (const auto& p : params_) m.parameters_mb += static_cast<double>(p.nbytes()) / kMb;
  m.gradients_mb = static_cast<double>(shard_.nbytes()) / kMb;
  m.optimizer_state_mb = static_cast<double>(optimizer_->stateBytes()) / kMb;
  return m;
}

}  // namespace

std::unique_ptr<UpdateStrategy> makeShardedGradientUpdate(const Config& cfg,
                                                          collective::Communicator& comm,
                                                          std::vector<at::Tensor> params) {
  return std::make_unique<ShardedGradientUpdate>(cfg, comm, std::move(params));
}

}  // namespace batchdist::worker
