#pragma once
// The batch search's measurer on the real training step: forward, backward,
// gradient averaging and optimizer on real batches of the configured data.

#include <ATen/core/Tensor.h>

#include <memory>
#include <string>

#include "collective/communicator.h"
#include "worker/common/faults.h"
#include "worker/config/config.h"
#include "worker/data/data.h"
#include "worker/search/search.h"

namespace batchdist::worker {

// Note [search traces]
// ~~~~~~~~~~~~~~~~~~~~
// With search.profile every rank traces one step of each candidate the first
// time it is measured (Note [step profiler]: the same trace, writer and named
// ranges as a training run's): the candidate gets one more warm-up step, the
// last before its timed ones, traced with the profiler prepared in the step
// before it (when there is one), so the trace shows a warm step and the timing
// never includes the profiler. Each rank writes
// OUTPUT/profile/search/<candidate>/<host>_rank<R>.pt.trace.json, <candidate>
// "per_gpu_64" (with "_accum_2", "_shard_optimizer", "_recompute_on" when they
// apply), so TensorBoard's profiler plugin shows each candidate as a run;
// search.json names rank 0's file per candidate ("trace"). A search read from the
// cache traces nothing, so search.profile is part of the cache key: a traced
// search is measured again.

/// Where the search's traces go (Note [search traces]).
struct SearchTraceOptions {
  std::string dir;      ///< OUTPUT/profile/search
  std::string backend;  ///< for the traces' distributedInfo
};

/// The directory name of a candidate's traces: "per_gpu_64", "per_gpu_32_accum_2_shard_optimizer".
std::string searchTraceName(int64_t per_gpu, int64_t accum, const Levers& levers);

/// Builds a Trainer of its own (collective: every rank must call it), with the
/// faults the tests inject (Note [fault plan]; null: none) and, with `trace`,
/// Note [search traces].
std::unique_ptr<Measurer> makeTrainStepMeasurer(const Config& cfg, collective::Communicator& comm,
                                                const DataSplit& data, at::Device device,
                                                const FaultPlan* faults = nullptr,
                                                const SearchTraceOptions* trace = nullptr);

}  // namespace batchdist::worker
