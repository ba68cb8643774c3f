#include "worker/train/train_log.h"

#include <algorithm>
#include <utility>

#include "common/error.h"
#include "worker/common/util.h"

namespace batchdist::worker {

// metrics.jsonl: about ten lines per epoch (every steps_per_epoch / 10 steps and
// at the epoch's last step), from rank 0's own numbers: no collective. The
// progress in `lines` style prints at the same steps (Note [progress output]).
bool metricsDue(int64_t steps_per_epoch, int64_t epoch_steps, int64_t step, bool stop) {
  const int64_t every = std::max<int64_t>(1, steps_per_epoch / 10);
  return (step + 1) % every == 0 || step + 1 == epoch_steps || stop;
}

StepOutput TrainLog::atStep(const Console& console, const EpochSoFar& e, int64_t step) const {
  StepOutput out;
  out.due = metricsDue(e.steps_per_epoch, e.steps, step, e.stop);
  out.line = console.enabled() && console.mode() != ProgressStyle::kOff &&
             (console.mode() != ProgressStyle::kLines || out.due);
  out.point = makesPoints() && out.due;
  return out;
}

void TrainLog::step(Console& console, const EpochSoFar& e, int64_t step, const StepOutput& out,
                    const StepFigures& f, double run_started, MetricsInterval& since,
                    TrainResult& result) {
  if (out.line) progress(console, e, step, f, run_started, out.due);
  if (out.point) point(e, f, run_started, since, result);
}

void TrainLog::progress(Console& console, const EpochSoFar& e, int64_t step, const StepFigures& f,
                        double run_started, bool due) const {
  const auto pct = [](double part, double whole) { return whole > 0 ? 100.0 * part / whole : 0.0; };
  const double now = monotonicSeconds();
  const double rate = e.samples / std::max(now - e.started, 1e-9);
  const double per_step = (now - run_started) / f.global_step;
  std::string extra = strCat("  data ", formatFixed(pct(e.time.data_wait, e.time.total()), 0),
                             "% comm ", formatFixed(pct(e.time.comm, e.time.total()), 0), "%");
  if (f.cuda) extra += strCat("  mem ", formatFixed(f.peak_memory_mb / 1024, 1), " GiB");
  // Adaptive: this epoch's steps at the current split, and that split's G.
  console.status(strCat(f.epoch_label, " step ", step + 1, "/",
                        f.adaptive ? e.steps : e.steps_per_epoch,
                        f.adaptive ? strCat("  G ", f.global_batch) : std::string(), "  loss ",
                        formatFixed(e.loss_sum * world_size_ / std::max<int64_t>(1, e.samples), 4),
                        "  lr ", f.lr, "  ", static_cast<int64_t>(rate), " samples/s",
                        tokenRate(rate, f.tokens_per_sample),
                        f.yardstick && f.yardstick->known() ? strCat("  MFU ", mfuText(f.yardstick->mfu(rate))) : "",
                        extra,
                        "  ETA ", formatDuration(per_step * std::max(0.0, f.steps_left))),
                 due);
}

void TrainLog::point(const EpochSoFar& e, const StepFigures& f, double run_started,
                     MetricsInterval& since, TrainResult& result) {
  const double now = monotonicSeconds();
  if (since.at == 0) since.at = e.started;
  MetricPoint m;
  m.step = f.global_step;
  m.epoch = e.epoch + 1;
  m.seconds = now - run_started;
  const int64_t samples = e.samples - since.samples;
  m.train_loss = (e.loss_sum - since.loss) * world_size_ / std::max<int64_t>(1, samples);
  m.lr = f.lr;
  m.samples_per_s = samples / std::max(now - since.at, 1e-9);
  m.time = e.time;
  m.time.data_wait -= since.time.data_wait;
  m.time.compute -= since.time.compute;
  m.time.comm -= since.time.comm;
  m.time.skew -= since.time.skew;
  m.noise_scale = f.noise_scale;
  m.system = f.system;
  add(m, f, result);
  since.at = now;
  since.loss = e.loss_sum;
  since.samples = e.samples;
  since.time = e.time;
}

void TrainLog::epochEnd(const EpochStats& h, const TimeBreakdown& time, const StepFigures& f,
                        double run_started, TrainResult& result) {
  if (!makesPoints()) return;
  MetricPoint m;
  m.epoch_end = true;
  m.step = f.global_step;
  m.epoch = h.epoch + 1;
  m.seconds = monotonicSeconds() - run_started;
  m.train_loss = h.train_loss;
  m.lr = f.lr;
  m.samples_per_s = h.samples_per_s;
  m.time = time;
  m.noise_scale = h.noise_scale;
  m.eval_loss = h.eval_loss;
  m.eval_metrics = h.eval_metrics;
  add(m, f, result);
}

void TrainLog::add(MetricPoint m, const StepFigures& f, TrainResult& result) {
  m.global_batch = f.global_batch;
  m.per_gpu = f.per_gpu;
  m.accum = f.accum;
  m.tokens_per_sample = f.tokens_per_sample;
  m.peak_memory_mb = f.peak_memory_mb;
  if (f.yardstick) m.mfu = f.yardstick->mfu(m.samples_per_s);
  if (f.adaptive) m.progress = f.progress;
  result.metrics.push_back(m);
  if (sink_) sink_(m);
}

}  // namespace batchdist::worker
