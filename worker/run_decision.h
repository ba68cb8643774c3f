#pragma once
// A run's decisions as values (Note [run decisions]): the checkpoint it
// continues and the batch and levers that follow, the search's choice, the plan,
// and the one function that builds the run's Config from them.

#include <cstdint>
#include <optional>
#include <string>

#include "collective/communicator.h"
#include "worker/search/search.h"
#include "worker/common/console.h"
#include "worker/config/config.h"
#include "worker/run.h"
#include "worker/train/checkpoint/checkpoint.h"

namespace batchdist::worker {

/// What a resume decides, as values; the run builds its Config from them
/// (decidedConfig in run.cc), nothing here edits one.
struct ResumeDecision {
  CheckpointCheck checkpoint;
  /// Note [checkpoint]: the checkpoint's global batch; the per-GPU batch planned
  /// for this world size, or still auto when the search must pick it.
  BatchConfig batch;
  /// Note [lever search]: auto levers as the checkpoint's run chose them (same
  /// per-GPU batch only; a searched resume searches the levers again).
  std::optional<Levers> levers;
};

// Note [run decisions]
// ~~~~~~~~~~~~~~~~~~~~
// The config is validated once (prepareRun: the user's file and --set, the
// host's loader threads resolved) and then never edited. What the run decides
// on the way is a value: the checkpoint it continues and the batch that follows
// (decideResume), the levers (the checkpoint's run's or the search's), the
// search's per-GPU batch, the plan. decidedConfig builds, once they are known,
// the Config every component of the run is built from: the trainer, the step
// engine, the checkpointer, the report. The search is built from the config as
// the resume left it (auto levers and per-GPU batch still auto: it decides them).

/// The run's config: `cfg` with a resume's batch (its resolved batch.global and
/// batch.accum too) and the decided levers. A copy: `cfg` is not edited.
Config decidedConfig(const Config& cfg, const std::optional<BatchConfig>& batch,
                     const std::optional<Levers>& levers);

/// What the run decided, as the run's later phases and its report read it.
struct RunDecision {
  Config cfg;  ///< decidedConfig(...): what every component is built from
  Plan plan;   ///< the split training starts with (G0 under batch.adapt)
  std::optional<ResumeDecision> resumed;
  std::optional<SearchResult> searched;
};

/// --resume, or checkpoint.resume: auto (never for the `search` verb).
bool resumeRequested(const RunRequest& req, const Config& cfg);

/// The checkpoint this run continues, checked against `cfg`, or none (a fresh
/// start). Rank 0 picks and says which in one line; every rank gets the same
/// decision. Collective. Throws ConfigError (a --resume PATH that cannot be
/// loaded; a checkpoint of another model; a global batch that does not split
/// over this world size).
std::optional<ResumeDecision> decideResume(const RunRequest& req, const RunSetup& s,
                                           collective::Communicator& comm, Console& console);

/// The batch a resume on `world` ranks trains with (Note [checkpoint]): the
/// checkpoint's global batch; the same per-GPU batch on the same world size,
/// else the largest m <= the checkpoint's that divides G / W (still auto when
/// `b` asks the search). Throws ConfigError naming the world sizes that work.
BatchConfig resumedBatch(const BatchConfig& b, const ManifestPlan& then, int world, bool has_bn,
                         const std::string& path);

}  // namespace batchdist::worker
