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
#include "worker/train/adapt_record.h"
#include "worker/train/adaptive_batch.h"
#include "worker/train/checkpoint.h"
#include "worker/train/data_figures.h"
#include "worker/train/memory.h"
#include "worker/train/system_figures.h"
#include "worker/train/update_strategy.h"

namespace batchdist::worker {
namespace {

/// Note [sync batchnorm failure]: this rank's forward finished, but another
/// rank's ran out of memory; the step is abandoned on every rank.
struct PeerOutOfMemory : std::exception {
  const char* what() const noexcept override { return "another rank ran out of memory in forward"; }
};

/// BATCHDIST_FAULT_OOM: while it lives, the gradient of `param` (the first
/// parameter: its gradient comes last in backward) throws the allocator's
/// out-of-memory type, halfway through backward.
class InjectedOom {
 public:
  explicit InjectedOom(at::Tensor param) : param_(std::move(param)) {
    hook_ = param_.register_hook([](const at::Tensor&) -> at::Tensor {
      throw c10::OutOfMemoryError({__func__, __FILE__, static_cast<uint32_t>(__LINE__)},
                                  "out of memory (injected by BATCHDIST_FAULT_OOM)");
    });
  }
  ~InjectedOom() { param_.remove_hook(hook_); }
  InjectedOom(const InjectedOom&) = delete;
  InjectedOom& operator=(const InjectedOom&) = delete;

 private:
  at::Tensor param_;
  unsigned hook_ = 0;
};

}  // namespace
Trainer::Trainer(const Config& cfg, collective::Communicator& comm, const DataSplit& data,
                 at::Device device, const Plan& plan, const FaultPlan* faults)
    : cfg_(cfg), comm_(comm), data_(data), device_(device), plan_(plan),
      oom_(comm, device, cfg, faults),
      log_(comm.rank(), comm.size()) {
  const FaultPlan none;
  const FaultPlan& f = faults ? *faults : none;  // Note [fault plan]
  checkPrecision(cfg.train.precision, device, cfg.source);
  // Same seed on every rank: identical initial weights without communication;
  // rank 0's state is broadcast anyway (TorchScript modules bring their own).
  torch::manual_seed(static_cast<uint64_t>(cfg.train.seed));
  const auto transform = Transform::fromConfig(cfg.data, /*training=*/true);
  const auto task = chooseTask(cfg, data);  // Note [task choice]: the same on every rank
  task_ = makeTask(task.kind, task.module);
  const auto input_shape = transform.outputShape(data.train.sample_shape);
  model_ = buildModel(cfg.model, input_shape, task.outputs, cfg.base_dir, &comm_);
  model_->to(device_);
  // Note [module loss]: a module that returns its own loss is tried here, on every rank.
  task_->probe(*model_, data.train, input_shape, {device_, cfg.train.precision},
               plan_.samples_padded > 0);
  collective::broadcastCoalesced(comm_, model_->state(), 0);
  // Per-rank stream for dropout etc., deterministic for a fixed world size.
  torch::manual_seed(static_cast<uint64_t>(cfg.train.seed) + 1000003ull * (comm_.rank() + 1));
  // Note [frozen parameters]: only parameters that require grad are trained,
  // synchronised and decayed; a frozen backbone stays exactly as loaded.
  update_ = makeUpdateStrategy(cfg, comm_, model_->trainableParameters());
  const auto warn = [rank = comm_.rank(), size = comm_.size()](const std::string& msg) {
    std::cerr << strCat("[rank ", rank, "/", size, "] warning: ", msg, "\n") << std::flush;
  };
  LoaderOptions lo = loaderOptions(cfg.data, data.train, /*training=*/true, device_,
                                   static_cast<uint64_t>(cfg.train.seed), warn, f.slow_read_us);
  lo.seed = static_cast<uint64_t>(cfg.train.seed) * 31 + comm_.rank();
  loader_ = std::make_unique<Loader>(data.train, lo);
  std::unique_ptr<Loader> val_loader;  // decoded validation sets (Note [loader])
  if (data.val.source) {
    val_loader = std::make_unique<Loader>(
        data.val, loaderOptions(cfg.data, data.val, /*training=*/false, device_,
                                static_cast<uint64_t>(cfg.train.seed), warn, f.slow_read_us));
  }
  evaluator_ = std::make_unique<Evaluator>(
      comm_, *model_, *task_, data.val, std::move(val_loader),
      Transform::fromConfig(cfg.data, /*training=*/false), device_, cfg.train.precision,
      cfg.batch.eval_per_gpu);
  slow_update_us_ = f.slow_update_us;
  adapt_figures_fault_ = f.adapt_figures_rank == comm_.rank();
  if (f.hang.rank == comm_.rank()) hang_step_ = f.hang.step;
}

Trainer::~Trainer() = default;

void Trainer::rebuildUpdate() {
  update_.reset();
  update_ = makeUpdateStrategy(cfg_, comm_, model_->trainableParameters());
}

void Trainer::synchronize() const {
  if (device_.is_cuda()) torch::cuda::synchronize(device_.index());
}

TimeBreakdown Trainer::takeTime() {
  auto t = time_;
  time_ = TimeBreakdown{};
  return t;
}

std::vector<MicroBatch> Trainer::jobs(const Sharder& sharder, int64_t first, int64_t count) const {
  std::vector<MicroBatch> out;
  out.reserve(count * plan_.accum);
  for (int64_t s = first; s < first + count; ++s) {
    for (int64_t k = 0; k < plan_.accum; ++k) out.push_back(sharder.micro(s, k, comm_.rank()));
  }
  return out;
}

collective::SideChannel packWishes(const StepWishes& mine) {
  return {mine.stop ? 1.0 : 0.0, mine.checkpoint ? 1.0 : 0.0, mine.oom ? 1.0 : 0.0};
}

StepWishes unpackWishes(const collective::SideChannel& summed) {
  return {summed[0] > 0.5, summed[1] > 0.5, summed[2] > 0.5};
}

double Trainer::trainStep(int64_t real, double lr, bool* stop, bool* checkpoint) {
  const double loss = computeGradients(real);
  syncGradients(stop, checkpoint);
  applyUpdate(lr);
  return loss;
}

// Note [loss normalisation]: each micro-batch's loss is sum_i w_i * l_i / R,
// where R is the number of real (weight 1) samples in the whole global step,
// known on every rank from the plan. Autograd sums over micro-batches, the
// gradient synchroniser sums over ranks, so the update is the mean gradient over
// the R samples, whatever the split G = m x a x W; padded samples (w = 0) add nothing.
// Per token: a language model's sample is a window of T tokens whose loss is their
// mean (Note [language model] in worker/task/task.cc), so the update is the mean
// over the R x T real tokens. The task gives sum_i w_i * l_i (Task::forwardLoss);
// a TorchScript module's own per-sample loss is weighed alike (Note [module loss]).
double Trainer::computeGradients(int64_t real) {
  model_->train(true);
  update_->zeroGrad();
  const double denom = static_cast<double>(std::max<int64_t>(1, real));
  const double scale = update_->lossScale();
  grad_scale_ = scale;
  step_real_ = real;
  micro_sq_ = micro_total_sq_ = torch::Tensor();
  // Note [noise cadence]: every rank counts the same steps, so all agree whether
  // this one carries its norm in the allreduce.
  noise_now_ = cfg_.train.noise_scale && noise_ticks_++ % cfg_.train.noise_scale_every == 0;
  update_->setMeasureNorms(noise_now_);
  // Summed on the device, read once per step: no host sync per micro-batch.
  torch::Tensor loss_sum = torch::zeros({}, torch::TensorOptions().dtype(torch::kDouble).device(device_));
  for (int64_t k = 0; k < plan_.accum; ++k) {
    const double t0 = monotonicSeconds();
    const auto batch = loader_->next();
    const double t1 = monotonicSeconds();
    time_.data_wait += t1 - t0;
    // Note [overlapped reducer]: only the last micro-batch's backward sends.
    // The side channel is given in syncGradients() (Note [side channel]).
    const bool final_micro = k == plan_.accum - 1;
    update_->beforeBackward(k, plan_.accum);
    if (batch.x.size(0) == 0) continue;  // only under last_batch: keep
    std::optional<InjectedOom> fault;
    if (final_micro && oom_.injectInBackward()) {
      const auto params = model_->trainableParameters();
      if (!params.empty()) fault.emplace(params.front());
    }
    torch::Tensor weighted;
    {
      trace::Range range("batchdist/forward");  // Note [trace ranges]
      weighted = forwardLoss(batch, final_micro && oom_.injectInForward());
    }
    {
      trace::Range range("batchdist/backward");
      (weighted * (scale / denom)).backward();
    }
    if (noise_now_ && microNoise()) trackMicroBatch(k);
    loss_sum += weighted.detach().to(torch::kDouble);
    time_.compute += monotonicSeconds() - t1;
  }
  return loss_sum.item<double>();
}

// Note [sync batchnorm failure]: with synchronised BatchNorm every rank ends the
// forward with one agreement; a rank that failed joins the allreduces it missed.
torch::Tensor Trainer::forwardLoss(const Batch& batch, bool inject) {
  SyncBatchNorm* sync = model_->syncBatchNorm();
  torch::Tensor weighted;
  try {
    if (sync) sync->beginForward();
    if (inject) {
      // Halfway through forward: before the middle BatchNorm allreduce, or (no
      // synchronised BatchNorm) before the forward itself.
      if (sync && sync->synchronising()) {
        sync->failBeforeCollective(sync->layers() / 2);
      } else {
        throw c10::OutOfMemoryError({__func__, __FILE__, static_cast<uint32_t>(__LINE__)},
                                    "out of memory (injected by BATCHDIST_FAULT_OOM in forward)");
      }
    }
    weighted = task_->forwardLoss(*model_, batch, {device_, cfg_.train.precision});  // Note [task]
  } catch (const std::exception& e) {
    if (sync && isOutOfMemory(e)) sync->endForward(/*failed=*/true);
    throw;
  }
  if (sync && sync->endForward(/*failed=*/false) > 0) throw PeerOutOfMemory();
  return weighted;
}

void Trainer::clearGradients() { update_->dropGrad(); }

void Trainer::syncGradients(bool* stop, bool* checkpoint, bool* oom) {
  // Timed with device synchronisation around it: what remains is the exposed
  // communication (with the reducer, what backward did not hide).
  synchronize();
  trace::Range range("batchdist/gradient_sync");  // the exposed wait; the wishes agreed
  const double t0 = monotonicSeconds();
  // Note [oom back-off]: the oom slot counts the ranks whose step failed.
  // Note [step wishes]
  collective::SideChannel side =
      packWishes({stop && *stop, checkpoint && *checkpoint, oom && *oom});
  const auto all = unpackWishes(update_->sumGradients(side));
  if (stop) *stop = all.stop;
  if (checkpoint) *checkpoint = all.checkpoint;
  if (oom) *oom = all.oom;
  synchronize();
  // Part of the wait may have been for a slower rank to finish its backward, not
  // for the network (the reducer can tell): reported apart.
  const double waited = monotonicSeconds() - t0;
  const double skew = std::min(waited, update_->lastSkewSeconds());
  time_.skew += skew;
  time_.comm += waited - skew;
  if (!oom || !*oom) recordNoise();  // a failed step is redone (Note [oom back-off])
}

// One rank, a micro-batches: d_k, micro-batch k's share of the gradient, is the
// running gradient minus the previous one (a copy of the gradients kept for it);
// sum_k |d_k|^2 plays sum_r |g_r|^2 with a micro-batches in place of W ranks.
void Trainer::trackMicroBatch(int64_t k) {
  torch::NoGradGuard no_grad;
  const auto params = model_->trainableParameters();
  if (micro_prev_.size() != params.size()) micro_prev_.assign(params.size(), torch::Tensor());
  auto sq = torch::zeros({}, torch::TensorOptions().dtype(torch::kDouble).device(device_));
  auto total = sq.clone();
  const bool first = !micro_sq_.defined();
  for (std::size_t i = 0; i < params.size(); ++i) {
    const auto& g = params[i].grad();
    if (!g.defined()) continue;
    const auto flat = g.reshape({-1});
    if (first || !micro_prev_[i].defined()) {
      sq += torch::dot(flat, flat).to(torch::kDouble);
      micro_prev_[i] = flat.clone();
    } else {
      const auto d = flat - micro_prev_[i];
      sq += torch::dot(d, d).to(torch::kDouble);
      micro_prev_[i].copy_(flat);
    }
    if (k == plan_.accum - 1) total += torch::dot(flat, flat).to(torch::kDouble);
  }
  micro_sq_ = first ? sq : micro_sq_ + sq;
  if (k == plan_.accum - 1) micro_total_sq_ = total;
}

void Trainer::recordNoise() {
  if (microNoise()) {
    if (!micro_total_sq_.defined() || step_real_ != plan_.global) return;
    const auto x = noiseSample(micro_sq_.item<double>(), micro_total_sq_.item<double>(),
                               grad_scale_, plan_.accum, plan_.per_gpu);
    noise_.add(x.small_sq, x.b_small, x.big_sq, x.b_big);
    return;
  }
  const auto& n = update_->lastNorms();
  // A padded (or uneven, last_batch: keep) step has ranks of different real
  // batch sizes: Note [gradient noise scale] assumes equal ones, so it is left out.
  if (!n.valid || step_real_ != plan_.global) return;
  // Under dist.shard: gradients one local gradient per micro-batch (n.parts).
  const auto x = noiseSample(n.local_sum, n.summed, grad_scale_, comm_.size() * n.parts,
                             plan_.per_gpu * plan_.accum / n.parts);
  noise_.add(x.small_sq, x.b_small, x.big_sq, x.b_big);  // skips an fp16 overflow
}

NoiseScaleResult Trainer::noiseResult() const {
  NoiseScaleResult r;
  // Note [sharded gradients]: a local gradient per micro-batch, so B_small = per_gpu.
  r.b_small = microNoise() || shardsGradients(cfg_.dist, comm_.size()) ? plan_.per_gpu
                                                                        : plan_.per_gpu * plan_.accum;
  r.b_big = plan_.global;
  r.steps = noise_.steps();
  r.measured = noise_.steps() > 0;
  if (!cfg_.train.noise_scale) {
    r.why_not = "train.noise_scale is off";
  } else if (comm_.size() < 2 && plan_.accum < 2) {
    r.why_not = "it needs two batch sizes: at least 2 ranks (per rank and global), or "
                "batch.accum > 1 on one rank (micro-batch and step)";
  } else if (!r.measured) {
    r.why_not = "no step with every sample real was measured";
  }
  if (r.measured) {
    r.b_simple = noise_.bSimple();
    r.grad_sq = noise_.gradSq();
    r.trace = noise_.trace();
    // |G|^2 is estimated without bias but with a spread of about tr(S) / B_big per
    // step: far below B_simple its average can come out <= 0.
    if (r.b_simple <= 0) {
      r.why_not = strCat("the smoothed |G|^2 estimate is not positive: the gradient's signal is "
                         "below what the global batch of ", plan_.global,
                         " resolves, so B_simple is far above it");
    }
  }
  return r;
}

void Trainer::applyUpdate(double lr) {
  trace::Range range("batchdist/optimizer");
  const double t0 = monotonicSeconds();
  if (!update_->step(lr)) {
    time_.compute += monotonicSeconds() - t0;
    return;  // fp16: skipped, the scale backed off
  }
  if (slow_update_us_ > 0) std::this_thread::sleep_for(std::chrono::microseconds(slow_update_us_));
  const double spent = monotonicSeconds() - t0;
  time_.compute += spent;
  update_s_ += spent;
}

void Trainer::checkHealth(int64_t epoch) {
  torch::NoGradGuard no_grad;
  std::string bad;
  double checksum = 0;
  for (const auto& [name, p] : model_->namedParameters()) {
    if (bad.empty() && !torch::isfinite(p).all().item<bool>()) bad = name;
    checksum += p.to(torch::kDouble).sum().item<double>();
  }
  for (const auto& [name, b] : model_->namedBuffers()) {
    if (b.is_floating_point() && bad.empty() && !torch::isfinite(b).all().item<bool>()) {
      bad = name + " (buffer)";
    }
  }
  const auto hi = comm_.allreduce({bad.empty() ? 0.0 : 1.0, checksum}, collective::ReduceOp::kMax);
  const double lo = comm_.allreduce(checksum, collective::ReduceOp::kMin);
  if (hi[0] > 0) {
    throw TrainingError(strCat(
        "epoch ", epoch + 1, ": ",
        bad.empty() ? std::string("a parameter is not finite on another rank")
                    : "parameter '" + bad + "' is not finite (NaN or Inf) on this rank",
        "; the learning rate (", plan_.lr, ") may be too high for batch ", plan_.global,
        ": lower optim.lr or add optim.warmup_epochs"));
  }
  if (std::abs(hi[1] - lo) > 1e-6 * std::max(1.0, std::abs(hi[1]))) {
    throw TrainingError(strCat("epoch ", epoch + 1,
                               ": parameters differ between ranks (checksums ", lo, " .. ", hi[1],
                               "); gradient synchronisation is broken"));
  }
}

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
  const EpochSoFar so_far{e.epoch, e.steps, plan_.steps_per_epoch, e.started, e.loss_sum,
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
  f.global_batch = plan_.global;
  f.per_gpu = plan_.per_gpu;
  f.accum = plan_.accum;
  f.tokens_per_sample = plan_.tokens_per_sample;
  f.cuda = device_.is_cuda();
  // The run's peak so far (each step resets the allocator's: Note [oom back-off]).
  if (peak || f.cuda) f.peak_memory_mb = oom_.runPeakMb();
  f.noise_scale = noise_.bSimple();
  f.adaptive = adapt_ != nullptr;
  // Adaptive: the steps left at the current gain (Note [adaptive training]).
  f.steps_left =
      adapt_ ? adapt_->stepsLeft() : static_cast<double>(plan_.total_steps - global_step);
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
    if (profiler_ && profiler_->endStep(/*last=*/e.stop || *global_step + 1 >= plan_.total_steps)) {
      profileWritten(console);  // the run's last step: evaluation stays out of the trace
    }
    if (step_seconds_.size() < 100000) step_seconds_.push_back(monotonicSeconds() - step_started);
    if (checkpointer_) checkpointer_->noteStep(monotonicSeconds() - step_started);
    e.loss_sum += loss;
    e.samples += sharder.realSamples(s);
    ++*global_step;
    heartbeat::setStep(*global_step);  // Note [heartbeat]
    e.next = s + 1;
    const auto step_time = takeTime();
    e.time.add(step_time);
    // Note [adaptive training]: the step counts r steps at G0; at the plan's end
    // the epoch ends here (evaluation, last metrics).
    if (adapt_ &&
        adapt_->countStep(step_time.comm + update_s_, monotonicSeconds() - step_started)) {
      e.steps = s + 1;
    }
    update_s_ = 0;
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
  oom_.beginTry(*model_);
  failed_here_ = computeOrFail(real, loss);
  // Always: every rank makes every bucket's allreduce (Note [search agreement]).
  bool any = failed_here_;
  syncGradients(stop, checkpoint, &any);
  if (any) {
    oom_.restoreBuffers();
    return false;
  }
  applyUpdate(lr);
  return true;
}

bool Trainer::computeOrFail(int64_t real, double* loss) {
  try {
    *loss = computeGradients(real);
  } catch (const PeerOutOfMemory&) {
    // Note [sync batchnorm failure]: not this rank's failure; the side channel
    // carries the failing rank's, and every rank discards the step.
    oom_.disarm();
    update_->backwardFailed();
    return false;
  } catch (const std::exception& e) {
    oom_.disarm();
    if (!isOutOfMemory(e)) throw;
    // The failed graph was freed as the exception unwound.
    update_->backwardFailed();
    if (device_.is_cuda()) compat::cudaEmptyCache();
    return true;
  }
  oom_.disarm();
  // CPU: over search.memory_limit_mb counts as out of memory, as in the search.
  return oom_.overLimit();
}

bool Trainer::backOff(EpochRun& e, Sharder& sharder, int64_t s, int64_t global_step,
                      TrainResult& result) {
  const OomFigures f = oom_.agreeFigures(failed_here_);  // collective
  const int64_t floor = minPerGpu(cfg_, model_->hasBatchNorm());
  const OomBackoff b = oom_.backOff(plan_, f, floor, global_step);
  result.oom_backoffs.push_back(b);
  if (b.to_per_gpu == 0) {
    result.failure = oomFailure(b, device_.is_cuda(), floor);
    return false;
  }
  changeSplit(e, sharder, s, {plan_.global, b.to_per_gpu, b.to_accum}, SplitCut::kKeep);
  if (console_) {
    console_->line(strCat("oom back-off: ", oomWhat(b, device_.is_cuda()),
                          "; every rank redoes the step as per-GPU batch ", plan_.per_gpu,
                          " x accumulation ", plan_.accum, ": global batch ", plan_.global,
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
    plan_ = withGlobal(plan_, to.global, to.per_gpu, to.accum);
    sharder = sharder.withPlan(plan_);
    sharder.setCut(s, pos);
    e.steps = sharder.stepsInEpoch();
    e.cut_step = s;
    e.cut_begin = pos;
  } else {
    plan_ = withPerGpu(plan_, to.per_gpu);
    sharder = sharder.withPlan(plan_);
  }
  loader_->start(jobs(sharder, s, std::max<int64_t>(0, e.steps - s)), e.epoch, sharder.jobIndex(s));
  // Adaptive: the manifest's plan stays the plan at G0 (Note [adaptive checkpoint]).
  if (checkpointer_ && !adapt_) checkpointer_->setPlan(plan_);
  oom_.splitChanged();
}

void Trainer::maybeRecover(EpochRun& e, Sharder& sharder, int64_t s, int64_t global_step,
                           TrainResult& result) {
  const int64_t m = oom_.recoverTo(plan_);
  if (m == 0) return;
  const int64_t from_m = plan_.per_gpu, from_a = plan_.accum;
  changeSplit(e, sharder, s, {plan_.global, m, plan_.per_gpu * plan_.accum / m}, SplitCut::kKeep);
  ++result.oom_retries;
  if (console_) {
    console_->line(strCat("oom recover: step ", global_step + 1, ": trying per-GPU batch ",
                          plan_.per_gpu, " x accumulation ", plan_.accum, " again after ",
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

TrainState Trainer::state() {
  TrainState st;
  st.model = model_.get();
  st.optimizer = &update_->optimizer();
  st.scaler = update_->scaler();
  st.device = device_;
  return st;
}

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
  if (cfg_.train.check_finite) checkHealth(e.epoch);
  const auto ev = [&] {
    const PausedSampling aside(system_.get());  // Note [system metrics]: steps only
    return evaluate();
  }();
  EpochStats st{e.epoch, train_loss, ev.loss, ev.metrics, e.samples / std::max(train_secs, 1e-9),
                monotonicSeconds() - e.started, noise_.windowBSimple()};
  noise_.resetWindow();
  console.line(strCat(epochLabel(e.epoch), "  train_loss ",
                      formatFixed(train_loss, 4),
                      ev.samples > 0 ? strCat("  eval_loss ", formatFixed(ev.loss, 4),
                                              joinedFigures(task_->epochFigures(ev.metrics)), "  ")
                                     : std::string("  (no validation set)  "),
                      static_cast<int64_t>(st.samples_per_s), " samples/s",
                      tokenRate(st.samples_per_s, plan_.tokens_per_sample), "  (",
                      formatDuration(st.seconds), ")",
                      st.noise_scale > 0
                          ? strCat("  B_simple ", static_cast<int64_t>(std::lround(st.noise_scale)))
                          : std::string()));
  return st;
}

PhaseSeconds Trainer::phaseSeconds(const TrainResult& result) const {
  PhaseSeconds p;
  if (!step_seconds_.empty()) p.first_step = step_seconds_.front();
  if (step_seconds_.size() > 1) {
    std::vector<double> rest(step_seconds_.begin() + 1, step_seconds_.end());
    std::nth_element(rest.begin(), rest.begin() + rest.size() / 2, rest.end());
    p.steady_step = rest[rest.size() / 2];
  }
  p.eval = evaluator_->meanSeconds();
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

// ---------------------------------------------------------------------------
// Note [adaptive training]

void Trainer::setAdaptive(const AdaptSpace& space) {
  adapt_ = std::make_unique<AdaptiveBatch>(cfg_.batch, cfg_.optim.name, comm_, plan_, space,
                                           adapt_figures_fault_);
}

std::string Trainer::epochLabel(int64_t epoch) const {
  return adapt_ ? strCat("epoch ", epoch + 1) : strCat("epoch ", epoch + 1, "/", plan_.epochs);
}

double Trainer::stepLr(int64_t global_step) const {
  if (!adapt_) return plan_.lrAt(global_step);
  return adapt_->lr(plan_.global);
}

void Trainer::maybeAdapt(EpochRun& e, Sharder& sharder, int64_t s, int64_t global_step) {
  if (!adapt_) return;
  const auto to = adapt_->decide(s, global_step, {plan_.global, plan_.per_gpu, plan_.accum},
                                 noise_.bSimple(), oom_.state().larger, console_);
  if (!to) return;
  changeSplit(e, sharder, s, *to, SplitCut::kAnew);
  oom_.adaptiveSplit(plan_.per_gpu);  // Note [oom back-off]
}

nlohmann::ordered_json Trainer::adaptRecord(int64_t epoch, int64_t next_step, int64_t cut_step,
                                            int64_t cut_begin) const {
  return adapt_->record({plan_.global, plan_.per_gpu, plan_.accum}, epoch, next_step, cut_step,
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
  parts.noise = adapt_record::noiseJson(noise_.state());
  parts.noise_ticks = noise_ticks_;
  return parts;
}

void Trainer::restoreAdaptive(const nlohmann::ordered_json& rec) {
  if (!rec.is_null()) restoreAdaptRecordParts(rec);
  if (auto plan = adapt_->restore(rec, resume_.global_step, plan_, console_)) plan_ = *plan;
}

void Trainer::restoreAdaptRecordParts(const nlohmann::ordered_json& rec) {
  try {
    noise_.restore(adapt_record::noiseFrom(rec.at("noise")));
    noise_ticks_ = rec.at("noise_ticks").get<int64_t>();
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
  const int64_t spe = std::max<int64_t>(1, plan_.steps_per_epoch);
  sharder = Sharder(plan_, static_cast<uint64_t>(cfg_.train.seed));  // the split may have changed
  sharder.setEpoch(epoch);
  if (adapt_) {
    if (const auto& r = adapt_->resumePoint(); epoch == r.epoch) {
      sharder.setCut(r.cut_step, r.cut_begin);
      e.first = r.step;
    }
    e.steps = sharder.stepsInEpoch();
  } else {
    e.first = global_step - epoch * spe;
    e.steps = std::min(plan_.steps_per_epoch, plan_.total_steps - epoch * spe);
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
  loader_->start(jobs(sharder, e.first, e.steps - e.first), epoch, sharder.jobIndex(e.first));
  e.started = monotonicSeconds();
  return e;
}

TrainResult Trainer::train(Console& console, const std::function<bool()>& stop_requested) {
  TrainResult result;
  console_ = &console;
  Sharder sharder(plan_, static_cast<uint64_t>(cfg_.train.seed));
  if (device_.is_cuda()) compat::cudaResetPeak(device_.index());
  system_series_.clear();
  system_ = makeSystemSampler(cfg_.report, device_, comm_.rank(), *loader_);
  takeTime();
  update_->resetClipFigures();  // the search's steps are not the run's
  const double t0 = monotonicSeconds();
  int64_t global_step = resume_.global_step;  // Note [epoch from the step]
  result.history = resume_.history;
  result.samples = resume_.samples;
  double train_time = 0;
  int64_t epoch = global_step / std::max<int64_t>(1, plan_.steps_per_epoch);
  if (adapt_) {
    restoreAdaptive(resume_.adapt);
    epoch = adapt_->resumePoint().epoch;
  }
  last_lr_ = stepLr(global_step);  // an epoch without steps still logs its lr
  // Adaptive: until the G0-equivalent progress reaches the plan's end (Note
  // [adaptive training]); else the plan's epochs and steps.
  const auto finished = [&] {
    return adapt_ ? adapt_->done() : !(epoch < plan_.epochs && global_step < plan_.total_steps);
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
                                : strCat(" of ", plan_.total_steps),
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
    result.eval_metrics = task_->metrics(std::vector<double>(task_->sumCount(), 0.0), 1.0);
  }
  result.task = toString(task_->kind());
  result.best_metric = task_->best().name;
  result.best_higher = task_->best().higher_is_better;
  // Training throughput: real samples over the time spent in training steps.
  result.samples_per_s = result.samples / std::max(train_time, 1e-9);
  // CPU: the peak resident set (VmHWM) of this rank; without a memory limit it is
  // the process's, search included.
  result.peak_memory_mb = oom_.runPeakMb();
  if (device_.is_cuda()) result.memory_total_mb = compat::cudaTotalBytes(device_.index()) / (1 << 20);
  if (system_) {
    result.system = gatherSystemFigures(comm_, std::move(system_), std::move(system_series_));
    if (!result.system.empty() && result.system.front().run.has(SystemMetric::kGpuUtil)) {
      result.gpu_utilization = result.system.front().run.get(SystemMetric::kGpuUtil);
    }
  }
  result.noise = noiseResult();
  result.data =
      gatherDataFigures(comm_, *loader_, evaluator_->loader(), data_, cfg_.data.cache, device_);
  result.grad_clip = update_->clipFigures();
  result.update_memory = update_->memory();
  if (const LossScaler* scaler = update_->scaler()) {
    result.skipped_steps = scaler->skippedSteps();
    result.loss_scale = scaler->scale();
  }
}

}  // namespace batchdist::worker
