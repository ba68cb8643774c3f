#pragma once
// model.recompute: activation recompute (gradient checkpointing) for the
// built-in models' blocks.

#include <ATen/core/Tensor.h>

#include <functional>
#include <vector>

namespace batchdist::worker {

/// Note [activation recompute]: with model.recompute: on, a block (a GPT
/// decoder block, an MLP hidden layer) runs its forward without autograd and
/// keeps only its input; backward runs the block's forward again, with autograd,
/// from that input and backpropagates the incoming gradient through it. It
/// trades about a third more compute (a second forward of each block) for the
/// block's inner activations (attention scores, the 4E MLP width).
///  - Same gradients, bitwise on the CPU: the recompute runs the same ops in the
///    same order. Dropout replays its mask: the default CPU generator's state
///    (and, on a GPU, that device's CUDA generator's: Note [cuda rng] in
///    common/device_compat.h) is taken before the forward, set again for the
///    recompute, and the state backward found is put back after it, so the
///    random stream after a step is the one without recompute. (It assumes no
///    other thread draws from those default generators meanwhile: the data
///    loader's transforms and synthetic sets use generators of their own.)
///    Autocast's state (on, dtype) at the forward is set again for the
///    recompute (backward runs after the trainer's AutocastScope has ended).
///  - Parameters are inputs of the autograd function, next to the block's
///    input: the recompute computes their gradients with torch::autograd::grad
///    (which accumulates nothing) and returns them, and the outer backward
///    accumulates them through each parameter's own AccumulateGrad node, as
///    without recompute. So the Reducer's post hooks on those nodes
///    (Note [reducer hooks] in collective/grad_hooks.h) fire exactly once per
///    parameter per backward, and its bucket readiness sees the same events,
///    with the parameter's .grad in place when its hook fires; only their
///    timing moves: a block's parameters become ready together, when its
///    recompute and backward end (the Reducer learns the order from the first
///    step, as without recompute). It also makes the first MLP layer, whose input is data
///    that needs no gradient, take part in backward.
///  - BatchNorm (resnet18/50's blocks, mlp with model.batchnorm) sees which pass
///    it is in (Note [recompute replay]): the replay normalises with the batch's
///    statistics as the first pass did, but leaves the running statistics (and
///    the batch count) alone, so they are updated once per step, as without
///    recompute; SyncBatchNorm's replay reuses the global sums the first pass
///    allreduced instead of allreducing again, so no collective runs out of
///    step (its backward's allreduce runs once, as without recompute).
///  - Not for TorchScript modules (no blocks to wrap) nor the cnn (its layers
///    are not blocks): the config refuses model.recompute: on for them.
///  - Without grad mode (evaluation, the config's sample forward) the block
///    runs as it is.
using BlockForward = std::function<at::Tensor(const at::Tensor&)>;

/// Note [recompute replay]: which pass of a recomputed block is running on this
/// thread: none (no recompute, or outside a block), the first (the forward,
/// without autograd) or the replay (its forward again, in backward). A layer
/// whose forward has a side effect (BatchNorm's running statistics) or a
/// collective (SyncBatchNorm's sums) does it in the first pass only, keeping
/// what the replay needs with keepForReplay(); the replay takes the same values
/// back, in the same order, with takeReplayed(). What is kept lives with the
/// block's autograd node, so a step whose backward never runs (an out-of-memory
/// back-off) drops it with its graph.
enum class RecomputePass { kNone, kFirst, kReplay };
RecomputePass recomputePass();
/// In the first pass: keeps `t` for the replay.
void keepForReplay(const at::Tensor& t);
/// In the replay: the next tensor the first pass kept (throws Error when there is
/// none: the two passes took different paths).
at::Tensor takeReplayed();

/// `block(x)` under Note [activation recompute]. `params` are the parameters
/// `block` uses (those that do not require grad are passed over).
at::Tensor recomputed(const BlockForward& block, const at::Tensor& x,
                      const std::vector<at::Tensor>& params);

/// `block` as a forward that runs recomputed(block, x, params): what a model hands
/// runUnit (Note [parameter units]) for a block under recompute.
BlockForward recomputing(BlockForward block, std::vector<at::Tensor> params);

}  // namespace batchdist::worker
