#pragma once
// The out-of-memory back-off of the training loop: what a rank does when a step
// does not fit, and what every rank agrees before the step is redone.
//
// Note [oom back-off]: an out-of-memory in a training step does not end the run.
//  - Detection, per rank: the allocator's exception (c10::OutOfMemoryError and
//    the other forms isOutOfMemory() knows), or on CPU a step whose peak resident
//    memory exceeds search.memory_limit_mb (as in the search). The exception is
//    caught in computeGradients()'s caller; the failed forward/backward's graph is
//    freed as it unwinds (and the CUDA cache emptied).
//  - Agreement, no extra collective: the failing rank still calls
//    syncGradients(), which sends every bucket in the same order (Note
//    [overlapped reducer]: the reducer's last bucket, the side channel's, starts
//    only in finish(), so a flag set after a failure halfway through backward
//    still travels) with its out-of-memory wish in the side channel (Note [step wishes]).
//    Every rank reads the same sum after the same step, so every rank discards
//    that step (no optimizer update; BatchNorm buffers restored from the copy
//    taken before the step) and only then do they meet in one small allreduce for
//    the figures (which ranks, their peak and capacity) that the message needs.
//  - Redo: the same step, same samples, same LR, split as m' x a' with m' the
//    largest proper divisor of m (m / 2 for even m) and a' = a m / m', so
//    G = m' a' W: by Note [equal shards] rank r gets exactly the same samples,
//    and by Note [loss normalisation] the update is the same mean gradient (to
//    float rounding; BatchNorm statistics follow the micro-batch, as always).
//    The loader is restarted at that step with the new jobs; the checkpointer
//    records the new split, so a resume continues with it.
//  - Below the BatchNorm minimum (batch.min_per_gpu, 2) or at m = 1 there is
//    nothing left: every rank stops after the failed step, and the run ends with
//    completed = false, the reason in the report and exit code 1.
//  - train.oom_recover_after_steps = N > 0: after N good steps at the smaller
//    split the larger one is tried again (one level up); a back-off from a split
//    that was such a retry doubles N. A resumed run does not retry. Under an
//    adaptive G (Note [adaptive training]) the per-GPU batches backed off from stay
//    marked even when a new G does not split them: no decision goes back to one
//    (or above), and a retry takes the newest that splits the G in force.
//    Off by default: a spike that came from the data or from fragmentation tends
//    to come back, each failed retry costs a wasted step and churns the
//    allocator, and a run that changes its split back and forth is harder to
//    reproduce (BatchNorm statistics follow the per-GPU batch).
//  - Fault injection for tests (Note [fault plan] in worker/common/faults.h: the
//    plan's oom entries, BATCHDIST_FAULT_OOM="R:S[:N][:forward],...") makes
//    rank R throw c10::OutOfMemoryError (the type the real path catches) from a
//    hook on the first parameter's gradient, i.e. halfway through the final
//    micro-batch's backward, in the first N (default 1) tries of global step S
//    (1-based); with ":forward", halfway through its forward instead (before the
//    middle synchronised BatchNorm allreduce, or before the forward without one).
//  - With model.sync_batchnorm an out-of-memory inside forward would leave the
//    other ranks in a BatchNorm allreduce: Note [sync batchnorm failure] in
//    worker/model/model.h makes every rank learn of it at the end of that
//    forward, and all take the path above. Still not covered: one inside
//    backward before the BatchNorm backward allreduces are done.

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "collective/communicator.h"
#include "worker/common/faults.h"
#include "worker/config/config.h"
#include "worker/model/model.h"
#include "worker/plan/plan.h"
#include "worker/train/result.h"

namespace batchdist::worker {

/// The figures of a failed step, agreed over the ranks (one allreduce).
struct OomFigures {
  std::vector<int64_t> ranks;  ///< the ranks whose step failed
  double peak_mb = 0;          ///< the highest peak among them
  double capacity_mb = 0;      ///< that rank's limit (CPU: search.memory_limit_mb) or GPU total
};

/// Where the back-off stands between steps; the adaptive checkpoint keeps it
/// (Note [adaptive checkpoint] in worker/train/trainer.h).
struct OomSplitState {
  std::vector<int64_t> larger;  ///< per-GPU batches backed off from (above the split), newest last
  int64_t good_steps = 0;       ///< since the last change of split
  int64_t recover_after = 0;    ///< current wait before a retry (0: never)
  bool retrying = false;        ///< the current split is a retry of a larger one
};

/// Note [oom back-off], this rank's half: injected faults, the BatchNorm buffers
/// a failed step restores, the memory probes, and the back-off's decisions. The
/// trainer applies a decision (Note [split change]) and prints its line.
class OomGuard {
 public:
  /// `faults` (Note [fault plan]): this rank's BATCHDIST_FAULT_OOM tries; null: none.
  OomGuard(collective::Communicator& comm, at::Device device, const Config& cfg,
           const FaultPlan* faults);

  /// Before a try of global step `global_step` (0-based): whether this try
  /// fails on purpose (each injected try is used once).
  void armFault(int64_t global_step);
  bool injectInBackward() const { return inject_ && !inject_forward_; }
  bool injectInForward() const { return inject_ && inject_forward_; }
  /// The try got past the point of injection, or failed: nothing more to inject.
  void disarm() { inject_ = false; }

  /// Before a try: `model`'s buffers (BatchNorm statistics) saved, the step's
  /// memory peak reset.
  void beginTry(const Model& model);
  /// CPU: whether the try's peak resident memory exceeded search.memory_limit_mb
  /// (an out-of-memory, as in the search); false without a limit or on CUDA.
  bool overLimit() const;
  /// After a try that failed on any rank: the buffers as before it (the failed
  /// forward passes updated BatchNorm's running statistics).
  void restoreBuffers();
  /// Every rank, after a failed try: which ranks failed (`failed_here`: this
  /// one), the highest peak and its capacity. Collective (one allreduce).
  OomFigures agreeFigures(bool failed_here);

  /// The back-off from `plan`'s split after step `global_step` (0-based) failed:
  /// the record, with to_per_gpu = 0 when no smaller split is left above
  /// `min_per_gpu`. A smaller split is then in force here (the caller applies it).
  OomBackoff backOff(const Plan& plan, const OomFigures& f, int64_t min_per_gpu,
                     int64_t global_step);
  /// Before a step: the larger per-GPU batch to try again now
  /// (train.oom_recover_after_steps), or 0. A retry is then in force.
  int64_t recoverTo(const Plan& plan);
  void goodStep() { ++state_.good_steps; }
  /// The split changed (any cause): good steps are counted from zero.
  void splitChanged() { state_.good_steps = 0; }
  /// An adaptive decision moved the split to per-GPU batch `per_gpu`: no retry,
  /// and the batches backed off from stay marked only above it.
  void adaptiveSplit(int64_t per_gpu);

  const OomSplitState& state() const { return state_; }
  /// Takes back a checkpoint's state (a resume on the same world size).
  void restore(OomSplitState state) { state_ = std::move(state); }
  /// The step's peak (CUDA: allocated bytes; CPU: resident set), in MB.
  double stepPeakMb() const;
  /// The run's peak so far, this step's included.
  double runPeakMb() const { return std::max(run_peak_mb_, stepPeakMb()); }
  /// What the peak is measured against: the GPU's memory, or the CPU limit (0: none).
  double capacityMb() const;

 private:
  void resetStepPeak();
  void saveBuffers(const Model& model);

  collective::Communicator& comm_;
  at::Device device_;
  std::vector<std::pair<int64_t, bool>> faults_;  ///< (step, in forward), one per try
  bool inject_ = false;
  bool inject_forward_ = false;
  double limit_mb_ = 0;  ///< CPU: search.memory_limit_mb (0: none)
  OomSplitState state_;
  double run_peak_mb_ = 0;  ///< the run's peak (the step's is reset each step)
  /// The model's buffers before the step, per dtype.
  struct SavedBuffers {
    std::vector<at::Tensor> live;
    at::Tensor saved;
  };
  std::vector<SavedBuffers> buffers_;
};

/// "out of memory at step S on rank(s) ... with per-GPU batch m x accumulation a
/// (peak ... MB ...)": the start of the back-off's line and of a failure.
std::string oomWhat(const OomBackoff& b, bool cuda);
/// The run's failure when nothing is left below `b` (`min_per_gpu`: the floor).
std::string oomFailure(const OomBackoff& b, bool cuda, int64_t min_per_gpu);

}  // namespace batchdist::worker
