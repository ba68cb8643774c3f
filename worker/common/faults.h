#pragma once
// The faults the tests inject into a run.
//
// Note [fault plan]: the tests make a rank run out of memory, kill a checkpoint
// write halfway, slow a rank's optimizer update or every sample read, start a
// rank with an empty throughput table, or stand in for another build, through
// the environment variables BATCHDIST_FAULT_*:
//   BATCHDIST_FAULT_OOM="R:S[:N][:forward],..."  rank R fails the first N (default
//       1) tries of global step S (1-based), halfway through backward, or with
//       ":forward" halfway through forward (Note [oom back-off] in
//       worker/train/oom_guard.h)
//   BATCHDIST_FAULT_SLOW_UPDATE_US=N  this process's optimizer update takes N us
//       longer (set on some ranks only: mpirun -x on one app context)
//   BATCHDIST_FAULT_SLOW_READ_US=N    every sample read takes N us longer (slow
//       storage; the search's loader and the `data` verb's included)
//   BATCHDIST_FAULT_ADAPT_FIGURES=R   rank R starts batch.adapt with an empty
//       throughput table (Note [adaptive training])
//   BATCHDIST_FAULT_CHECKPOINT=POINT  rank 0 kills itself (SIGKILL) when a
//       checkpoint write reaches POINT (after_files, after_rename) ...
//   BATCHDIST_FAULT_CHECKPOINT_STEP=S ... at the checkpoint after step S only
//   BATCHDIST_FAULT_VERSION=V         this rank says it is batchdist V (Note [same
//       command] in launcher/main.cc)
//   BATCHDIST_FAULT_HANG="R:S"        rank R hangs before global step S (1-based),
//       outside any collective, until it is killed (its heartbeat goes on: a hang,
//       not a silent host; Note [heartbeat])
// They are read from the environment once, by the launcher (launcher/main.cc)
// before the verb runs, parsed and checked all at once (a bad value is an Error
// naming the variable, on the rank that has it, before anything starts), and the
// plan is handed down to the parts that act on it: RunRequest::faults, the
// Trainer, the Checkpointer and the loaders' read delay. Nothing else reads the
// environment for them: production runs get an empty plan (or a null pointer),
// and unit tests build the plan they want without touching the process's
// environment. An empty value counts as unset.

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace batchdist::worker {

/// One BATCHDIST_FAULT_OOM entry: rank `rank` fails the first `tries` tries of
/// global step `step` (1-based).
struct OomFault {
  int64_t rank = 0;
  int64_t step = 1;
  int64_t tries = 1;
  bool forward = false;  ///< halfway through forward rather than backward
};

/// Where BATCHDIST_FAULT_CHECKPOINT kills a checkpoint write.
enum class CheckpointKill { kNone, kAfterFiles, kAfterRename };

/// "after_files", "after_rename" ("none" for kNone).
const char* checkpointKillName(CheckpointKill point);

/// BATCHDIST_FAULT_CHECKPOINT and BATCHDIST_FAULT_CHECKPOINT_STEP.
struct CheckpointFault {
  CheckpointKill point = CheckpointKill::kNone;
  int64_t step = 0;  ///< the checkpoint after this step only; 0: any checkpoint

  /// Whether a write that reached `reached` at the checkpoint after `global_step`
  /// is to be killed.
  bool killsAt(CheckpointKill reached, int64_t global_step) const;
};

/// BATCHDIST_FAULT_HANG.
struct HangFault {
  int64_t rank = -1;  ///< -1: no rank hangs
  int64_t step = 0;   ///< before this global step (1-based)
};

/// Note [fault plan]: every fault a test asked for; default-constructed: none.
struct FaultPlan {
  std::vector<OomFault> oom;       ///< BATCHDIST_FAULT_OOM, every rank's, in the order given
  int64_t slow_update_us = 0;      ///< BATCHDIST_FAULT_SLOW_UPDATE_US (this process)
  int64_t slow_read_us = 0;        ///< BATCHDIST_FAULT_SLOW_READ_US
  int64_t adapt_figures_rank = -1; ///< BATCHDIST_FAULT_ADAPT_FIGURES; -1: no rank
  CheckpointFault checkpoint;      ///< BATCHDIST_FAULT_CHECKPOINT(_STEP)
  std::string version;             ///< BATCHDIST_FAULT_VERSION; empty: this build's
  HangFault hang;                  ///< BATCHDIST_FAULT_HANG

  /// True when the plan injects nothing (the production case).
  bool empty() const;
  /// Rank `rank`'s out-of-memory tries, one entry per failing try: (global step,
  /// in forward), in the order BATCHDIST_FAULT_OOM gave them.
  std::vector<std::pair<int64_t, bool>> oomTries(int64_t rank) const;
};

/// The plan of Note [fault plan]: reads and checks every BATCHDIST_FAULT_*
/// variable through `getenv_fn` (the launcher passes std::getenv; tests a lookup
/// of their own; it returns null for an unset variable). Throws batchdist::Error
/// naming the variable and its bad value. An empty value is the same as an unset one.
FaultPlan faultPlanFromEnvironment(const std::function<const char*(const char*)>& getenv_fn);

}  // namespace batchdist::worker
