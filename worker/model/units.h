#pragma once
// The model's parameter units, and the hooks that gather and free them under
// dist.shard: parameters (Note [parameter units]).

#include <ATen/core/Tensor.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace batchdist::worker {

// Note [parameter units]
// ~~~~~~~~~~~~~~~~~~~~~~
// Under dist.shard: parameters (ZeRO-3, as FSDP) no rank holds the whole model:
// each keeps chunk r of every unit's parameters (Note [shard layout], a segment
// per unit), and a unit's parameters exist whole only while the unit runs.
//  - A unit is a part of the model whose forward is one call: a gpt block, the
//    embeddings (wte, wpe), the head (ln_f; it also reads wte, the tied weight:
//    `uses`); an mlp layer (a Linear up to the next). Its trainable parameters
//    are consecutive in the model's parameter order. Model::units() lists them;
//    a model without units is refused with dist.shard: parameters.
//  - The model runs each unit through runUnit(): the hooks all-gather the unit's
//    parameters (and those of the units it uses) just before its forward; after
//    it, they free them (dist.reshard_after_forward: true) and hook the unit's
//    output, so that its backward starts by gathering them again; backward then
//    frees each unit as soon as its last gradient reached the gradient scatter
//    (Note [gradient scatter]). With dist.prefetch (the default) a unit's start
//    also starts the all-gather of the next one (forward: the one after it;
//    backward: the one before), which runs while the unit computes. So at most
//    two units are whole at once (the one running, the one arriving), and on gpt
//    the embeddings besides from the head's backward on (the head reads wte,
//    whose gradient arrives last).
//  - Gathering and freeing keep the parameter tensors: each unit's parameters are
//    views of one buffer of W s_k elements whose memory is released and allocated
//    again under the same storage, so autograd's saved views see the gathered
//    values. A freed parameter has no memory under it: reading one outside a
//    unit or a WholeParameters scope is a bug (it crashes), which is why every
//    reader of the whole model opens the scope.
//  - Every rank runs the same units in the same order (equal micro-batches: Note
//    [equal shards]), so the all-gathers match. Readers of the whole model outside
//    a step (evaluation, whose shards are uneven; the health check; checkpoints;
//    model.pt) gather every unit first, on every rank (WholeParameters in
//    worker/model/model.h); within that scope the hooks do nothing.
struct ParamUnit {
  std::string name;
  std::vector<at::Tensor> params;  ///< in the model's parameter order
  std::vector<std::size_t> uses;   ///< other units whose parameters its forward reads
};

/// What a model calls around its units (Note [parameter units]).
class UnitHooks {
 public:
  virtual ~UnitHooks() = default;
  /// Before unit k's forward: its parameters (and its uses') whole.
  virtual void beforeUnit(std::size_t k) = 0;
  /// After it, `y` its output: freed (or kept), and `y` hooked to gather them again
  /// before the unit's backward.
  virtual void afterUnit(std::size_t k, const at::Tensor& y) = 0;
  /// Collective: every unit whole until releaseAll(); the unit hooks do nothing meanwhile.
  virtual void gatherAll() = 0;
  /// The end of gatherAll()'s scope: with `absorb_writes`, what was written into
  /// the whole parameters (a checkpoint restored) becomes this rank's shard.
  virtual void releaseAll(bool absorb_writes) = 0;
  /// Fault injection (BATCHDIST_FAULT_OOM, forward): the next beforeUnit(k)
  /// throws c10::OutOfMemoryError, halfway through a forward.
  virtual void failBeforeUnit(std::size_t k) = 0;
};

/// Note [parameter units]: the most bytes of parameters whole at once in a step:
/// two neighbouring units and the units they use (with prefetch: the one running
/// and the one arriving), or all of them without resharding after forward.
int64_t unitWorkingBytes(const std::vector<ParamUnit>& units, bool reshard_after_forward);

/// f(x) as unit k: through `hooks` when they are set, else just f(x).
at::Tensor runUnit(UnitHooks* hooks, std::size_t k,
                   const std::function<at::Tensor(const at::Tensor&)>& f, const at::Tensor& x);

}  // namespace batchdist::worker
