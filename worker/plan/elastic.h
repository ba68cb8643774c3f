#pragma once
// The world an elastic job goes on at after it lost ranks (or gained them): pure
// arithmetic, no MPI, no torch.
//
// Note [elastic split]: the global batch G never changes (Note [equal shards]):
// the lr schedule, the sample order and the step count of a resumed run are
// those of the plan at G, on any world (Note [checkpoint] in
// worker/train/checkpoint/checkpoint.h). So a new world W is usable only where G has an
// equal split m x a x W with m a per-GPU batch known to fit (at most `max_fit`,
// the largest the search or the run saw fit, memory being per rank) and at least
// the BatchNorm minimum. Of the usable worlds the largest within the slots (and
// the cap) wins: throughput grows with W at a fixed G far more than it loses to
// accumulation. Within it, the largest such m: the fewest micro-batches a step.
// A world passed over is said with why (no equal split; no per-GPU batch that
// fits), so a supervisor can say why it did not take every slot.

#include <cstdint>
#include <string>
#include <vector>

namespace batchdist::worker {

/// What elasticSplit() is given.
struct ElasticSlots {
  int64_t global = 0;       ///< G, fixed for the whole job
  int64_t slots = 0;        ///< ranks the hosts that answer can run
  int64_t min_ranks = 1;    ///< below this the job waits (or gives up), never runs
  int64_t max_ranks = 0;    ///< 0: no cap
  int64_t max_fit = 0;      ///< the largest per-GPU batch known to fit (> 0)
  int64_t min_per_gpu = 1;  ///< Note [equal shards]: 2 or more with BatchNorm
};

struct ElasticSplit {
  int64_t world = 0;  ///< 0: no usable world (then `why` says what blocks each)
  int64_t per_gpu = 0;
  int64_t accum = 0;
  /// Worlds above `world` (within the slots) that were passed over, one line
  /// each: "5 ranks: G=96 is not divisible by 5".
  std::vector<std::string> passed_over;
  /// One sentence: the split and why this world, or why none.
  std::string why;
};

/// Note [elastic split]. Throws Error for inputs that are not a job's (G, max_fit
/// or min_ranks below 1, max_fit below min_per_gpu).
ElasticSplit elasticSplit(const ElasticSlots& in);

}  // namespace batchdist::worker
