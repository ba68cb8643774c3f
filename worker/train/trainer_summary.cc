// Trainer's closing figures (worker/train/trainer.h): what TrainResult holds
// after the loop, the phases' seconds, and the console's closing lines of a
// stopped or profiled run.
#include "worker/train/trainer.h"

#include <algorithm>
#include <iostream>
#include <vector>

#include "collective/torch_compat.h"
#include "worker/common/console.h"
#include "worker/common/util.h"
#include "worker/train/adapt/adaptive_batch.h"
#include "worker/train/observe/data_figures.h"
#include "worker/train/observe/system_figures.h"
#include "worker/train/step/update_strategy.h"

namespace batchdist::worker {

PhaseSeconds Trainer::phaseSeconds(const TrainResult& result) const {
  PhaseSeconds p;
  if (!step_seconds_.empty()) p.first_step = step_seconds_.front();
  if (step_seconds_.size() > 1) {
    std::vector<double> rest(step_seconds_.begin() + 1, step_seconds_.end());
    std::nth_element(rest.begin(), rest.begin() + rest.size() / 2, rest.end());
    p.steady_step = rest[rest.size() / 2];
  }
  p.eval = engine_->evaluator().meanSeconds();
  int64_t written = 0;
  double seconds = 0;
  for (const auto& c : result.checkpoints) {
    if (c.error.empty()) {
      ++written;
      seconds += c.seconds;
    }
  }
  if (written > 0) p.checkpoint = seconds / written;
  return p;
}

void Trainer::profileWritten(Console& console) const {
  const ProfileOutcome& p = profiler_->outcome();
  if (!p.error.empty()) {  // this rank's own: every rank says it
    std::cerr << strCat("rank ", comm_.rank(), ": profile: warning: ", p.error, "\n") << std::flush;
    return;
  }
  const auto steps = p.steps.size() == 1 ? strCat("step ", p.steps.front())
                                         : strCat("steps ", p.steps.front(), "-", p.steps.back());
  console.line(strCat("profile: ", steps, " traced (", p.kineto ? "Kineto" : "CPU operators",
                      "): ", p.file, comm_.size() > 1 ? " and one file per rank beside it" : ""));
}

void Trainer::stoppedLine(Console& console, int64_t global_step, int64_t epoch) const {
  console.line(strCat("stop requested: every rank stopped after step ", global_step,
                      adapt_ ? strCat(" (G0-equivalent progress ",
                                      formatFixed(adapt_->progress(), 1), " of ",
                                      adapt_->plan0().total_steps, ")")
                                : strCat(" of ", plan().total_steps),
                      " (epoch ", epoch + 1, ")"));
}

void Trainer::summarise(TrainResult& result, int64_t global_step, double wall_s, double train_time) {
  result.steps = global_step;
  if (adapt_) {
    result.progress = adapt_->progress();
    result.batch_history = adapt_->history();
  }
  result.epochs = static_cast<int64_t>(result.history.size());
  result.wall_s = wall_s;
  result.phases = phaseSeconds(result);
  if (!result.history.empty()) {
    const auto& last = result.history.back();
    result.train_loss = last.train_loss;
    result.eval_loss = last.eval_loss;
    result.eval_metrics = last.eval_metrics;
  } else {  // no epoch ended: the metrics named, at 0
    result.eval_metrics = engine_->task().metrics(std::vector<double>(engine_->task().sumCount(), 0.0), 1.0);
  }
  result.task = toString(engine_->task().kind());
  result.best_metric = engine_->task().best().name;
  result.best_higher = engine_->task().best().higher_is_better;
  // Training throughput: real samples over the time spent in training steps.
  result.samples_per_s = result.samples / std::max(train_time, 1e-9);
  // CPU: the peak resident set (VmHWM) of this rank; without a memory limit it is
  // the process's, search included.
  result.peak_memory_mb = oom_.runPeakMb();
  if (engine_->device().is_cuda()) result.memory_total_mb = compat::cudaTotalBytes(engine_->device().index()) / (1 << 20);
  if (system_) {
    result.system = gatherSystemFigures(comm_, std::move(system_), std::move(system_series_));
    if (!result.system.empty() && result.system.front().run.has(SystemMetric::kGpuUtil)) {
      result.gpu_utilization = result.system.front().run.get(SystemMetric::kGpuUtil);
    }
  }
  result.noise = engine_->noiseResult();
  result.data =
      gatherDataFigures(comm_, engine_->loader(), engine_->evaluator().loader(), data_, cfg_.data.cache, engine_->device());
  result.grad_clip = engine_->update().clipFigures();
  result.update_memory = engine_->update().memory();
  if (const LossScaler* scaler = engine_->update().scaler()) {
    result.skipped_steps = scaler->skippedSteps();
    result.loss_scale = scaler->scale();
  }
}

}  // namespace batchdist::worker
