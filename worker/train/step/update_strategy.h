#pragma once
// How a step's gradients become the update of the weights: the gradient sync
// and the optimizer in one object (Note [update strategy]).

#include <ATen/core/Tensor.h>

#include <memory>
#include <vector>

#include "collective/communicator.h"
#include "collective/grad_sync.h"
#include "worker/config/config.h"
#include "worker/model/optimizer.h"
#include "worker/model/precision.h"
#include "worker/model/units.h"
#include "worker/train/result.h"

namespace batchdist::worker {

/// Note [update strategy]: what is specific to how gradients become a step is one
/// object the trainer calls, an UpdateStrategy. It owns both halves: the
/// communication (a GradientSync, Note [gradient sync]) and the optimizer (the fp16
/// loss scaler's unscale-or-skip, Note [gradient clipping], the optimizer's step at
/// the plan's lr), because the readers of the whole gradient (clipping's global
/// norm, the fp16 overflow check, LARS's per-layer trust ratios, the noise scale's
/// norms) read what the communication half leaves. Per step the trainer calls
///   zeroGrad(); { beforeBackward(k, accum); backward } x accum; sumGradients(side); step(lr)
/// with backwardFailed() before sumGradients() on a rank whose backward threw and
/// dropGrad() instead of step() for a step that is not applied; it reads
/// lossScale() before backward, lastNorms() and lastSkewSeconds() after the sum,
/// optimizer() and scaler() for checkpoints, clipFigures() for the report.
///
/// Plain data parallel (makeUpdateStrategy): the sum is an allreduce, so every
/// rank holds the whole summed gradient; the optimizer is whole, or under
/// dist.shard: optimizer (ZeRO-1) a ShardedOptimizer (Note [sharded optimizer])
/// that steps this rank's slice and all-gathers the parameters; the readers of
/// the gradient are unchanged. dist.shard: gradients (ZeRO-2) is the other
/// strategy (Note [sharded gradients] in worker/train/shard/sharded_gradients.h): the
/// gradients reduce-scattered, the readers of the whole gradient fed by one small
/// allreduce of partial sums. The one-rank micro-batch noise (Note [gradient
/// noise scale]) and the health check (after the all-gather every rank holds
/// every parameter): unchanged under both.
class UpdateStrategy {
 public:
  virtual ~UpdateStrategy() = default;

  // The communication half (Note [gradient sync]): as GradientSync's members.

  /// Before a step's first micro-batch: every gradient zero.
  virtual void zeroGrad() = 0;
  /// Every gradient gone (a step that is not applied), once no bucket is in flight.
  virtual void dropGrad() = 0;
  /// Before micro-batch `micro`'s backward, of the step's `micros` (0-based: the
  /// last of the window is micros - 1).
  virtual void beforeBackward(int64_t micro, int64_t micros) = 0;
  /// After a backward that failed on this rank, before sumGradients().
  virtual void backwardFailed() = 0;
  /// On every rank at every step: the gradients summed over the ranks, `side`
  /// summed in the same collective; returns the summed side channel.
  virtual collective::SideChannel sumGradients(const collective::SideChannel& side) = 0;
  /// Measure Note [gradient norms] at every sumGradients() (only with W > 1).
  virtual void setMeasureNorms(bool on) = 0;
  /// The norms of the last sumGradients() (valid = false when not measured).
  virtual const collective::GradSqNorms& lastNorms() const = 0;
  /// How much of the last sumGradients() waited for a slower rank's backward (s).
  virtual double lastSkewSeconds() const = 0;

  // The optimizer half.

  /// What the loss is multiplied by before backward: the fp16 loss scale, else 1.
  virtual double lossScale() const = 0;
  /// The update at `lr` from the summed gradients: under fp16 unscales them, or
  /// skips the step (returns false; the scale backs off) when any holds inf/NaN;
  /// then Note [gradient clipping] (optim.clip_grad_norm > 0) and the optimizer's
  /// step. Every rank reaches the same verdict.
  virtual bool step(double lr) = 0;
  /// The optimizer whose state a checkpoint saves and restores.
  virtual Optimizer& optimizer() = 0;
  /// The fp16 loss scaler (checkpoints, the report); null under fp32 and bf16.
  virtual LossScaler* scaler() = 0;
  /// Note [gradient clipping]'s figures since the last resetClipFigures().
  virtual const GradClipFigures& clipFigures() const = 0;
  virtual void resetClipFigures() = 0;
  /// What this rank holds for the update (Note [memory by part]).
  virtual UpdateMemory memory() const = 0;
  /// Note [parameter units]: what gathers and frees the model's units under
  /// dist.shard: parameters (Model::setUnitHooks); null otherwise.
  virtual UnitHooks* unitHooks() { return nullptr; }
};

/// What the two strategies' optimizer halves share: the fp16 loss scaler (built
/// under train.precision: fp16) and Note [gradient clipping]'s figures.
class UpdateStrategyBase : public UpdateStrategy {
 public:
  double lossScale() const override { return scaler_ ? scaler_->scale() : 1.0; }
  LossScaler* scaler() override { return scaler_.get(); }
  const GradClipFigures& clipFigures() const override { return clip_; }
  void resetClipFigures() override { clip_ = GradClipFigures(); }

 protected:
  explicit UpdateStrategyBase(const Config& cfg);
  /// Counts one step's global gradient norm (before clipping) in the figures;
  /// returns the coefficient clipping scales the gradient by (clipCoefficient).
  double recordClip(double norm);

  double clip_norm_ = 0;  ///< optim.clip_grad_norm (0: off)
  std::unique_ptr<LossScaler> scaler_;  ///< fp16 only
  GradClipFigures clip_;                ///< optim.clip_grad_norm > 0
};

/// Whether `dist` over `world` ranks runs the sharded-gradient strategy (Note
/// [sharded gradients]): dist.shard: gradients with more than one rank (one rank
/// has nothing to shard and runs as dist.shard: optimizer).
bool shardsGradients(const DistConfig& dist, int64_t world);
/// Whether it runs Note [parameter units]: dist.shard: parameters with more than
/// one rank (which also shards the gradients; one rank runs as optimizer).
bool shardsParameters(const DistConfig& dist, int64_t world);

/// The strategy of `cfg` over the trainable parameters `params` (the same, in the
/// same order, on every rank): under dist.shard: gradients with more than one rank
/// the sharded one (makeShardedGradientUpdate), else plain data parallel, its
/// GradientSync from dist.overlap and dist.bucket_mb, its optimizer from optim, a
/// loss scaler under train.precision: fp16. Throws ConfigError for an optimizer
/// the config cannot build.
std::unique_ptr<UpdateStrategy> makeUpdateStrategy(const Config& cfg,
                                                   collective::Communicator& comm,
                                                   std::vector<at::Tensor> params,
                                                   std::vector<ParamUnit> units = {});

}  // namespace batchdist::worker
