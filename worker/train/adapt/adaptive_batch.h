#pragma once
// The adaptive global batch in the training loop (batch.adapt: goodput or warmup):
// when a decision is due, the figures every rank decides from, rank 0's split
// taken by all, the gain segments and the lr they give, the checkpoint record.
// The decision itself is Note [goodput] or Note [batch-size warmup] in
// worker/plan/adapt.h (decideAdaptive(), by batch.adapt); the trainer applies a
// new split (Note [split change] in worker/train/trainer.cc).
//
// Note [adaptive training]: batch.adapt: goodput or warmup in the training loop
// (the decision itself is Note [goodput] or Note [batch-size warmup] in
// worker/plan/adapt.h; everything below holds for both).
//  - The plan at G0 (plan0: the lr schedule and the run's length) is kept here,
//    apart from the trainer's split in force (its plan_). Every batch.adapt_every_steps
//    steps and at the first step of every epoch after the first, all ranks meet
//    in one small allreduce (MAX of the smoothed B_simple and of the per-step
//    fixed cost) and call decideAdaptive() with the same figures, so they
//    reach the same split. The throughput table is the batch search's
//    (identical on every rank: agreed in the search, read back from the cache
//    by rank 0 and broadcast whole, or read from the checkpoint): the sizes
//    dividing G0 / W, measured at their accumulation G0 / (m W) and taken as
//    the rate at accumulation 1 (slightly optimistic for the smaller ones),
//    and Note [adapt range]'s larger ones at accumulation 1; with a fixed
//    batch.per_gpu, the run's own steps up to the first decision. The fixed
//    cost c (exposed allreduce + optimizer update per step, the slowest rank's
//    mean) is measured until the first decision after every rank ran a step,
//    and then frozen: later decisions
//    depend on B alone, which every rank computes from the same allreduced
//    norms, so a resumed run decides as the uninterrupted one would.
//  - Rank 0's split is broadcast with every decision and taken by all: a rank
//    whose figures differed (a bug: it happened once, when a cache hit reached
//    the other ranks without the table) would otherwise post collectives of
//    other sizes, which MPI may answer with a truncation and a corrupted heap.
//    Such a rank says so on stderr. Fault injection for tests (Note [fault
//    plan]): BATCHDIST_FAULT_ADAPT_FIGURES=R starts rank R with an empty table.
//  - No decision before the warmup (plan0.warmup_steps) is over: G stays G0
//    through it (batch.adapt_in_warmup: true lifts that). The warmup exists because the first steps are fragile, and a
//    larger G would multiply its lr by the gain r; and B_simple measured while
//    the lr still rises describes a transient (configs/adaptive-wide.yaml: 843
//    at step 100, 428 at the warmup's end, step 1200). An A/B over 5 seeds there:
//    with this rule every seed reached fixed G0's final accuracy, without it 2
//    of 5 (docs/batch-search.md, Benchmark).
//  - A new G takes effect at the next step: the rest of the epoch is cut again
//    from the position that step would have begun at (Note [adaptive cut] in
//    worker/plan/plan.h), the loader restarted with the new jobs. An
//    out-of-memory back-off (Note [oom back-off]) halves m under the current G,
//    and a later decision starts from the split it left.
//  - The gain r of each segment (AdaScale's, or G / G0 under batch.adapt_gain:
//    linear) is fixed at its decision (a new segment also when G stays but r
//    moved); the progress, in G0-equivalent steps, grows by r per step; the lr is
//    adaptLr(plan0, rule, progress, G, B) and training ends
//    when the progress reaches plan0.total_steps, so the schedule ends where the
//    plan at G0 put it and an epoch is one pass over the data at whatever G.
//  - Note [adaptive checkpoint]: the manifest's `plan` stays plan0 (so resume's
//    checks and its planning at G0 hold); `adapt` records the split in force,
//    the epoch and its cut, the progress, the history, the throughput table, c
//    (or the sums it is being measured from), where the out-of-memory back-off
//    stands, and the noise estimator (with the count of steps started, so the
//    noise cadence resumes in phase). On the same world size the split and figures are
//    taken back and the run continues bitwise; on another, G is kept if it
//    splits over the new world with the new search's sizes, else decided anew
//    (resumeSplit() in worker/plan/adapt.h).
//  - Under warmup too the throughput table and c are kept and shared: they
//    choose the split of each G (the fastest modelled), not whether G grows.
//  - One line on rank 0 per change; report.json's batch_history; metrics.jsonl
//    lines carry `progress`.

#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "collective/communicator.h"
#include "worker/config/config.h"
#include "worker/plan/adapt.h"
#include "worker/plan/plan.h"
#include "worker/train/result.h"

namespace batchdist::worker {

class Console;

/// The throughput table a decision uses (Note [adaptive training]): `measured`'s,
/// without the per-GPU batches at or above the smallest of `backed_off` (those the
/// out-of-memory back-off left: no decision goes back to one, Note [oom
/// back-off]), and, when `per_gpu` (the split in force) has no figure, the lowest
/// figure standing for it, so the decision still moves. Pure.
AdaptSpace spaceInForce(const AdaptSpace& measured, const std::vector<int64_t>& backed_off,
                        int64_t per_gpu);

/// Where a resumed run's epoch stands (Note [adaptive checkpoint]).
struct AdaptResumePoint {
  int64_t epoch = -1;     ///< the epoch the run continues in
  int64_t step = 0;       ///< its next step
  int64_t cut_step = 0;   ///< Note [adaptive cut] in worker/plan/plan.h: where its cut begins
  int64_t cut_begin = 0;  ///< ... and the sample position there
};

/// The entries of Note [adaptive checkpoint]'s record that others keep: where the
/// out-of-memory back-off stands and the noise estimator.
struct AdaptRecordParts {
  nlohmann::ordered_json oom;    ///< {larger, good_steps, recover_after, retrying}
  nlohmann::ordered_json noise;  ///< adapt_record::noiseJson()
  int64_t noise_ticks = 0;       ///< Note [noise cadence]: steps started so far
};

/// Note [adaptive training]: the controller of an adaptive global batch. It keeps
/// the plan at G0, the throughput table, the fixed cost, the progress and the
/// history; the trainer keeps the split in force, passes it in, and applies the
/// new split decide() returns. The same calls in the same order on every rank;
/// restore() first (a fresh run passes a null record): it begins the history.
class AdaptiveBatch {
 public:
  /// `plan0`: the plan at G0; `space` from adaptSpace() with the search's
  /// throughput table. `figures_fault`: Note [fault plan]'s
  /// BATCHDIST_FAULT_ADAPT_FIGURES names this rank (it starts with no table).
  AdaptiveBatch(const BatchConfig& batch, OptimName optimizer, collective::Communicator& comm,
                const Plan& plan0, const AdaptSpace& space, bool figures_fault = false);

  /// After a good step: it counts the current segment's gain in G0 steps; `fixed_s`
  /// (exposed allreduce + optimizer update) and `step_s` (wall) are this rank's
  /// seconds. True when the progress reached plan0's total steps: the run ends
  /// after this step.
  bool countStep(double fixed_s, double step_s);

  /// Before step `s` of the epoch (global step `global_step`) at split `current`:
  /// when a decision is due, every rank's same one. Collective then (an allreduce
  /// of the figures, `b_simple` this rank's smoothed B_simple, then rank 0's split
  /// broadcast); returns at once otherwise. `backed_off`: spaceInForce()'s. Says a
  /// change on `console` (null: nowhere). Returns the split the trainer must take
  /// from step `s` on (its segment already begun), or nothing when it stays.
  std::optional<AdaptSplit> decide(int64_t s, int64_t global_step, const AdaptSplit& current,
                                   double b_simple, const std::vector<int64_t>& backed_off,
                                   Console* console);

  /// The lr of the next step at global batch `global`: AdaScale on the progress
  /// (adaptLr).
  double lr(int64_t global) const;

  /// Note [adaptive checkpoint]: the record for a resume at step `next_step` of
  /// epoch `epoch`, whose cut begins at (cut_step, cut_begin), at `split`.
  nlohmann::ordered_json record(const AdaptSplit& split, int64_t epoch, int64_t next_step,
                                int64_t cut_step, int64_t cut_begin,
                                const AdaptRecordParts& parts) const;

  /// Takes back a checkpoint's record `rec` for a run continuing at global step
  /// `step` with plan `plan` (null: a fresh run, or a checkpoint of a run at G0
  /// only: the history starts at G0). Its own entries only: the caller restores
  /// AdaptRecordParts'. Returns the plan to continue with when the record sets
  /// the split (the same world: the record's; another: Note [adaptive
  /// checkpoint]). Throws Error on a damaged record.
  std::optional<Plan> restore(const nlohmann::ordered_json& rec, int64_t step, const Plan& plan,
                              Console* console);

  const Plan& plan0() const { return plan0_; }
  /// G0-equivalent steps done.
  double progress() const { return progress_; }
  /// The progress reached plan0's total steps.
  bool done() const { return done_; }
  /// The steps left at the current segment's gain (for the ETA).
  double stepsLeft() const;
  const AdaptResumePoint& resumePoint() const { return resume_; }
  /// Every split used, in order: report.json's batch_history.
  const std::vector<BatchChange>& history() const { return history_; }

 private:
  /// The warmup, the cadence, once per step.
  bool due(int64_t s, int64_t global_step) const;
  /// The allreduced figures (MAX); the fixed cost frozen at the first decision
  /// after every rank ran a step. Returns B.
  double agreeFigures(double b_simple, const AdaptSplit& current);
  /// Note [adaptive training]: takes rank 0's split (broadcast) should this
  /// rank's decision `d` differ from it, and says so. Collective.
  void followRankZero(AdaptDecision& d, const AdaptSplit& current, int64_t global_step);
  /// The segments and history after decision `d` on figure `b`.
  std::optional<AdaptSplit> settle(const AdaptDecision& d, const AdaptSplit& current,
                                   int64_t global_step, double b, Console* console);
  /// Starts a history segment at `global_step` with `split`.
  void beginSegment(int64_t global_step, const AdaptSplit& split, double b_noise,
                    double efficiency, const std::string& why);
  /// A fresh run (or one at G0 so far) continuing at `step`.
  void startAtG0(int64_t step, const Plan& plan);
  /// The record's split and figures on the world that wrote it (bitwise).
  Plan restoreSameWorld(const nlohmann::ordered_json& rec, const Plan& plan);
  /// ... or global batch `g` split anew over this world.
  std::optional<Plan> resplitForWorld(int64_t g, const Plan& plan);
  void resumedOtherSplit(int64_t step, const Plan& now, Console* console);

  BatchConfig batch_;
  OptimName optimizer_;
  collective::Communicator& comm_;
  Plan plan0_;                        ///< the plan at G0
  AdaptSpace space_;                  ///< fixed_step_s < 0 until frozen
  std::vector<AdaptSegment> segments_;
  std::vector<BatchChange> history_;  ///< report.json's batch_history
  double b_noise_ = -1;               ///< the current segment's B (its gain's)
  double progress_ = 0;               ///< G0-equivalent steps done
  int64_t last_decision_ = 0;         ///< global step of the last decision
  double fixed_sum_ = 0;              ///< this rank: comm + update seconds of good steps
  int64_t fixed_steps_ = 0;
  double step_sum_ = 0;               ///< this rank: wall seconds of good steps
  int64_t step_count_ = 0;
  bool done_ = false;                 ///< progress reached plan0.total_steps
  int64_t followed_ = 0;              ///< decisions this rank took from rank 0 (followRankZero)
  AdaptResumePoint resume_;
};

}  // namespace batchdist::worker
