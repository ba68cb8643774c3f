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
///    (collective/reducer.cc, Note [reducer hooks]) fire exactly once per
///    parameter per backward, and its bucket readiness sees the same events,
///    with the parameter's .grad in place when its hook fires; only their
///    timing moves: a block's parameters become ready together, when its
///    recompute and backward end (the Reducer learns the order from the first
///    step, as without recompute). It also makes the first MLP layer, whose input is data
///    that needs no gradient, take part in backward.
///  - Not for BatchNorm (a second forward would update its running statistics
///    twice) nor TorchScript modules (no blocks to wrap): the config refuses
///    model.recompute: on for them (resnet18/50, cnn, torchscript, and mlp with
///    model.batchnorm).
///  - Without grad mode (evaluation, the config's sample forward) the block
///    runs as it is.
using BlockForward = std::function<at::Tensor(const at::Tensor&)>;

/// `block(x)` under Note [activation recompute]. `params` are the parameters
/// `block` uses (those that do not require grad are passed over).
at::Tensor recomputed(const BlockForward& block, const at::Tensor& x,
                      const std::vector<at::Tensor>& params);

}  // namespace batchdist::worker
