#pragma once
// Rank 0's artifacts of a run: model.pt, report.json (and --report),
// report.html, and the console's closing lines.

#include <cstdint>

#include "collective/communicator.h"
#include "worker/common/console.h"
#include "worker/run.h"
#include "worker/run_decision.h"
#include "worker/train/trainer.h"

namespace batchdist::worker {

/// Rank 0's artifacts and summary lines after training.
void finishRun(const RunRequest& req, const RankPlace& place, const RunSetup& s,
               const RunDecision& d, collective::Communicator& comm, Trainer& trainer,
               const TrainResult& result, int sig, Console& console);

/// Rank 0's report of a run stopped during the batch search (nothing trained, so
/// no model, metrics or page): report.json, and --report when given. `cfg`: the
/// run's config as the search saw it.
void finishStoppedSearch(const RunRequest& req, const RankPlace& place, const RunSetup& s,
                         const Config& cfg, collective::Communicator& comm,
                         int64_t last_per_gpu, double seconds, int sig);

}  // namespace batchdist::worker
