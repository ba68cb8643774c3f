#pragma once
// One run of batchdist on this rank: set-up, configs agree, search or cache,
// plan, train, artifacts. The launcher (launcher/main.cc) owns the command line,
// the MPI scope, the signals and the exit codes, and calls in here.

#include <ATen/core/Tensor.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "worker/common/faults.h"
#include "worker/config/config.h"
#include "worker/data/data.h"
#include "worker/device.h"
#include "worker/plan/plan.h"
#include "worker/rank_place.h"
#include "worker/task/task.h"
#include "worker/train/result.h"

namespace batchdist::worker {

/// What the user asked for.
struct RunRequest {
  std::string config_path;        ///< "": the config is `sets` alone (a program's settings)
  std::vector<std::string> sets;  ///< --set key.path=value
  SetsFrom sets_from = SetsFrom::kCommandLine;  ///< how messages name them (Settings::set)
  std::string output = "batchdist-out";
  std::string report;             ///< --report PATH (a copy of report.json), or empty
  bool quiet = false;
  bool research = false;          ///< ignore the search cache
  bool search_only = false;       ///< the `search` verb: search, print the plan, stop
  std::string resume;             ///< --resume: "auto", a checkpoint PATH, or "" (config decides)
  /// The signal that asked this rank to stop (SIGTERM, SIGUSR1, SIGINT), or 0.
  std::function<int()> stop_signal = [] { return 0; };
  /// The launcher's phases on this rank (OUTPUT/phases.json): seconds from the
  /// process's start to main() (loading the libraries), of MPI_Init, and of the
  /// set-up (config, data, plan).
  double load_s = -1;
  double mpi_init_s = -1;
  double setup_s = -1;
  /// The faults the tests inject (Note [fault plan]): parsed once by the
  /// launcher, empty in production.
  FaultPlan faults;
  /// Note [program parts] (worker/model/program_model.h): a program's module and
  /// loss function (model.name: program) and its data set (data.name: program).
  std::shared_ptr<ProgramModule> program_module;
  std::shared_ptr<const ProgramData> program_data;
};

/// The local, deterministic part of the set-up: every rank does it alone and
/// fails the same way, so the launcher can agree on the outcome without a
/// collective.
struct RunSetup {
  Config cfg;
  DataSplit data;
  TaskChoice task;  ///< Note [task choice]: from task.name and the data
  Plan plan;  ///< empty (global 1) when per_gpu is auto: the search decides
  bool has_bn = false;
  at::Device device = at::kCPU;
  /// A resume may re-plan for this world size: a plan error waits until we know
  /// whether there is a checkpoint (Note [checkpoint]).
  std::string plan_error;
  std::string checkpoint_dir;  ///< checkpoint.dir, or OUTPUT/checkpoints
  HostBlas blas;               ///< CPU ranks: Note [host blas]
};

/// The request's config: its file (or, without one, its sets alone) with the
/// program's parts attached (Note [program parts]). Throws ConfigError.
Config loadRunConfig(const RunRequest& req);

/// Loads the config, picks the device, and checks that rank 0 can write every
/// output before anything long starts. Throws Error (ConfigError: bad input, exit 2).
RunSetup prepareRun(const RunRequest& req, const RankPlace& place);

/// Loads the data (rank 0 lists folders and indexes shards for all: a collective
/// when place.from_rank0 is set, so every rank must call it after a successful
/// prepareRun) and plans the batch (unless the search will). Throws Error.
void prepareData(const RunRequest& req, const RankPlace& place, RunSetup& setup);

/// Everything after the set-up: rendezvous, the cross-rank config check, the
/// batch search (or its cache), training, and rank 0's artifacts (model.pt,
/// report.json, search.json/svg). Collective. Returns the exit code: 0, or
/// 128 + signal when a stop request ended the run early. Throws Error.
/// Note [run phases] in run.cc.
int executeRun(const RunRequest& req, const RankPlace& place, RunSetup& setup);

/// A training run's exit code: 0 when it completed; 1 when it failed (nothing
/// left after an out-of-memory back-off), or when a stop's checkpoint could not
/// be written (the stop is not resumable); else 128 + the agreed stop signal
/// `sig` (SIGTERM when 0): a clean, resumable stop.
int runExitCode(const TrainResult& result, int sig);

/// The `plan` verb's output (text, or JSON with `json`) for `world` ranks.
/// Throws Error.
std::string planOutput(const RunRequest& req, int world, bool json);

/// CPUs this process may run on (its affinity mask: cgroups, taskset, Slurm's
/// --cpus-per-task), not the machine's core count.
int usableCpus();

}  // namespace batchdist::worker
