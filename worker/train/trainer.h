#pragma once
// The run's loop around the step engine: epochs, the adaptive batch, the
// out-of-memory back-off, stop signals, checkpoints, the profiler, the heartbeat,
// the metrics, per-epoch evaluation and health checks, where the time went.
//
// The out-of-memory back-off: Note [oom back-off] in worker/train/oom_guard.h.

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "collective/communicator.h"
#include "worker/common/faults.h"
#include "worker/config/config.h"
#include "worker/data/data.h"
#include "worker/model/flops.h"
#include "worker/plan/adapt.h"
#include "worker/plan/plan.h"
#include "worker/train/oom_guard.h"
#include "worker/train/result.h"
#include "worker/train/observe/system_sampler.h"
#include "worker/train/train_log.h"
#include "worker/train/step/step_engine.h"

namespace batchdist::worker {

// Note [adaptive training] and Note [adaptive checkpoint]: in
// worker/train/adapt/adaptive_batch.h (the adaptive batch's controller, AdaptiveBatch).

class AdaptiveBatch;
struct AdaptRecordParts;
class Console;
class Checkpointer;
class StepProfiler;
struct TrainState;

/// The run's loop (Note [step engine]): epochs of steps of its StepEngine, with
/// the adaptive batch, the out-of-memory back-off, stop signals, checkpoints,
/// the profiler, the heartbeat and the metrics around them.
class Trainer {
 public:
  /// Builds the step engine (StepEngine's constructor: collective) under
  /// `levers` (none: the config's own, concrete). `faults`: the faults the
  /// tests inject (Note [fault plan]), read here and not kept; null: none.
  Trainer(const Config& cfg, collective::Communicator& comm, const DataSplit& data,
          at::Device device, const Plan& plan, const FaultPlan* faults = nullptr,
          std::optional<Levers> levers = std::nullopt);
  ~Trainer();

  /// The step this loop drives.
  StepEngine& engine() { return *engine_; }
  const StepEngine& engine() const { return *engine_; }
  /// The split in force (a back-off or an adaptive decision changes it).
  const Plan& plan() const { return engine_->plan(); }
  Model& model() { return engine_->model(); }
  const Task& task() const { return engine_->task(); }

  /// Full run over plan().epochs (or train.max_steps). `stop_requested` is polled
  /// every step (e.g. a SIGTERM flag); when it is true on any rank, every rank
  /// finishes the same step and the run ends with `completed = false`.
  TrainResult train(Console& console, const std::function<bool()>& stop_requested = {});

  /// Checkpoints during train() (Note [checkpoint]); null: none. Not owned.
  void setCheckpointer(Checkpointer* checkpointer) { checkpointer_ = checkpointer; }
  /// Traces steps of train() (Note [step profiler]); null: none. Not owned.
  void setProfiler(StepProfiler* profiler) { profiler_ = profiler; }
  /// Note [mfu]: MFU beside the rate in the progress line and metrics points.
  void setYardstick(Yardstick y) { yardstick_ = std::move(y); }
  const Yardstick& yardstick() const { return yardstick_; }
  /// Rank 0: called with each metrics point as it is made (metrics.jsonl, TensorBoard).
  void setMetricSink(std::function<void(const MetricPoint&)> sink) { log_.setSink(std::move(sink)); }
  /// Makes train() continue from `pos` (state restored with restoreState first).
  void resumeAt(const TrainPosition& pos) { resume_ = pos; }
  /// batch.adapt: goodput (Note [adaptive training]): `space` from adaptSpace()
  /// with the search's throughput table. Call before train() and resumeAt's train.
  void setAdaptive(const AdaptSpace& space);
  /// The model, optimizer and loss scaler, for checkpoints.
  TrainState state();

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
  EpochStats finishEpoch(const EpochRun& e, Console& console);
  /// The epoch `epoch` from `global_step` on: its sharder cut and the loader started.
  EpochRun beginEpoch(Sharder& sharder, int64_t epoch, int64_t global_step);
  void stoppedLine(Console& console, int64_t global_step, int64_t epoch) const;
  /// After the last step: the run's figures in `result`. Collective (the data errors:
  /// gatherDataFigures).
  void summarise(TrainResult& result, int64_t global_step, double wall_s, double train_time);

  std::vector<double> step_seconds_;  ///< wall time of this run's steps (the first 100 000)

  const Config cfg_;  ///< a copy (Note [run decisions])
  collective::Communicator& comm_;
  const DataSplit& data_;
  std::unique_ptr<StepEngine> engine_;  ///< Note [step engine]
  Checkpointer* checkpointer_ = nullptr;
  StepProfiler* profiler_ = nullptr;
  Yardstick yardstick_;
  std::unique_ptr<SystemSampler> system_;   ///< Note [system metrics] (none: report.sample_s 0)
  std::vector<SystemPoint> system_series_;  ///< this rank's, one per metrics interval
  TrainPosition resume_;
  std::unique_ptr<AdaptiveBatch> adapt_;  ///< batch.adapt: goodput or warmup (null: off)
  double last_lr_ = 0;   ///< the lr of the last step run
  bool adapt_figures_fault_ = false;  ///< BATCHDIST_FAULT_ADAPT_FIGURES names this rank
  int64_t hang_step_ = 0;  ///< BATCHDIST_FAULT_HANG: this rank hangs before this step (0: never)
  OomGuard oom_;  ///< Note [oom back-off]
  bool failed_here_ = false;  ///< the last try failed on this rank
  Console* console_ = nullptr;  ///< during train(): for the back-off lines
  TrainLog log_;  ///< rank 0's progress line and metrics points
};

}  // namespace batchdist::worker
