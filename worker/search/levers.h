#pragma once
// The memory levers in the batch search: which combinations of dist.shard and
// model.recompute are weighed, and the memory model that predicts how large a
// per-GPU batch each lets fit.
//
// Note [lever search]: with dist.shard: auto or model.recompute: auto the search
// weighs the levers with the per-GPU batch, at the same global batch, in one run:
//  1. The walk (doubling, boundary) runs under the base levers, the cheapest in
//     time: no sharding, no recompute (or the configured value of a lever that is
//     not auto). It finds the base's largest fitting size M0 and whether memory
//     bounded it (a size above M0 ran out of memory or over the budget).
//  2. The memory model. A rank's peak under levers (s, r) at per-GPU m is
//       peak = fixed(s) + a_r + b_r x m
//     fixed(s): parameters + gradients + optimizer state, from the formulas
//     (Note [memory by part]): one measurement's parts, each made whole again (x W)
//     where it was sharded, then the state / W under dist.shard: optimizer, the
//     state and the gradients / W under gradients, and under parameters the
//     parameters / W too plus the units whole at once (two neighbours and what
//     they use: Note [parameter units]) (Note [sharded gradients]: the
//     whole gradient then lives only during backward, as activations are freed,
//     so it falls to the rest, which the confirmation measures). a_r + b_r x m: the rest
//     (activations, workspace, the process's own on the CPU), fitted per recompute
//     setting through the two largest sizes measured under it with a peak (fits
//     or over the budget; an out-of-memory has none). Recompute's two probes are
//     the base's largest fitting size and the smallest that failed above it,
//     timed like any candidate (a slope from small sizes is mostly the process's
//     own memory on the CPU: 2x off in a GPT on 2 ranks).
//  3. Per combination: the largest allowed size predicted to fit the tightest
//     rank's budget. A combination that lets a larger size fit than M0 (and
//     memory bounded the walk) is confirmed at that size, then at the sizes below
//     it (down to M0 + 1, at most kConfirmTries in all) until one fits. One
//     without recompute that fits nothing larger is still timed once at the walk's
//     pick (the same batch in less memory, possibly as fast); one with recompute
//     is pruned (recompute would only cost time), and so is every combination when
//     memory did not bound the walk. A sharding on top of recompute predicted to
//     fit no larger size than recompute alone measured (its twin) could only give
//     the twin's batch in less memory: it is timed at that size if the twin's
//     samples/s there contends (within the interleaved rounds' reach of the best
//     so far), else pruned (a GPT's search on 2 CPU ranks: recompute fit the
//     largest size, 48, at 66-69 % of the best; with the rule the search took
//     52 s where the run before it took 64). LeverOutcome keeps the figures and the words.
//  4. The interleaved comparison (Note [interleaved comparison]) then takes the
//     contenders of every combination, and the rule picks the smallest per-GPU
//     batch within the tolerance of the best, and at that size the smallest peak.
// Sharding needs more than one rank; a model with no blocks to recompute (cnn,
// TorchScript) weighs recompute off only: the search says both.

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "worker/config/config.h"
#include "worker/search/search.h"

namespace batchdist::worker {

/// How much of the update's state a sharding splits over the ranks: none 0,
/// optimizer 1, gradients 2 (each saves at least what the one before saves).
int shardSaving(Shard s);

/// At most this many sizes are measured to confirm one combination's prediction.
constexpr int kConfirmTries = 3;

/// The combinations weighed: base first, then cheaper in time before dearer.
/// `notes` gets a sentence for each lever that auto cannot weigh here.
struct LeverSpace {
  Levers base;
  std::vector<Levers> combinations;  ///< base first
  std::vector<std::string> notes;
  bool weighed() const { return combinations.size() > 1; }
};
/// `parameters_unsupported` (Measurer::parametersUnsupported): why dist.shard:
/// auto cannot weigh parameters ("": it weighs it, after gradients).
LeverSpace leverSpace(const Levers& configured, int64_t world,
                      const std::string& recompute_unsupported,
                      const std::string& parameters_unsupported = "the model has no parameter units");

/// The rest's straight line a + b x m under one recompute setting.
struct RestFit {
  bool valid = false;
  double intercept_mb = 0;
  double per_sample_mb = 0;
};
/// Through the two largest per-GPU sizes among `candidates` measured under
/// `recompute` with a peak (any sharding: the rest does not depend on it); where
/// sizes over the budget lie above the largest that fit, through that one and the
/// smallest above it instead (the boundary).
RestFit fitRest(const std::vector<Candidate>& candidates, Recompute recompute);

/// Fixed parts under `target` sharding from parts measured under `measured`
/// sharding, over `world` ranks (Note [lever search], 2); `unit_working_mb`: the
/// most parameters whole at once under dist.shard: parameters (Measurer::unitWorkingMb).
double fixedMbUnder(const MemoryParts& measured, Shard measured_shard, Shard target, int64_t world,
                    double unit_working_mb = 0);

/// The largest size m with `allowed(m)` in [lo, hi] whose predicted peak
/// fixed + fit(m) is within `budget_mb`; 0 if none. `budget_mb` > 0.
int64_t predictLargest(const RestFit& fit, double fixed_mb, double budget_mb, int64_t lo, int64_t hi,
                       const std::function<bool(int64_t)>& allowed);

}  // namespace batchdist::worker
