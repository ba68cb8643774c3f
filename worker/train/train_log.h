#pragma once
// Training as it goes, on rank 0: the progress line on the console (Note [progress
// output] in worker/common/console.h) and the metrics points (metrics.jsonl,
// TensorBoard, report.json's `metrics`), about ten per epoch and one at its end.
// The trainer hands over its figures with each call; nothing here is collective.

#include <cstdint>
#include <functional>
#include <string>
#include <utility>

#include "worker/common/console.h"
#include "worker/model/flops.h"
#include "worker/train/result.h"

namespace batchdist::worker {

/// Whether step `step` (0-based in its epoch) ends a metrics interval: every
/// steps_per_epoch / 10 steps (at least every step), at the epoch's last step
/// (`epoch_steps`: the steps it runs) and at a step that stops the run.
bool metricsDue(int64_t steps_per_epoch, int64_t epoch_steps, int64_t step, bool stop);

/// The epoch so far, this rank's view (the trainer's epoch record).
struct EpochSoFar {
  int64_t epoch = 0;            ///< 0-based
  int64_t steps = 0;            ///< steps this epoch runs
  int64_t steps_per_epoch = 0;  ///< the split in force's (the plan's): the cadence
  double started = 0;           ///< monotonic seconds
  double loss_sum = 0;          ///< this rank's weighted loss sum
  int64_t samples = 0;          ///< real samples over all ranks
  TimeBreakdown time;           ///< this rank's
  bool stop = false;            ///< a stop was agreed at the last step
};

/// Where the current metrics interval began (rank 0); at = 0: at the epoch's start.
struct MetricsInterval {
  double at = 0;        ///< monotonic seconds
  double loss = 0;      ///< the epoch's loss sum then
  int64_t samples = 0;  ///< ... and its samples
  TimeBreakdown time;
};

/// The run's figures after a step, as the progress line and a metrics point show them.
struct StepFigures {
  std::string epoch_label;    ///< "epoch 3/20", or "epoch 3" when adaptive
  int64_t global_step = 0;    ///< steps done
  double lr = 0;              ///< the last step's
  int64_t global_batch = 0;   ///< the split in force
  int64_t per_gpu = 0;
  int64_t accum = 0;
  int64_t tokens_per_sample = 0;  ///< the plan's (Note [tokens per sample]; 0: not tokens)
  const Yardstick* yardstick = nullptr;  ///< Note [mfu]: MFU beside the rate (null: none)
  bool cuda = false;          ///< the progress line shows the peak memory
  double peak_memory_mb = 0;  ///< this rank's peak so far (read for a point, or on CUDA)
  double noise_scale = -1;    ///< smoothed B_simple (< 0: unknown)
  double steps_left = 0;      ///< for the ETA (adaptive: at the current gain)
  bool adaptive = false;      ///< batch.adapt (Note [adaptive training] in trainer.h)
  double progress = -1;       ///< adaptive: G0-equivalent steps done
  SystemSummary system;       ///< the interval's system metrics (Note [system metrics])
};

/// What the step just done shows.
struct StepOutput {
  bool due = false;    ///< it ends a metrics interval
  bool line = false;   ///< the console shows the progress
  bool point = false;  ///< rank 0 makes a metrics point
};

/// Rank 0's progress line and metrics points; the cadence and the sink.
class TrainLog {
 public:
  /// `rank` 0 makes the points; `world_size` scales rank 0's loss sum to the
  /// mean over all ranks' samples.
  TrainLog(int rank, int world_size) : rank_(rank), world_size_(world_size) {}

  /// Called with each metrics point as it is made (metrics.jsonl, TensorBoard).
  void setSink(std::function<void(const MetricPoint&)> sink) { sink_ = std::move(sink); }
  /// Whether this rank makes metrics points (rank 0).
  bool makesPoints() const { return rank_ == 0; }

  /// What step `step` of `e` shows on `console` and in the metrics; the caller
  /// reads its figures only when there is something (on the CPU the peak memory
  /// reads /proc).
  StepOutput atStep(const Console& console, const EpochSoFar& e, int64_t step) const;
  /// After step `step`: what `out` says, the progress line and/or a metrics point
  /// over the interval since `since` (which then starts anew), kept in `result`.
  void step(Console& console, const EpochSoFar& e, int64_t step, const StepOutput& out,
            const StepFigures& f, double run_started, MetricsInterval& since,
            TrainResult& result);
  /// Rank 0: the epoch's point, with its evaluation (`h`) and `time`, this
  /// rank's over the epoch.
  void epochEnd(const EpochStats& h, const TimeBreakdown& time, const StepFigures& f,
                double run_started, TrainResult& result);

 private:
  void progress(Console& console, const EpochSoFar& e, int64_t step, const StepFigures& f,
                double run_started, bool due) const;
  void point(const EpochSoFar& e, const StepFigures& f, double run_started,
             MetricsInterval& since, TrainResult& result);
  /// The split, memory and progress of `f` into `m`, then `m` kept and sent.
  void add(MetricPoint m, const StepFigures& f, TrainResult& result);

  int rank_;
  int world_size_;
  std::function<void(const MetricPoint&)> sink_;
};

}  // namespace batchdist::worker
