#pragma once
// The training loop: plan -> micro-batches -> forward/backward -> gradient sum ->
// optimizer, with distributed evaluation, per-epoch health checks and a
// breakdown of where the time goes.
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

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "collective/communicator.h"
#include "collective/grad_sync.h"
#include "worker/common/faults.h"
#include "worker/config/config.h"
#include "worker/data/data.h"
#include "worker/data/loader.h"
#include "worker/model/model.h"
#include "worker/plan/adapt.h"
#include "worker/plan/plan.h"
#include "worker/model/optimizer.h"
#include "worker/model/precision.h"
#include "worker/train/evaluator.h"
#include "worker/train/gpu_monitor.h"
#include "worker/train/noise_scale.h"
#include "worker/task/task.h"
#include "worker/train/result.h"
#include "worker/train/train_log.h"

namespace batchdist::worker {

// Note [adaptive training]: batch.adapt: goodput in the training loop (the
// decision itself is Note [goodput] in worker/plan/adapt.h).
//  - The trainer keeps the plan at G0 (plan0: the lr schedule and the run's
//    length) apart from the split in force (plan_). Every batch.adapt_every_steps
//    steps and at the first step of every epoch after the first, all ranks meet
//    in one small allreduce (MAX of the smoothed B_simple and of the per-step
//    fixed cost) and call decideGlobalBatch() with the same figures, so they
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
//    splits over the new world with the new search's sizes, else decided anew.
//  - One line on rank 0 per change; report.json's batch_history; metrics.jsonl
//    lines carry `progress`.

class Console;
class Checkpointer;
struct TrainState;

/// Note [step wishes]: what one rank asks of a step, carried in the gradient
/// allreduce's side channel at no extra collective. Each wish has a slot of its
/// own that counts the ranks asking (0..W), so the summed channel is exact in the
/// fp32 bucket for any W below 2^24: no packing of several counts into one number
/// (exact only while W (W + 2) < 2^24, about 4 000 ranks).
struct StepWishes {
  bool stop = false;        ///< a stop signal arrived: every rank stops after this step
  bool checkpoint = false;  ///< a checkpoint is due (e.g. SIGUSR1): every rank writes it
  bool oom = false;         ///< this step ran out of memory (Note [oom back-off])
};

/// This rank's wishes as its share of the side channel.
collective::SideChannel packWishes(const StepWishes& mine);
/// The job's wishes from the side channel summed over the ranks: any rank's wish counts.
StepWishes unpackWishes(const collective::SideChannel& summed);

class Trainer {
 public:
  /// Builds the model (seeded, identical on every rank; rank 0's state is
  /// broadcast anyway), the optimizer and the loader. Collective. `faults`: the
  /// faults the tests inject (Note [fault plan]), read here and not kept; null:
  /// none.
  Trainer(const Config& cfg, collective::Communicator& comm, const DataSplit& data,
          at::Device device, const Plan& plan, const FaultPlan* faults = nullptr);
  ~Trainer();

  const Plan& plan() const { return plan_; }
  /// Replaces the plan (the batch search measures several per-GPU batches).
  void setPlan(const Plan& plan) { plan_ = plan; }
  Model& model() { return *model_; }
  const Task& task() const { return *task_; }
  Loader& loader() { return *loader_; }
  at::Device device() const { return device_; }

  /// This rank's micro-batches for steps [first, first + count) of the sharder's
  /// current epoch, in the order the step functions consume them.
  std::vector<MicroBatch> jobs(const Sharder& sharder, int64_t first, int64_t count) const;

  /// One optimizer step over the next plan().accum batches of loader(); `real`
  /// is the step's number of real samples over all ranks (Sharder::realSamples).
  /// Returns this rank's loss sum. `stop`, if given, is this rank's stop request
  /// in and "any rank asked" out (agreed in the gradient allreduce).
  double trainStep(int64_t real, double lr, bool* stop = nullptr, bool* checkpoint = nullptr);

  // trainStep() in its three parts. A rank whose computeGradients() failed (out
  // of memory) still calls syncGradients(), which sends what it has (zeros), so
  // no rank waits forever (Note [search agreement] in worker/search/search.h):
  // with the overlapped reducer the other ranks' buckets start during their
  // backward and this rank's in syncGradients(), in the same order.

  /// Forward and backward over the next plan().accum batches; returns the loss sum.
  double computeGradients(int64_t real);
  /// Drops all gradients (after a failed computeGradients()).
  void clearGradients();
  /// Sums gradients over the ranks (zeros where this rank has none). `stop`,
  /// `checkpoint` and `oom`, if given, are this rank's wishes (oom: its step
  /// failed) in and "any rank" out, agreed in the same allreduce.
  void syncGradients(bool* stop = nullptr, bool* checkpoint = nullptr, bool* oom = nullptr);
  /// Optimizer update at `lr` (fp16: unscales, or skips a step with inf/NaN gradients).
  void applyUpdate(double lr);

  /// Takes rank 0's BatchNorm buffers (as DDP's broadcast_buffers), then
  /// evaluates this rank's shard of the validation set; every validation sample
  /// counts exactly once over all ranks (Evaluator). Collective.
  EvalResult evaluate() { return evaluator_->evaluate(plan_.per_gpu); }

  /// Throws TrainingError if a parameter or buffer is not finite on any rank, or
  /// the parameters differ between ranks.
  void checkHealth(int64_t epoch);

  /// Full run over plan().epochs (or train.max_steps). `stop_requested` is polled
  /// every step (e.g. a SIGTERM flag); when it is true on any rank, every rank
  /// finishes the same step and the run ends with `completed = false`.
  TrainResult train(Console& console, const std::function<bool()>& stop_requested = {});

  /// Checkpoints during train() (Note [checkpoint]); null: none. Not owned.
  void setCheckpointer(Checkpointer* checkpointer) { checkpointer_ = checkpointer; }
  /// Rank 0: called with each metrics point as it is made (metrics.jsonl, TensorBoard).
  void setMetricSink(std::function<void(const MetricPoint&)> sink) { log_.setSink(std::move(sink)); }
  /// Makes train() continue from `pos` (state restored with restoreState first).
  void resumeAt(const TrainPosition& pos) { resume_ = pos; }
  /// batch.adapt: goodput (Note [adaptive training]): `space` from adaptSpace()
  /// with the search's throughput table. Call before train() and resumeAt's train.
  void setAdaptive(const AdaptSpace& space);
  /// The model, optimizer and loss scaler, for checkpoints.
  TrainState state();

  /// Time spent since the last call (this rank).
  TimeBreakdown takeTime();

  /// The gradient noise scale measured so far (train.noise_scale; Note [gradient
  /// noise scale] in noise_scale.h): fed by every syncGradients() of a step whose
  /// samples are all real, with more than one rank.
  const NoiseScaleEstimator& noiseScale() const { return noise_; }

 private:
  struct EpochRun;
  /// Where the out-of-memory back-off stands (Note [oom back-off]).
  struct OomState {
    std::vector<std::pair<int64_t, bool>> faults;  ///< Note [fault plan]: (step, in forward) tries
    bool inject = false;            ///< fail the current try (this rank)
    bool inject_forward = false;    ///< ... in forward rather than backward
    bool failed_here = false;       ///< the last try failed on this rank
    std::vector<int64_t> larger;    ///< per-GPU batches backed off from (above the split), newest last
    int64_t good_steps = 0;         ///< since the last switch of split
    int64_t recover_after = 0;      ///< current wait before a retry (0: never)
    bool retrying = false;          ///< the current split is a retry of a larger one
    double limit_mb = 0;            ///< CPU: search.memory_limit_mb (0: none)
    /// The model's buffers (BatchNorm statistics) before the step, per dtype.
    struct SavedBuffers {
      std::vector<at::Tensor> live;
      at::Tensor saved;
    };
    std::vector<SavedBuffers> buffers;
  };
  /// The figures of a failed step, agreed over the ranks (one allreduce).
  struct OomFigures {
    std::vector<int64_t> ranks;
    double peak_mb = 0;
    double capacity_mb = 0;
  };
  /// NVML utilization, sampled every 10 steps on CUDA.
  struct UtilizationSampler {
    std::unique_ptr<GpuMonitor> monitor;
    double sum = 0;
    int64_t count = 0;
    void sample(int64_t global_step);
  };
  /// One step with Note [oom back-off]: tries it, backs off and redoes it until
  /// it fits. Returns false when nothing is left (result.failure says why).
  bool runStep(EpochRun& e, Sharder& sharder, int64_t s, int64_t global_step, bool* stop,
               bool* due, TrainResult& result, double* loss);
  /// One try of a step; false (nothing applied) if any rank ran out of memory.
  bool tryStep(int64_t real, double lr, bool* stop, bool* checkpoint, double* loss);
  /// One micro-batch's forward and weighted loss sum; with synchronised BatchNorm
  /// ends with the agreement of Note [sync batchnorm failure] (throws
  /// PeerOutOfMemory when another rank failed). `inject`: Note [fault plan]'s oom.
  at::Tensor forwardLoss(const Batch& batch, bool inject);
  /// Forward and backward, an out-of-memory caught; true if this rank failed.
  bool computeOrFail(int64_t real, double* loss);
  OomFigures agreeOomFigures(bool failed);
  /// How a change of split cuts the rest of the epoch (Note [split change]).
  enum class SplitCut { kKeep, kAnew };
  /// Every rank's split becomes `to` from step `s` of this epoch (Note [split change]).
  void changeSplit(EpochRun& e, Sharder& sharder, int64_t s, const AdaptSplit& to, SplitCut cut);
  /// After a failed try: the smaller split, or false at the minimum.
  bool backOff(EpochRun& e, Sharder& sharder, int64_t s, int64_t global_step,
               const OomFigures& f, TrainResult& result);
  /// Before a step: the larger split again when train.oom_recover_after_steps says so.
  void maybeRecover(EpochRun& e, Sharder& sharder, int64_t s, int64_t global_step,
                    TrainResult& result);
  void saveBuffers();
  void restoreBuffers();
  void resetStepPeak();
  double stepPeakMb() const;
  double capacityMb() const;
  void runSteps(EpochRun& e, Sharder& sharder, int64_t* global_step,
                const std::function<bool()>& stop_requested, Console& console, double run_started,
                UtilizationSampler& gpu, TrainResult& result);
  void checkpoint(const EpochRun& e, int64_t global_step, bool mid_epoch, Console& console,
                  TrainResult& result);
  /// After step `step` of `e`: the progress line and rank 0's metrics point (TrainLog).
  void logStep(Console& console, EpochRun& e, int64_t step, int64_t global_step,
               double run_started, TrainResult& result);
  /// At the end of epoch `e` (`h`: its figures and evaluation): rank 0's metrics point.
  void logEpoch(const EpochRun& e, const EpochStats& h, int64_t global_step, double run_started,
                TrainResult& result);
  /// The figures TrainLog shows after a step of epoch `epoch`; the peak memory is
  /// read when `peak` (a metrics point) or on CUDA (the progress line shows it).
  StepFigures stepFigures(int64_t epoch, int64_t global_step, bool peak) const;
  void recordNoise();
  /// Note [adaptive training]: before step `s`, every rank's same decision.
  void maybeAdapt(EpochRun& e, Sharder& sharder, int64_t s, int64_t global_step,
                  TrainResult& result);
  /// Note [adaptive training]: takes rank 0's split (broadcast) should this
  /// rank's decision `d` differ from it, and says so. Collective.
  void followRankZero(AdaptDecision& d, const AdaptSplit& current, int64_t global_step);
  /// Starts a history segment at `global_step` with the split in force.
  void beginSegment(int64_t global_step, double b_noise, double efficiency,
                    const std::string& why, TrainResult& result);
  /// The learning rate of the next step (adaptive: AdaScale on the progress).
  double stepLr(int64_t global_step) const;
  /// Note [adaptive checkpoint]: the record for a resume at step `next_step` of
  /// epoch `epoch` whose cut begins at (cut_step, cut_begin).
  nlohmann::ordered_json adaptRecord(int64_t epoch, int64_t next_step, int64_t cut_step,
                                     int64_t cut_begin) const;
  /// The epoch's label on the console: "epoch 3/20", or "epoch 3" when adaptive.
  std::string epochLabel(int64_t epoch) const;
  /// Takes back a checkpoint's adaptive record (or starts the history at G0).
  void restoreAdaptive(const nlohmann::ordered_json& rec, TrainResult& result);
  /// ... its split, figures and back-off state on the world that wrote it (bitwise).
  void restoreAdaptSameWorld(const nlohmann::ordered_json& rec);
  /// ... or global batch `g` split anew over this world.
  void resplitAdaptForWorld(int64_t g);
  void resumedOtherSplit(int64_t step, TrainResult& result);
  PhaseSeconds phaseSeconds(const TrainResult& result) const;
  void trackMicroBatch(int64_t k);
  NoiseScaleResult noiseResult() const;
  EpochStats finishEpoch(const EpochRun& e, Console& console);
  /// The epoch `epoch` from `global_step` on: its sharder cut and the loader started.
  EpochRun beginEpoch(Sharder& sharder, int64_t epoch, int64_t global_step);
  void stoppedLine(Console& console, int64_t global_step, int64_t epoch) const;
  /// After the last step: the run's figures in `result`. Collective (the data errors:
  /// gatherDataFigures).
  void summarise(TrainResult& result, int64_t global_step, double wall_s, double train_time,
                 const UtilizationSampler& gpu);
  void synchronize() const;

  std::vector<double> step_seconds_;  ///< wall time of this run's steps (the first 100 000)

  const Config& cfg_;
  collective::Communicator& comm_;
  const DataSplit& data_;
  at::Device device_;
  Plan plan_;
  std::unique_ptr<Task> task_;  ///< Note [task]
  std::unique_ptr<Model> model_;
  std::unique_ptr<Optimizer> optimizer_;
  std::unique_ptr<collective::GradientSync> grad_sync_;  ///< Note [gradient sync]
  std::unique_ptr<Loader> loader_;
  std::unique_ptr<Evaluator> evaluator_;
  std::unique_ptr<LossScaler> scaler_;  // fp16 only
  TimeBreakdown time_;
  Checkpointer* checkpointer_ = nullptr;
  TrainPosition resume_;
  /// Note [adaptive training]
  struct AdaptState {
    bool on = false;
    Plan plan0;                       ///< the plan at G0
    AdaptSpace space;                 ///< fixed_step_s < 0 until frozen
    std::vector<AdaptSegment> segments;
    std::vector<BatchChange> history;  ///< report.json's batch_history
    double b_noise = -1;              ///< the current segment's B (its gain's)
    double progress = 0;              ///< G0-equivalent steps done
    int64_t last_decision = 0;        ///< global step of the last decision
    double fixed_sum = 0;             ///< this rank: comm + update seconds of good steps
    int64_t fixed_steps = 0;
    double step_sum = 0;              ///< this rank: wall seconds of good steps
    int64_t step_count = 0;
    bool done = false;                ///< progress reached plan0.total_steps
    int64_t followed = 0;             ///< decisions this rank took from rank 0 (followRankZero)
    // Resume: where the epoch stands (Note [adaptive checkpoint]).
    int64_t resume_epoch = -1, resume_step = 0, resume_cut_step = 0, resume_cut_begin = 0;
  };
  AdaptState adapt_;
  double update_s_ = 0;  ///< optimizer update seconds (this rank), for the fixed cost
  double last_lr_ = 0;   ///< the lr of the last step run
  /// Note [fault plan]: BATCHDIST_FAULT_SLOW_UPDATE_US=N makes this rank's
  /// optimizer update N us slower (a rank with its own timings).
  int64_t slow_update_us_ = 0;
  bool adapt_figures_fault_ = false;  ///< BATCHDIST_FAULT_ADAPT_FIGURES names this rank
  OomState oom_;
  Console* console_ = nullptr;  ///< during train(): for the back-off lines
  TrainLog log_;  ///< rank 0's progress line and metrics points
  double run_peak_mb_ = 0;      ///< CUDA: the run's peak (the step's is reset each step)
  NoiseScaleEstimator noise_;
  double grad_scale_ = 1;  // fp16 loss scale the current gradients carry
  int64_t step_real_ = 0;  // real samples of the current step, all ranks
  // One rank with accumulation: the micro-batches give B_small (Note [gradient
  // noise scale]); the previous micro-batch's running gradient, sum of |d_k|^2.
  bool microNoise() const {
    return cfg_.train.noise_scale && comm_.size() == 1 && plan_.accum > 1;
  }
  // Note [noise cadence]: steps started so far (the same count on every rank, OOM
  // retries included) and whether the current one measures the norms.
  int64_t noise_ticks_ = 0;
  bool noise_now_ = false;
  std::vector<at::Tensor> micro_prev_;
  at::Tensor micro_sq_, micro_total_sq_;
};

}  // namespace batchdist::worker
