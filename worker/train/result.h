#pragma once
// What a training run produced: the trainer fills it, the report writes it.
// Pure data (no torch), so the report does not depend on the trainer.

#include <nlohmann/json.hpp>

#include "worker/data/pipeline.h"
#include "worker/task/metrics.h"
#include "worker/train/observe/profiler.h"
#include "worker/train/observe/system_metrics.h"
#include <cstdint>
#include <string>
#include <vector>

namespace batchdist::worker {

/// Where a step's time goes (seconds, this rank).
struct TimeBreakdown {
  double data_wait = 0;  ///< blocked waiting for the loader
  double compute = 0;    ///< forward, backward, optimizer
  double comm = 0;       ///< exposed gradient communication (not hidden by backward)
  double skew = 0;       ///< waiting for a slower rank (Note [overlapped reducer])
  double total() const { return data_wait + compute + comm + skew; }
  void add(const TimeBreakdown& o) {
    data_wait += o.data_wait;
    compute += o.compute;
    comm += o.comm;
    skew += o.skew;
  }
};

struct EpochStats {
  int64_t epoch = 0;
  double train_loss = 0;
  double eval_loss = 0;
  Metrics eval_metrics;     ///< the task's (Note [task]); empty without a validation set
  double samples_per_s = 0;
  double seconds = 0;
  double noise_scale = -1;  ///< B_simple over the epoch's steps (< 0: not measured)
};

/// One line of metrics.jsonl: a logging interval of training (rank 0's view), or
/// an epoch's end with its evaluation.
struct MetricPoint {
  bool epoch_end = false;
  int64_t step = 0;         ///< global steps done
  int64_t epoch = 0;        ///< 1-based
  double seconds = 0;       ///< since train() started
  double train_loss = 0;    ///< interval: rank 0's shard; epoch end: all ranks
  double lr = 0;
  double samples_per_s = 0; ///< over the interval (epoch end: the epoch)
  double mfu = -1;          ///< Note [mfu] at samples_per_s (< 0: unknown)
  TimeBreakdown time;       ///< over the interval, rank 0
  double noise_scale = -1;  ///< smoothed B_simple (< 0: unknown)
  double eval_loss = 0;     ///< epoch end only
  Metrics eval_metrics;     ///< epoch end only
  int64_t global_batch = 0; ///< the split in force at `step`
  int64_t per_gpu = 0;
  int64_t accum = 0;
  /// Note [tokens per sample] (worker/plan/plan.h): > 0 adds tokens_per_s and
  /// tokens_per_step beside samples_per_s and global_batch; 0: samples are not tokens.
  int64_t tokens_per_sample = 0;
  double peak_memory_mb = 0;  ///< rank 0's peak so far (CUDA allocator, or CPU resident set)
  double progress = -1;     ///< batch.adapt: G0-equivalent steps done (< 0: not adaptive)
  SystemSummary system;     ///< rank 0's over the interval (Note [system metrics]; steps only)
};

/// batch.adapt: goodput: the split and AdaScale gain in force from optimizer step
/// `step` (0-based) on (Note [goodput] in worker/plan/adapt.h).
struct BatchChange {
  int64_t step = 0;
  int64_t global = 0;
  int64_t per_gpu = 0;
  int64_t accum = 0;
  double gain = 1;          ///< AdaScale gain r: one step is worth r steps at G0
  double noise_scale = -1;  ///< the B_simple the decision used (< 0: unknown)
  double efficiency = 1;    ///< (B + G0) / (B + G)
  std::string why;          ///< the decision's line
};

/// The gradient noise scale over the run (Note [gradient noise scale] in
/// worker/train/step/noise_scale.h).
struct NoiseScaleResult {
  bool measured = false;
  std::string why_not;      ///< when not measured
  double b_simple = -1;     ///< smoothed at the end of training (< 0: unknown)
  double grad_sq = 0;       ///< smoothed |G|^2
  double trace = 0;         ///< smoothed tr(S)
  int64_t steps = 0;        ///< steps measured
  int64_t b_small = 0;      ///< per-rank batch (samples)
  int64_t b_big = 0;        ///< global batch
};

/// One checkpoint write (rank 0's view): a failed one has `error` set.
struct CheckpointRecord {
  int64_t step = 0;
  std::string path;
  double seconds = 0;        ///< what the step waited for (Note [background checkpoint])
  int64_t bytes = 0;
  bool on_signal = false;  ///< written because a stop signal ended the run
  std::string error;       ///< empty when it was written
  double write_seconds = 0;  ///< the files' writing, in the background or not
  bool background = false;   ///< written while training went on
};

/// Where training stands after a global step: what a checkpoint records and a
/// resumed run starts from. The epoch and the step in it follow from the global
/// step and the plan (steps per epoch depend on G and N only).
struct TrainPosition {
  int64_t global_step = 0;      ///< optimizer steps done; the next one is this
  int64_t samples = 0;          ///< real samples trained on before this epoch, all ranks
  int64_t epoch_samples = 0;    ///< real samples of the current epoch so far
  double epoch_loss_sum = 0;    ///< their weighted loss sum, all ranks
  std::vector<EpochStats> history;  ///< completed epochs
  /// batch.adapt: goodput: the trainer's own record (Note [adaptive checkpoint]
  /// in adaptive_batch.h); null otherwise.
  nlohmann::ordered_json adapt;
};

/// One back-off after an out-of-memory (Note [oom back-off] in oom_guard.h).
struct OomBackoff {
  int64_t step = 0;            ///< the global step redone (1-based, as on the console)
  std::vector<int64_t> ranks;  ///< the ranks that ran out of memory
  int64_t from_per_gpu = 0, from_accum = 0;
  int64_t to_per_gpu = 0, to_accum = 0;  ///< 0 when nothing was left: the run stopped
  double peak_mb = 0;          ///< the highest peak among those ranks in the failed step
  double capacity_mb = 0;      ///< its limit (CPU: search.memory_limit_mb) or GPU total
  bool retry = false;          ///< the step was a retry of the larger batch
};

/// The input pipeline over the run (decoded sources: per-stage thread time).
struct DataFigures {
  int64_t workers = 0;
  StageSeconds stages;        ///< this rank's loader threads, summed
  double capacity_samples_per_s = 0;  ///< what this rank's threads could decode: samples x workers / busy s
  int64_t errors = 0;         ///< bad samples skipped, all ranks, training's and evaluation's
  double cache_mb = -1;       ///< data.cache ram: this rank's cached encoded bytes, both loaders' (-1: off)
  int64_t cache_hits = 0;
  std::vector<DataErrorRecord> first_errors;  ///< the first few, every rank's (Note [bad files named])
};

/// Rank 0's wall time of training's phases, for bench/scale.sh (OUTPUT/phases.json).
/// -1: the phase did not happen in this run.
struct PhaseSeconds {
  double first_step = -1;   ///< the first step of this run (lazy set-up, first allreduce)
  double steady_step = -1;  ///< the median step after the first
  double eval = -1;         ///< the mean evaluation
  double checkpoint = -1;   ///< the mean checkpoint write
};

/// Note [gradient clipping]: what optim.clip_grad_norm did over this process's
/// training steps (a resumed run counts from its resume; the search's are not counted).
struct GradClipFigures {
  int64_t steps = 0;     ///< updates whose gradient norm was measured
  int64_t clipped = 0;   ///< ... and scaled down
  double last_norm = 0;  ///< the last step's norm before clipping
  double max_norm = 0;   ///< the largest norm seen
};

/// Note [memory by part]: what the update strategy holds on this rank, in MB: the
/// trainable parameters, their gradients (the gradient buckets) and the
/// optimizer's state (under dist.shard: optimizer this rank's slice only). What a
/// step uses beyond these (activations, workspace and, on the CPU, the process
/// itself) is the peak less their sum.
struct UpdateMemory {
  double parameters_mb = 0;
  double gradients_mb = 0;
  double optimizer_state_mb = 0;
  double fixedMb() const { return parameters_mb + gradients_mb + optimizer_state_mb; }
};

struct TrainResult {
  int64_t steps = 0;
  int64_t epochs = 0;
  int64_t samples = 0;  ///< real (weight 1) samples trained on, all ranks
  double samples_per_s = 0;
  double train_loss = 0;
  double eval_loss = 0;
  Metrics eval_metrics;      ///< the last evaluation's (Note [task])
  std::string task;          ///< "classification", "regression" (Note [task choice])
  std::string best_metric;   ///< the task's "better" metric, e.g. accuracy
  bool best_higher = true;   ///< ... and whether higher is better
  double wall_s = 0;
  bool completed = true;     ///< false if a stop request ended the run early
  TimeBreakdown time;        ///< summed over the run, this rank (rank 0 reports)
  double peak_memory_mb = 0; ///< rank 0: CUDA allocator peak, or on CPU peak resident set
  double memory_total_mb = 0;
  UpdateMemory update_memory; ///< rank 0's (Note [memory by part])
  double gpu_utilization = -1;  ///< this rank's mean NVML utilization in %, -1 if unknown
  int64_t skipped_steps = 0; ///< fp16: steps skipped for inf/NaN gradients
  GradClipFigures grad_clip; ///< optim.clip_grad_norm > 0
  double loss_scale = 0;     ///< fp16: final loss scale
  std::vector<EpochStats> history;
  std::vector<MetricPoint> metrics;  ///< metrics.jsonl, one per logging interval and epoch
  NoiseScaleResult noise;
  std::vector<CheckpointRecord> checkpoints;  ///< every write tried, failed ones included
  double checkpoint_s = 0;   ///< time spent writing checkpoints (not in samples_per_s)
  std::vector<OomBackoff> oom_backoffs;  ///< every back-off, in order
  int64_t oom_retries = 0;   ///< times the larger per-GPU batch was tried again
  std::string failure;       ///< why training stopped early without a signal (completed false)
  DataFigures data;
  PhaseSeconds phases;
  std::vector<BatchChange> batch_history;  ///< batch.adapt: every split used, in order
  double progress = -1;      ///< batch.adapt: G0-equivalent steps done (< 0: not adaptive)
  /// Note [system metrics]: rank 0: every rank's, by rank (empty: report.sample_s 0).
  std::vector<RankSystem> system;
  ProfileOutcome profile;    ///< the profile section's trace (Note [step profiler])
};

}  // namespace batchdist::worker
