#pragma once
// dist.shard: gradients (ZeRO-2): the update strategy that reduce-scatters the
// gradients, so each rank holds 1/W of the summed gradient and of the optimizer
// state (Note [sharded gradients]).

#include <ATen/core/Tensor.h>

#include <memory>
#include <vector>

#include "collective/communicator.h"
#include "worker/config/config.h"
#include "worker/train/step/update_strategy.h"

namespace batchdist::worker {

/// Note [sharded gradients]: under dist.shard: gradients (ZeRO-2) the update
/// strategy (Note [update strategy]) keeps, on rank r, only chunk r of every
/// segment of Note [shard layout] (a segment per dist.bucket_mb of parameters) of
/// the summed gradient: its shard, 1/W of the gradient, accumulated over the
/// step's micro-batches. Per call:
///  - Each micro-batch's gradients are reduce-scattered into the shard, segment
///    by segment, as backward produces them (Note [gradient scatter] in
///    worker/train/shard/gradient_scatter.h: beforeBackward(k, a) opens micro-batch k's
///    round, sumGradients() closes the last): a hook copies each gradient into its
///    segment's W s_k buffer and frees the parameter's .grad; a full segment's
///    Communicator::reduceScatter (Note [flat collectives]: native on NCCL and
///    MPI, an allreduce on Gloo) starts at once under dist.overlap, into the
///    shard or a temporary added to it. So no buffer of the whole gradient lives:
///    during backward a rank holds the shard (N / W) plus the buffers of the
///    segments filling or in flight, where plain data parallel holds N. The
///    price: a reduce-scatter per micro-batch, (W-1) n elements each, so
///    a x (W-1) n per step against the allreduce's 2 (W-1) n (accumulation 1:
///    half; 2: the same; more: more), as in DeepSpeed's stage 2.
///  - a rank whose backward failed (backwardFailed()) closes its round with what
///    it has and makes the rounds it missed with zeros (in sumGradients()), so
///    every rank makes the same collectives; every rank discards the step (Note
///    [oom back-off]).
///  - sumGradients() ends with one small allreduce of doubles, on every rank at
///    every step: Note [side channel]'s slots, this rank's |g|^2 taken as each gradient
///    is copied (Note [gradient norms]: with `parts` = a, one per
///    micro-batch), |shard|^2, and under LARS each parameter's |shard piece|^2.
///    Summed over the ranks they are what the readers of the whole gradient need:
///    the fp16 overflow check (a non-finite sum: every rank skips the same step),
///    Note [gradient clipping]'s global norm (every rank scales its shard by the
///    same coefficient), LARS's per-layer |g| (ShardedOptimizer::setWholeGradNorms)
///    and the noise scale's |sum_r g_r|^2. They are taken on the scaled gradient
///    and divided by the loss scale after.
///  - step(lr): unscale or skip, clip, then the ShardedOptimizer steps its pieces
///    from the shard (useShardGradient) and all-gathers every segment in place.
/// Checkpoints are ZeRO-1's (Note [sharded checkpoint]): the state in the packed
/// space, so ZeRO-1, ZeRO-2 and unsharded runs resume each other's on any W.
/// The reducer's arrival slots are not sent: lastSkewSeconds() is 0.
std::unique_ptr<UpdateStrategy> makeShardedGradientUpdate(const Config& cfg,
                                                          collective::Communicator& comm,
                                                          std::vector<at::Tensor> params);

/// dist.shard: parameters (ZeRO-3, Note [parameter units] in worker/model/units.h):
/// the same strategy over a segment per unit of `units` (Model::units()), whose
/// parameters ParamUnits (worker/train/shard/param_units.h) keeps sharded and
/// gathers per unit; the optimizer steps this rank's shard of them and gathers
/// nothing. The reduce-scatters start as under gradients (from the hooks under
/// dist.overlap), in the segments' reverse order. ConfigError for a model without units.
std::unique_ptr<UpdateStrategy> makeShardedParameterUpdate(const Config& cfg,
                                                           collective::Communicator& comm,
                                                           std::vector<at::Tensor> params,
                                                           std::vector<ParamUnit> units);

}  // namespace batchdist::worker
