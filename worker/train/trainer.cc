#include "worker/train/trainer.h"

#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <map>
#include <optional>
#include <thread>

#include "common/error.h"
#include "common/trace.h"
#include "worker/common/util.h"
#include "collective/torch_compat.h"
#include "worker/common/heartbeat.h"
#include "worker/common/console.h"
#include "worker/train/adapt/adapt_record.h"
#include "worker/train/adapt/adaptive_batch.h"
#include "worker/train/checkpoint/checkpoint.h"
#include "worker/train/observe/data_figures.h"
#include "worker/train/step/memory.h"
#include "worker/train/observe/system_figures.h"
#include "worker/train/step/update_strategy.h"

namespace batchdist::worker {

Trainer::Trainer(const Config& cfg, collective::Communicator& comm, const DataSplit& data,
                 at::Device device, const Plan& plan, const FaultPlan* faults,
                 std::optional<Levers> levers)
    : cfg_(cfg), comm_(comm), data_(data),
      engine_(std::make_unique<StepEngine>(cfg, comm, data, device, plan, faults, levers)),
      oom_(comm, device, cfg, faults),
      log_(comm.rank(), comm.size()) {
  const FaultPlan none;
  const FaultPlan& f = faults ? *faults : none;  // Note [fault plan]
  adapt_figures_fault_ = f.adapt_figures_rank == comm_.rank();
  if (f.hang.rank == comm_.rank()) hang_step_ = f.hang.step;
}

Trainer::~Trainer() = default;

/// What one epoch of train() accumulates (this rank).
struct Trainer::EpochRun {
  int64_t epoch = 0;
  int64_t steps = 0;        ///< steps this epoch runs
  double started = 0;       ///< monotonic seconds
  double loss_sum = 0;      ///< this rank's weighted loss sum
  int64_t samples = 0;      ///< real samples over all ranks
  TimeBreakdown time;
  bool stop = false;        ///< a stop was agreed at the last step
  int64_t first = 0;        ///< first step run (> 0 when resumed mid-epoch)
  bool checkpoint_due = false;  ///< at the epoch's last step: written after the evaluation
  double checkpoint_s = 0;  ///< spent writing checkpoints during the steps
  bool failed = false;      ///< out of memory with nothing left to back off to
  int64_t next = 0;         ///< the next step to run (after the last one done)
  int64_t cut_step = 0;     ///< Note [adaptive cut]: where the epoch's current cut begins
  int64_t cut_begin = 0;
  MetricsInterval logged;   ///< rank 0: since the last metrics point (metrics.jsonl)
};

void Trainer::logStep(Console& console, EpochRun& e, int64_t step, int64_t global_step,
                      double run_started, TrainResult& result) {
  const EpochSoFar so_far{e.epoch, e.steps, plan().steps_per_epoch, e.started, e.loss_sum,
                          e.samples, e.time, e.stop};
  const StepOutput out = log_.atStep(console, so_far, step);
  SystemSummary system;
  if (out.due && system_) {  // every rank: its own series (Note [system metrics])
    system = system_->take();
    if (system.samples > 0) {  // an interval shorter than report.sample_s may have none
      system_series_.push_back({global_step, monotonicSeconds() - run_started, system});
    }
  }
  if (!out.line && !out.point) return;  // the figures are read only when shown
  StepFigures f = stepFigures(e.epoch, global_step, out.point);
  f.system = system;
  log_.step(console, so_far, step, out, f, run_started, e.logged, result);
}

void Trainer::logEpoch(const EpochRun& e, const EpochStats& h, int64_t global_step,
                       double run_started, TrainResult& result) {
  if (!log_.makesPoints()) return;
  log_.epochEnd(h, e.time, stepFigures(e.epoch, global_step, /*peak=*/true), run_started, result);
}

StepFigures Trainer::stepFigures(int64_t epoch, int64_t global_step, bool peak) const {
  StepFigures f;
  f.epoch_label = epochLabel(epoch);
  f.global_step = global_step;
  f.lr = last_lr_;
  f.global_batch = plan().global;
  f.per_gpu = plan().per_gpu;
  f.accum = plan().accum;
  f.tokens_per_sample = plan().tokens_per_sample;
  if (yardstick_.known()) f.yardstick = &yardstick_;
  f.cuda = engine_->device().is_cuda();
  // The run's peak so far (each step resets the allocator's: Note [oom back-off]).
  if (peak || f.cuda) f.peak_memory_mb = oom_.runPeakMb();
  f.noise_scale = engine_->noise().estimator().bSimple();
  f.adaptive = adapt_ != nullptr;
  // Adaptive: the steps left at the current gain (Note [adaptive training]).
  f.steps_left =
      adapt_ ? adapt_->stepsLeft() : static_cast<double>(plan().total_steps - global_step);
  if (adapt_) f.progress = adapt_->progress();
  return f;
}

void Trainer::runSteps(EpochRun& e, Sharder& sharder, int64_t* global_step,
                       const std::function<bool()>& stop_requested, Console& console,
                       double run_started, TrainResult& result) {
  for (int64_t s = e.first; s < e.steps && !e.stop; ++s) {
    maybeAdapt(e, sharder, s, *global_step);
    // A larger G left no full step in the rest of the epoch. Before this rank's
    // stop wish is read: a wish is only acted on once the step agrees it.
    if (s >= e.steps) break;
    e.stop = stop_requested && stop_requested();
    // Rank 0's clock (and its every_steps: auto) decides.
    bool due = checkpointer_ && (checkpointer_->dueByTime() || checkpointer_->dueByAuto(*global_step));
    maybeRecover(e, sharder, s, *global_step, result);
    double loss = 0;
    const double step_started = monotonicSeconds();
    if (profiler_) profiler_->beginStep(*global_step + 1);
    if (!runStep(e, sharder, s, *global_step, &e.stop, checkpointer_ ? &due : nullptr, result,
                 &loss)) {
      e.failed = true;
      return;
    }
    if (profiler_ && profiler_->endStep(/*last=*/e.stop || *global_step + 1 >= plan().total_steps)) {
      profileWritten(console);  // the run's last step: evaluation stays out of the trace
    }
    if (step_seconds_.size() < 100000) step_seconds_.push_back(monotonicSeconds() - step_started);
    if (checkpointer_) checkpointer_->noteStep(monotonicSeconds() - step_started);
    e.loss_sum += loss;
    e.samples += sharder.realSamples(s);
    ++*global_step;
    heartbeat::setStep(*global_step);  // Note [heartbeat]
    e.next = s + 1;
    const auto step_time = engine_->takeTime();
    e.time.add(step_time);
    // Note [adaptive training]: the step counts r steps at G0; at the plan's end
    // the epoch ends here (evaluation, last metrics).
    if (adapt_ &&
        adapt_->countStep(step_time.comm + engine_->takeUpdateSeconds(),
                          monotonicSeconds() - step_started)) {
      e.steps = s + 1;
    }
    logStep(console, e, s, *global_step, run_started, result);
    if (!checkpointer_) continue;
    checkpointer_->poll(console);  // Note [background checkpoint]: a finished write's line
    // Every rank reaches the same verdict: the wishes were agreed in the allreduce.
    due = due || checkpointer_->dueBySteps(*global_step) || (e.stop && checkpointer_->onSignal());
    if (due && s + 1 < e.steps) {
      const double t0 = monotonicSeconds();
      checkpoint(e, *global_step, /*mid_epoch=*/true, console, result);
      e.checkpoint_s += monotonicSeconds() - t0;
    } else if (due) {
      e.checkpoint_due = true;  // the epoch's end: after its evaluation (history complete)
    }
  }
}

// Note [oom back-off]: the wishes of the step are sent again with every try, so
// every try agrees on the same stop and checkpoint.
bool Trainer::runStep(EpochRun& e, Sharder& sharder, int64_t s, int64_t global_step, bool* stop,
                      bool* due, TrainResult& result, double* loss) {
  const bool stop_wish = *stop;
  const bool due_wish = due && *due;
  if (global_step + 1 == hang_step_) hangForever(global_step + 1);
  for (;;) {
    *stop = stop_wish;
    if (due) *due = due_wish;
    oom_.armFault(global_step);
    last_lr_ = stepLr(global_step);
    if (tryStep(sharder.realSamples(s), last_lr_, stop, due, loss)) {
      oom_.goodStep();
      return true;
    }
    if (!backOff(e, sharder, s, global_step, result)) return false;
  }
}

void Trainer::hangForever(int64_t step) const {
  std::cerr << strCat("rank ", comm_.rank(), ": hanging before step ", step,
                      " (BATCHDIST_FAULT_HANG) until killed\n")
            << std::flush;
  for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
}

bool Trainer::tryStep(int64_t real, double lr, bool* stop, bool* checkpoint, double* loss) {
  oom_.beginTry(engine_->model());
  failed_here_ = computeOrFail(real, loss);
  // Always: every rank makes every bucket's allreduce (Note [search agreement]).
  bool any = failed_here_;
  engine_->syncGradients(stop, checkpoint, &any);
  if (any) {
    oom_.restoreBuffers();
    return false;
  }
  engine_->applyUpdate(lr);
  return true;
}

bool Trainer::computeOrFail(int64_t real, double* loss) {
  const auto outcome =
      engine_->computeOrCatch(real, {oom_.injectInForward(), oom_.injectInBackward()}, loss);
  oom_.disarm();
  // Note [sync batchnorm failure]: a peer's failure is not this rank's; the side
  // channel carries the failing rank's, and every rank discards the step.
  if (outcome != ComputeOutcome::kOk) return outcome == ComputeOutcome::kOutOfMemory;
  // CPU: over search.memory_limit_mb counts as out of memory, as in the search.
  return oom_.overLimit();
}

bool Trainer::backOff(EpochRun& e, Sharder& sharder, int64_t s, int64_t global_step,
                      TrainResult& result) {
  const OomFigures f = oom_.agreeFigures(failed_here_);  // collective
  const int64_t floor = minPerGpu(cfg_, engine_->model().hasBatchNorm());
  const OomBackoff b = oom_.backOff(plan(), f, floor, global_step);
  result.oom_backoffs.push_back(b);
  if (b.to_per_gpu == 0) {
    result.failure = oomFailure(b, engine_->device().is_cuda(), floor);
    return false;
  }
  changeSplit(e, sharder, s, {plan().global, b.to_per_gpu, b.to_accum}, SplitCut::kKeep);
  if (console_) {
    console_->line(strCat("oom back-off: ", oomWhat(b, engine_->device().is_cuda()),
                          "; every rank redoes the step as per-GPU batch ", plan().per_gpu,
                          " x accumulation ", plan().accum, ": global batch ", plan().global,
                          ", its samples and lr unchanged"));
  }
  return true;
}

// Note [split change]: every change of split in a run goes through here: an
// out-of-memory back-off or its retry (SplitCut::kKeep: the same G, so every
// sample keeps its position, Note [equal shards]) and an adaptive decision
// (SplitCut::kAnew: a new G, the rest of the epoch cut anew from step `s`, Note
// [adaptive cut] in worker/plan/plan.h). The plan, the sharder, the loader
// (restarted at `s` with job indices as in an uninterrupted epoch of this
// split), the checkpointer's plan and the back-off's count of good steps change
// together.
void Trainer::changeSplit(EpochRun& e, Sharder& sharder, int64_t s, const AdaptSplit& to,
                          SplitCut cut) {
  if (cut == SplitCut::kAnew) {
    const int64_t pos = sharder.position(s);
    engine_->setPlan(withGlobal(plan(), to.global, to.per_gpu, to.accum));
    sharder = sharder.withPlan(plan());
    sharder.setCut(s, pos);
    e.steps = sharder.stepsInEpoch();
    e.cut_step = s;
    e.cut_begin = pos;
  } else {
    engine_->setPlan(withPerGpu(plan(), to.per_gpu));
    sharder = sharder.withPlan(plan());
  }
  engine_->loader().start(engine_->jobs(sharder, s, std::max<int64_t>(0, e.steps - s)), e.epoch, sharder.jobIndex(s));
  // Adaptive: the manifest's plan stays the plan at G0 (Note [adaptive checkpoint]).
  if (checkpointer_ && !adapt_) checkpointer_->setPlan(plan());
  oom_.splitChanged();
}

void Trainer::maybeRecover(EpochRun& e, Sharder& sharder, int64_t s, int64_t global_step,
                           TrainResult& result) {
  const int64_t m = oom_.recoverTo(plan());
  if (m == 0) return;
  const int64_t from_m = plan().per_gpu, from_a = plan().accum;
  changeSplit(e, sharder, s, {plan().global, m, plan().per_gpu * plan().accum / m}, SplitCut::kKeep);
  ++result.oom_retries;
  if (console_) {
    console_->line(strCat("oom recover: step ", global_step + 1, ": trying per-GPU batch ",
                          plan().per_gpu, " x accumulation ", plan().accum, " again after ",
                          oom_.state().recover_after, " good steps at ", from_m, " x ", from_a,
                          " (train.oom_recover_after_steps)"));
  }
}

void Trainer::checkpoint(const EpochRun& e, int64_t global_step, bool mid_epoch,
                         Console& console, TrainResult& result) {
  const PausedSampling aside(system_.get());  // Note [system metrics]: steps only
  TrainPosition pos;
  pos.global_step = global_step;
  pos.history = result.history;
  pos.samples = result.samples;
  if (mid_epoch) {
    // The epoch so far, summed over the ranks once, so a resumed epoch counts it once.
    pos.epoch_samples = e.samples;
    pos.epoch_loss_sum = comm_.allreduce(e.loss_sum, collective::ReduceOp::kSum);
  }
  if (adapt_) {
    pos.adapt = mid_epoch ? adaptRecord(e.epoch, e.next, e.cut_step, e.cut_begin)
                          : adaptRecord(e.epoch + 1, 0, 0, 0);
  }
  auto rec = checkpointer_->save(state(), pos, e.stop, console);
  result.checkpoint_s += rec.seconds;
  result.checkpoints.push_back(std::move(rec));
}

TrainState Trainer::state() { return engine_->state(); }

namespace {

/// A task's epoch figures after two spaces, or nothing (a module that logs no metrics).
std::string joinedFigures(const std::string& figures) {
  return figures.empty() ? figures : "  " + figures;
}

}  // namespace

EpochStats Trainer::finishEpoch(const EpochRun& e, Console& console) {
  const double train_secs = monotonicSeconds() - e.started;
  const double train_loss =
      comm_.allreduce(e.loss_sum, collective::ReduceOp::kSum) / std::max<int64_t>(1, e.samples);
  if (cfg_.train.check_finite) engine_->checkHealth(e.epoch);
  const auto ev = [&] {
    const PausedSampling aside(system_.get());  // Note [system metrics]: steps only
    return engine_->evaluate();
  }();
  EpochStats st{e.epoch, train_loss, ev.loss, ev.metrics, e.samples / std::max(train_secs, 1e-9),
                monotonicSeconds() - e.started, engine_->noise().estimator().windowBSimple()};
  engine_->noise().estimator().resetWindow();
  console.line(strCat(epochLabel(e.epoch), "  train_loss ",
                      formatFixed(train_loss, 4),
                      ev.samples > 0 ? strCat("  eval_loss ", formatFixed(ev.loss, 4),
                                              joinedFigures(engine_->task().epochFigures(ev.metrics)), "  ")
                                     : std::string("  (no validation set)  "),
                      static_cast<int64_t>(st.samples_per_s), " samples/s",
                      tokenRate(st.samples_per_s, plan().tokens_per_sample), "  (",
                      formatDuration(st.seconds), ")",
                      st.noise_scale > 0
                          ? strCat("  B_simple ", static_cast<int64_t>(std::lround(st.noise_scale)))
                          : std::string()));
  return st;
}

// ---------------------------------------------------------------------------
// Note [adaptive training]

void Trainer::setAdaptive(const AdaptSpace& space) {
  adapt_ = std::make_unique<AdaptiveBatch>(cfg_.batch, cfg_.optim.name, comm_, plan(), space,
                                           adapt_figures_fault_);
}

std::string Trainer::epochLabel(int64_t epoch) const {
  return adapt_ ? strCat("epoch ", epoch + 1) : strCat("epoch ", epoch + 1, "/", plan().epochs);
}

double Trainer::stepLr(int64_t global_step) const {
  if (!adapt_) return plan().lrAt(global_step);
  return adapt_->lr(plan().global);
}

void Trainer::maybeAdapt(EpochRun& e, Sharder& sharder, int64_t s, int64_t global_step) {
  if (!adapt_) return;
  const auto to = adapt_->decide(s, global_step, {plan().global, plan().per_gpu, plan().accum},
                                 engine_->noise().estimator().bSimple(), oom_.state().larger, console_);
  if (!to) return;
  changeSplit(e, sharder, s, *to, SplitCut::kAnew);
  oom_.adaptiveSplit(plan().per_gpu);  // Note [oom back-off]
}

nlohmann::ordered_json Trainer::adaptRecord(int64_t epoch, int64_t next_step, int64_t cut_step,
                                            int64_t cut_begin) const {
  return adapt_->record({plan().global, plan().per_gpu, plan().accum}, epoch, next_step, cut_step,
                        cut_begin, adaptRecordParts());
}

AdaptRecordParts Trainer::adaptRecordParts() const {
  AdaptRecordParts parts;
  auto larger = nlohmann::ordered_json::array();
  for (const auto m : oom_.state().larger) larger.push_back(m);
  parts.oom = {{"larger", larger},
               {"good_steps", oom_.state().good_steps},
               {"recover_after", oom_.state().recover_after},
               {"retrying", oom_.state().retrying}};
  parts.noise = adapt_record::noiseJson(engine_->noise().estimator().state());
  parts.noise_ticks = engine_->noise().ticks();
  return parts;
}

void Trainer::restoreAdaptive(const nlohmann::ordered_json& rec) {
  if (!rec.is_null()) restoreAdaptRecordParts(rec);
  if (auto restored = adapt_->restore(rec, resume_.global_step, plan(), console_)) {
    engine_->setPlan(*restored);
  }
}

void Trainer::restoreAdaptRecordParts(const nlohmann::ordered_json& rec) {
  try {
    engine_->noise().estimator().restore(adapt_record::noiseFrom(rec.at("noise")));
    engine_->noise().setTicks(rec.at("noise_ticks").get<int64_t>());
    if (rec.at("world_size").get<int64_t>() != comm_.size()) return;
    // Where the out-of-memory back-off stood: the same decisions and retries.
    const auto& oom = rec.at("oom");
    oom_.restore({oom.at("larger").get<std::vector<int64_t>>(),
                  oom.at("good_steps").get<int64_t>(), oom.at("recover_after").get<int64_t>(),
                  oom.at("retrying").get<bool>()});
  } catch (const nlohmann::json::exception& e) {
    throw Error(strCat("checkpoint: the adaptive batch record is damaged: ", e.what()));
  }
}

// Note [epoch from the step]: a resumed run continues at resume_.global_step; its
// epoch and the step in it follow from the plan (steps per epoch depend on G and N
// only: Note [equal shards]), or from the adaptive record (Note [adaptive checkpoint]).
Trainer::EpochRun Trainer::beginEpoch(Sharder& sharder, int64_t epoch, int64_t global_step) {
  EpochRun e;
  e.epoch = epoch;
  const int64_t spe = std::max<int64_t>(1, plan().steps_per_epoch);
  sharder = Sharder(plan(), static_cast<uint64_t>(cfg_.train.seed));  // the split may have changed
  sharder.setEpoch(epoch);
  if (adapt_) {
    if (const auto& r = adapt_->resumePoint(); epoch == r.epoch) {
      sharder.setCut(r.cut_step, r.cut_begin);
      e.first = r.step;
    }
    e.steps = sharder.stepsInEpoch();
  } else {
    e.first = global_step - epoch * spe;
    e.steps = std::min(plan().steps_per_epoch, plan().total_steps - epoch * spe);
  }
  e.cut_step = sharder.cutFirstStep();
  e.cut_begin = sharder.cutBegin();
  e.next = e.first;
  if (e.first > 0) {
    e.samples = resume_.epoch_samples;
    if (comm_.rank() == 0) e.loss_sum = resume_.epoch_loss_sum;
    e.logged.loss = e.loss_sum;  // metrics.jsonl: intervals start at the resume
    e.logged.samples = e.samples;
  }
  // Job indices as in an uninterrupted epoch: the loader's transform seeds follow them.
  engine_->loader().start(engine_->jobs(sharder, e.first, e.steps - e.first), epoch, sharder.jobIndex(e.first));
  e.started = monotonicSeconds();
  return e;
}

TrainResult Trainer::train(Console& console, const std::function<bool()>& stop_requested) {
  TrainResult result;
  console_ = &console;
  Sharder sharder(plan(), static_cast<uint64_t>(cfg_.train.seed));
  if (engine_->device().is_cuda()) compat::cudaResetPeak(engine_->device().index());
  system_series_.clear();
  system_ = makeSystemSampler(cfg_.report, engine_->device(), comm_.rank(), engine_->loader());
  engine_->takeTime();
  engine_->update().resetClipFigures();  // the search's steps are not the run's
  const double t0 = monotonicSeconds();
  int64_t global_step = resume_.global_step;  // Note [epoch from the step]
  result.history = resume_.history;
  result.samples = resume_.samples;
  double train_time = 0;
  int64_t epoch = global_step / std::max<int64_t>(1, plan().steps_per_epoch);
  if (adapt_) {
    restoreAdaptive(resume_.adapt);
    epoch = adapt_->resumePoint().epoch;
  }
  last_lr_ = stepLr(global_step);  // an epoch without steps still logs its lr
  // Adaptive: until the G0-equivalent progress reaches the plan's end (Note
  // [adaptive training]); else the plan's epochs and steps.
  const auto finished = [&] {
    return adapt_ ? adapt_->done() : !(epoch < plan().epochs && global_step < plan().total_steps);
  };
  for (; !finished(); ++epoch) {
    EpochRun e = beginEpoch(sharder, epoch, global_step);
    runSteps(e, sharder, &global_step, stop_requested, console, t0, result);
    train_time += monotonicSeconds() - e.started - e.checkpoint_s;
    result.time.add(e.time);
    result.samples += e.samples;
    if (e.failed) {
      // Note [oom back-off]: nothing left to back off to; no evaluation (it could
      // run out of memory too). The run ends with the last good weights.
      result.completed = false;
      break;
    }
    result.history.push_back(finishEpoch(e, console));
    logEpoch(e, result.history.back(), global_step, t0, result);
    if (e.checkpoint_due && (e.stop || !finished())) {
      checkpoint(e, global_step, /*mid_epoch=*/false, console, result);
    }
    if (e.stop) {
      stoppedLine(console, global_step, epoch);
      result.completed = false;
      break;
    }
  }
  // Note [background checkpoint]: the last write lands before the report counts it.
  if (checkpointer_) checkpointer_->settle(console, &result.checkpoints);
  if (profiler_) {
    if (profiler_->finish()) profileWritten(console);
    result.profile = profiler_->outcomeWithCost(step_seconds_);
  }
  console_ = nullptr;
  summarise(result, global_step, monotonicSeconds() - t0, train_time);
  return result;
}

}  // namespace batchdist::worker
