#pragma once
// The training loop: plan -> micro-batches -> forward/backward -> gradient sum ->
// optimizer, with distributed evaluation, per-epoch health checks and a
// breakdown of where the time goes.
//
// The out-of-memory back-off: Note [oom back-off] in worker/train/oom_guard.h.

#include <ATen/core/Tensor.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "collective/communicator.h"
#include "worker/common/faults.h"
#include "worker/config/config.h"
#include "worker/data/data.h"
#include "worker/data/loader.h"
#include "worker/model/model.h"
#include "worker/plan/adapt.h"
#include "worker/plan/plan.h"
#include "worker/train/evaluator.h"
#include "worker/train/noise_scale.h"
#include "worker/train/oom_guard.h"
#include "worker/task/task.h"
#include "worker/train/result.h"
#include "worker/train/system_sampler.h"
#include "worker/train/train_log.h"
#include "worker/train/update_strategy.h"

namespace batchdist::worker {

// Note [adaptive training] and Note [adaptive checkpoint]: in
// worker/train/adaptive_batch.h (the adaptive batch's controller, AdaptiveBatch).

class AdaptiveBatch;
struct AdaptRecordParts;
class Console;
class Checkpointer;
class StepProfiler;
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
  /// broadcast anyway), the update strategy (Note [update strategy]: gradient
  /// sync and optimizer) and the loader. Collective. `faults`: the
  /// faults the tests inject (Note [fault plan]), read here and not kept; null:
  /// none.
  Trainer(const Config& cfg, collective::Communicator& comm, const DataSplit& data,
          at::Device device, const Plan& plan, const FaultPlan* faults = nullptr);
  ~Trainer();

  const Plan& plan() const { return plan_; }
  /// Replaces the plan (the batch search measures several per-GPU batches).
  void setPlan(const Plan& plan) { plan_ = plan; }
  Model& model() { return *model_; }
  /// How gradients become a step (Note [update strategy]).
  UpdateStrategy& update() { return *update_; }
  /// A new update strategy from the config the trainer was built with, whose
  /// dist.shard the caller has changed since (Note [lever switch] in
  /// worker/train/step_measurer.cc); the model's parameters stay as they are, the
  /// gradients and optimizer state start anew. The old one is gone first (its
  /// memory, its hooks). Collective, as the constructor.
  void rebuildUpdate();
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
  /// Optimizer update at `lr` (UpdateStrategy::step: fp16 unscales, or skips a
  /// step with inf/NaN gradients), timed.
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
  /// Traces steps of train() (Note [step profiler]); null: none. Not owned.
  void setProfiler(StepProfiler* profiler) { profiler_ = profiler; }
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
  /// One step with Note [oom back-off]: tries it, backs off and redoes it until
  /// it fits. Returns false when nothing is left (result.failure says why).
  bool runStep(EpochRun& e, Sharder& sharder, int64_t s, int64_t global_step, bool* stop,
               bool* due, TrainResult& result, double* loss);
  /// Note [fault plan]'s hang: outside any collective, the heartbeat still beating.
  [[noreturn]] void hangForever(int64_t step) const;
  /// One try of a step; false (nothing applied) if any rank ran out of memory.
  bool tryStep(int64_t real, double lr, bool* stop, bool* checkpoint, double* loss);
  /// One micro-batch's forward and weighted loss sum; with synchronised BatchNorm
  /// ends with the agreement of Note [sync batchnorm failure] (throws
  /// PeerOutOfMemory when another rank failed). `inject`: Note [fault plan]'s oom.
  at::Tensor forwardLoss(const Batch& batch, bool inject);
  /// Forward and backward, an out-of-memory caught; true if this rank failed.
  bool computeOrFail(int64_t real, double* loss);
  /// How a change of split cuts the rest of the epoch (Note [split change]).
  enum class SplitCut { kKeep, kAnew };
  /// Every rank's split becomes `to` from step `s` of this epoch (Note [split change]).
  void changeSplit(EpochRun& e, Sharder& sharder, int64_t s, const AdaptSplit& to, SplitCut cut);
  /// After a failed try: the smaller split in force, or false at the minimum.
  bool backOff(EpochRun& e, Sharder& sharder, int64_t s, int64_t global_step, TrainResult& result);
  /// Before a step: the larger split again when train.oom_recover_after_steps says so.
  void maybeRecover(EpochRun& e, Sharder& sharder, int64_t s, int64_t global_step,
                    TrainResult& result);
  void runSteps(EpochRun& e, Sharder& sharder, int64_t* global_step,
                const std::function<bool()>& stop_requested, Console& console, double run_started,
                TrainResult& result);
  void checkpoint(const EpochRun& e, int64_t global_step, bool mid_epoch, Console& console,
                  TrainResult& result);
  /// Rank 0's line when this rank's trace was written (Note [step profiler]).
  void profileWritten(Console& console) const;
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
  /// Note [adaptive training]: before step `s`, every rank's same decision
  /// (AdaptiveBatch::decide), and a new split applied.
  void maybeAdapt(EpochRun& e, Sharder& sharder, int64_t s, int64_t global_step);
  /// The learning rate of the next step (adaptive: AdaScale on the progress).
  double stepLr(int64_t global_step) const;
  /// Note [adaptive checkpoint]: the record for a resume at step `next_step` of
  /// epoch `epoch` whose cut begins at (cut_step, cut_begin).
  nlohmann::ordered_json adaptRecord(int64_t epoch, int64_t next_step, int64_t cut_step,
                                     int64_t cut_begin) const;
  /// ... its entries the back-off and the noise estimator keep.
  AdaptRecordParts adaptRecordParts() const;
  /// The epoch's label on the console: "epoch 3/20", or "epoch 3" when adaptive.
  std::string epochLabel(int64_t epoch) const;
  /// Takes back a checkpoint's adaptive record (or starts the history at G0).
  void restoreAdaptive(const nlohmann::ordered_json& rec);
  /// ... its entries the noise estimator and (on the world that wrote it) the back-off keep.
  void restoreAdaptRecordParts(const nlohmann::ordered_json& rec);
  PhaseSeconds phaseSeconds(const TrainResult& result) const;
  void trackMicroBatch(int64_t k);
  NoiseScaleResult noiseResult() const;
  EpochStats finishEpoch(const EpochRun& e, Console& console);
  /// The epoch `epoch` from `global_step` on: its sharder cut and the loader started.
  EpochRun beginEpoch(Sharder& sharder, int64_t epoch, int64_t global_step);
  void stoppedLine(Console& console, int64_t global_step, int64_t epoch) const;
  /// After the last step: the run's figures in `result`. Collective (the data errors:
  /// gatherDataFigures).
  void summarise(TrainResult& result, int64_t global_step, double wall_s, double train_time);
  void synchronize() const;

  std::vector<double> step_seconds_;  ///< wall time of this run's steps (the first 100 000)

  const Config& cfg_;
  collective::Communicator& comm_;
  const DataSplit& data_;
  at::Device device_;
  Plan plan_;
  std::unique_ptr<Task> task_;  ///< Note [task]
  std::unique_ptr<Model> model_;
  std::unique_ptr<UpdateStrategy> update_;  ///< Note [update strategy]
  std::unique_ptr<Loader> loader_;
  std::unique_ptr<Evaluator> evaluator_;
  TimeBreakdown time_;
  Checkpointer* checkpointer_ = nullptr;
  StepProfiler* profiler_ = nullptr;
  std::unique_ptr<SystemSampler> system_;   ///< Note [system metrics] (none: report.sample_s 0)
  std::vector<SystemPoint> system_series_;  ///< this rank's, one per metrics interval
  TrainPosition resume_;
  std::unique_ptr<AdaptiveBatch> adapt_;  ///< batch.adapt: goodput or warmup (null: off)
  double update_s_ = 0;  ///< optimizer update seconds (this rank), for the fixed cost
  double last_lr_ = 0;   ///< the lr of the last step run
  /// Note [fault plan]: BATCHDIST_FAULT_SLOW_UPDATE_US=N makes this rank's
  /// optimizer update N us slower (a rank with its own timings).
  int64_t slow_update_us_ = 0;
  bool adapt_figures_fault_ = false;  ///< BATCHDIST_FAULT_ADAPT_FIGURES names this rank
  int64_t hang_step_ = 0;  ///< BATCHDIST_FAULT_HANG: this rank hangs before this step (0: never)
  OomGuard oom_;  ///< Note [oom back-off]
  bool failed_here_ = false;  ///< the last try failed on this rank
  Console* console_ = nullptr;  ///< during train(): for the back-off lines
  TrainLog log_;  ///< rank 0's progress line and metrics points
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
