#include "worker/train/trainer.h"

#include <torch/torch.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <iostream>

#include "collective/error.h"
#include "worker/common/util.h"
#include "collective/torch_compat.h"
#include "worker/common/console.h"
#include "worker/train/checkpoint.h"
#include "worker/train/gpu_monitor.h"

namespace batchdist::worker {
Trainer::Trainer(const Config& cfg, collective::Communicator& comm, const DataSplit& data,
                 at::Device device, const Plan& plan)
    : cfg_(cfg), comm_(comm), data_(data), device_(device), plan_(plan) {
  checkPrecision(cfg.train.precision, device, cfg.source);
  // Same seed on every rank: identical initial weights without communication;
  // rank 0's state is broadcast anyway (TorchScript modules bring their own).
  torch::manual_seed(static_cast<uint64_t>(cfg.train.seed));
  const auto transform = Transform::fromConfig(cfg.data, /*training=*/true);
  model_ = buildModel(cfg.model, transform.outputShape(data.train.sample_shape),
                      data.train.classes, cfg.base_dir, &comm_);
  model_->to(device_);
  collective::broadcastCoalesced(comm_, model_->state(), 0);
  // Per-rank stream for dropout etc., deterministic for a fixed world size.
  torch::manual_seed(static_cast<uint64_t>(cfg.train.seed) + 1000003ull * (comm_.rank() + 1));
  // Note [frozen parameters]: only parameters that require grad are trained,
  // synchronised and decayed; a frozen backbone stays exactly as loaded.
  const auto trainable = model_->trainableParameters();
  optimizer_ = makeOptimizer(cfg.optim, trainable);
  const auto bucket_bytes = static_cast<std::size_t>(cfg.dist.bucket_mb * (1 << 20));
  if (cfg.dist.overlap) {
    reducer_ = std::make_unique<collective::Reducer>(comm_, trainable, bucket_bytes);
  } else {
    sync_ = std::make_unique<collective::GradientSynchronizer>(comm_, trainable, bucket_bytes);
  }
  if (reducer_) reducer_->setMeasureNorms(cfg.train.noise_scale);
  if (sync_) sync_->setMeasureNorms(cfg.train.noise_scale);
  LoaderOptions lo;
  lo.workers = cfg.data.workers;
  lo.prefetch = cfg.data.prefetch;
  lo.pin_memory = cfg.data.pin_memory;
  lo.device = device_;
  lo.transform = transform;
  lo.seed = static_cast<uint64_t>(cfg.train.seed) * 31 + comm_.rank();
  loader_ = std::make_unique<Loader>(data.train, lo);
  eval_transform_ = Transform::fromConfig(cfg.data, /*training=*/false);
  if (cfg.train.precision == Precision::kFp16) {
    scaler_ = std::make_unique<LossScaler>(cfg.train.loss_scale, cfg.train.scale_growth_interval);
  }
}

Trainer::~Trainer() = default;

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

// One summed number of the side channel carries both per-step wishes: stops
// count 0..W, checkpoint wishes add W + 1 each, so the sum over W ranks is at
// most W (W + 2): exact in the fp32 bucket for W up to ~4000 ranks.
double Trainer::encodeWishes(const bool* stop, const bool* checkpoint) const {
  const double unit = comm_.size() + 1.0;
  return (stop && *stop ? 1.0 : 0.0) + (checkpoint && *checkpoint ? unit : 0.0);
}

void Trainer::decodeWishes(double sum, bool* stop, bool* checkpoint) const {
  const double unit = comm_.size() + 1.0;
  const double wishes = std::floor((sum + 0.5) / unit);
  if (stop) *stop = sum - wishes * unit > 0.5;
  if (checkpoint) *checkpoint = wishes > 0.5;
}

double Trainer::trainStep(int64_t real, double lr, bool* stop, bool* checkpoint) {
  const double loss = computeGradients(real, encodeWishes(stop, checkpoint));
  syncGradients(stop, checkpoint);
  applyUpdate(lr);
  return loss;
}

// Note [loss normalisation]: each micro-batch's loss is sum_i w_i * l_i / R,
// where R is the number of real (weight 1) samples in the whole global step,
// known on every rank from the plan. Autograd sums over micro-batches, the
// gradient synchroniser sums over ranks, so the update is the mean gradient over
// the R samples, whatever the split G = m x a x W; padded samples (w = 0) add nothing.
double Trainer::computeGradients(int64_t real, double side) {
  model_->train(true);
  if (reducer_) {
    reducer_->zeroGrad();
  } else {
    optimizer_->zeroGrad();
  }
  const double denom = static_cast<double>(std::max<int64_t>(1, real));
  const double scale = scaler_ ? scaler_->scale() : 1.0;
  grad_scale_ = scale;
  step_real_ = real;
  micro_sq_ = micro_total_sq_ = torch::Tensor();
  // Summed on the device, read once per step: no host sync per micro-batch.
  torch::Tensor loss_sum = torch::zeros({}, torch::TensorOptions().dtype(torch::kDouble).device(device_));
  for (int64_t k = 0; k < plan_.accum; ++k) {
    const double t0 = monotonicSeconds();
    const auto batch = loader_->next();
    const double t1 = monotonicSeconds();
    time_.data_wait += t1 - t0;
    // Note [overlapped reducer]: only the last micro-batch's backward sends.
    if (reducer_) reducer_->prepare(k == plan_.accum - 1, side);
    if (batch.x.size(0) == 0) continue;  // only under last_batch: keep
    torch::Tensor out;
    {
      AutocastScope autocast(device_, cfg_.train.precision);
      out = model_->forward(batch.x);
    }
    auto per_sample = torch::nn::functional::cross_entropy(
        out.to(torch::kFloat), batch.y,
        torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kNone));
    auto weighted = (per_sample * batch.w).sum();
    (weighted * (scale / denom)).backward();
    if (microNoise()) trackMicroBatch(k);
    loss_sum += weighted.detach().to(torch::kDouble);
    time_.compute += monotonicSeconds() - t1;
  }
  return loss_sum.item<double>();
}

void Trainer::clearGradients() {
  if (reducer_) {
    reducer_->zeroGrad();  // the gradients are views of its buckets: keep them
    return;
  }
  for (auto& p : model_->trainableParameters()) p.mutable_grad() = torch::Tensor();
}

void Trainer::syncGradients(bool* stop, bool* checkpoint) {
  // Timed with device synchronisation around it: what remains is the exposed
  // communication (with the reducer, what backward did not hide).
  synchronize();
  const double t0 = monotonicSeconds();
  if (reducer_) {
    decodeWishes(reducer_->finish(), stop, checkpoint);
    synchronize();
    // Part of the wait was for a slower rank to finish its backward, not for the
    // network: report that apart.
    const double waited = monotonicSeconds() - t0;
    const double skew = std::min(waited, reducer_->lastSkewSeconds());
    time_.skew += skew;
    time_.comm += waited - skew;
    recordNoise();
    return;
  }
  if (!stop && !checkpoint) {
    sync_->sumGradients();
  } else {
    double flag = encodeWishes(stop, checkpoint);
    sync_->sumGradients(&flag);
    decodeWishes(flag, stop, checkpoint);
  }
  synchronize();
  time_.comm += monotonicSeconds() - t0;
  recordNoise();
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
  const auto& n = reducer_ ? reducer_->lastNorms() : sync_->lastNorms();
  // A padded (or uneven, last_batch: keep) step has ranks of different real
  // batch sizes: Note [gradient noise scale] assumes equal ones, so it is left out.
  if (!n.valid || step_real_ != plan_.global) return;
  const auto x = noiseSample(n.local_sum, n.summed, grad_scale_, comm_.size(),
                             plan_.per_gpu * plan_.accum);
  noise_.add(x.small_sq, x.b_small, x.big_sq, x.b_big);  // skips an fp16 overflow
}

NoiseScaleResult Trainer::noiseResult() const {
  NoiseScaleResult r;
  r.b_small = microNoise() ? plan_.per_gpu : plan_.per_gpu * plan_.accum;
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
  const double t0 = monotonicSeconds();
  // fp16: gradients are already summed over ranks, so every rank reaches the same verdict.
  if (scaler_ && !unscaleOrSkip(*scaler_, model_->trainableParameters())) {
    time_.compute += monotonicSeconds() - t0;
    return;  // skipped: the scale backed off
  }
  optimizer_->step(lr);
  time_.compute += monotonicSeconds() - t0;
}

EvalResult Trainer::evaluate() {
  torch::NoGradGuard no_grad;
  // Every rank evaluates with rank 0's BatchNorm statistics (DDP's broadcast_buffers).
  collective::broadcastCoalesced(comm_, model_->buffers(), 0);
  model_->train(false);
  const auto& val = data_.val;
  double loss = 0;
  double correct = 0;
  double count = 0;
  if (val.size() > 0) {
    const auto [begin, end] = evalShard(val.size(), comm_.size(), comm_.rank());
    const int64_t chunk = cfg_.batch.eval_per_gpu > 0 ? cfg_.batch.eval_per_gpu
                                                       : std::max<int64_t>(plan_.per_gpu, 256);
    for (int64_t b = begin; b < end; b += chunk) {
      const int64_t e = std::min(end, b + chunk);
      auto x = val.x.slice(0, b, e).to(torch::kFloat);
      if (val.x_scale != 1.0) x.mul_(val.x_scale);
      x = eval_transform_.apply(x.to(device_), 0);
      auto y = val.y.slice(0, b, e).to(device_);
      torch::Tensor out;
      {
        AutocastScope autocast(device_, cfg_.train.precision);
        out = model_->forward(x);
      }
      out = out.to(torch::kFloat);
      loss += torch::nn::functional::cross_entropy(
                  out, y, torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum))
                  .item<double>();
      correct += out.argmax(1).eq(y).sum().item<double>();
      count += static_cast<double>(e - b);
    }
  }
  const auto total = comm_.allreduce({loss, correct, count}, collective::ReduceOp::kSum);
  EvalResult r;
  r.samples = static_cast<int64_t>(total[2]);
  if (total[2] > 0) {
    r.loss = total[0] / total[2];
    r.accuracy = total[1] / total[2];
  }
  return r;
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
  // At the last metrics line (metrics.jsonl): its interval starts there.
  double logged_at = 0;
  double logged_loss = 0;
  int64_t logged_samples = 0;
  TimeBreakdown logged_time;
};

void Trainer::progress(Console& console, const EpochRun& e, int64_t step, int64_t global_step,
                       double run_started) {
  if (!console.enabled()) return;
  const auto pct = [](double part, double whole) { return whole > 0 ? 100.0 * part / whole : 0.0; };
  const double now = monotonicSeconds();
  const double rate = e.samples / std::max(now - e.started, 1e-9);
  const double per_step = (now - run_started) / global_step;
  std::string extra = strCat("  data ", formatFixed(pct(e.time.data_wait, e.time.total()), 0),
                             "% comm ", formatFixed(pct(e.time.comm, e.time.total()), 0), "%");
  if (device_.is_cuda()) {
    extra += strCat("  mem ",
                    formatFixed(compat::cudaPeakAllocatedBytes(device_.index()) / (1 << 30), 1),
                    " GiB");
  }
  console.status(strCat("epoch ", e.epoch + 1, "/", plan_.epochs, " step ", step + 1, "/",
                        plan_.steps_per_epoch, "  loss ",
                        formatFixed(e.loss_sum * comm_.size() / std::max<int64_t>(1, e.samples), 4),
                        "  lr ", plan_.lrAt(global_step - 1), "  ", static_cast<int64_t>(rate),
                        " samples/s", extra, "  ETA ",
                        formatDuration(per_step * (plan_.total_steps - global_step))));
}

// metrics.jsonl: about ten lines per epoch (every steps_per_epoch / 10 steps and
// at the epoch's last step), from rank 0's own numbers: no collective.
void Trainer::logMetrics(EpochRun& e, int64_t step, int64_t global_step, double run_started,
                         TrainResult& result) {
  if (comm_.rank() != 0) return;
  const int64_t every = std::max<int64_t>(1, plan_.steps_per_epoch / 10);
  if ((step + 1) % every != 0 && step + 1 != e.steps && !e.stop) return;
  const double now = monotonicSeconds();
  if (e.logged_at == 0) e.logged_at = e.started;
  MetricPoint m;
  m.step = global_step;
  m.epoch = e.epoch + 1;
  m.seconds = now - run_started;
  const int64_t samples = e.samples - e.logged_samples;
  m.train_loss = (e.loss_sum - e.logged_loss) * comm_.size() / std::max<int64_t>(1, samples);
  m.lr = plan_.lrAt(global_step - 1);
  m.samples_per_s = samples / std::max(now - e.logged_at, 1e-9);
  m.time = e.time;
  m.time.data_wait -= e.logged_time.data_wait;
  m.time.compute -= e.logged_time.compute;
  m.time.comm -= e.logged_time.comm;
  m.time.skew -= e.logged_time.skew;
  m.noise_scale = noise_.bSimple();
  result.metrics.push_back(m);
  e.logged_at = now;
  e.logged_loss = e.loss_sum;
  e.logged_samples = e.samples;
  e.logged_time = e.time;
}

void Trainer::logEpochMetrics(const EpochRun& e, const EpochStats& h, int64_t global_step,
                              double run_started, TrainResult& result) {
  if (comm_.rank() != 0) return;
  MetricPoint m;
  m.epoch_end = true;
  m.step = global_step;
  m.epoch = h.epoch + 1;
  m.seconds = monotonicSeconds() - run_started;
  m.train_loss = h.train_loss;
  m.lr = plan_.lrAt(global_step - 1);
  m.samples_per_s = h.samples_per_s;
  m.time = e.time;
  m.noise_scale = h.noise_scale;
  m.eval_loss = h.eval_loss;
  m.eval_accuracy = h.eval_accuracy;
  result.metrics.push_back(m);
}

void Trainer::runSteps(EpochRun& e, const Sharder& sharder, int64_t* global_step,
                       const std::function<bool()>& stop_requested, Console& console,
                       double run_started, UtilizationSampler& gpu, TrainResult& result) {
  for (int64_t s = e.first; s < e.steps && !e.stop; ++s) {
    e.stop = stop_requested && stop_requested();
    bool due = checkpointer_ && checkpointer_->dueByTime();  // rank 0's clock decides
    e.loss_sum += trainStep(sharder.realSamples(s), plan_.lrAt(*global_step), &e.stop,
                            checkpointer_ ? &due : nullptr);
    e.samples += sharder.realSamples(s);
    ++*global_step;
    e.time.add(takeTime());
    gpu.sample(*global_step);
    progress(console, e, s, *global_step, run_started);
    logMetrics(e, s, *global_step, run_started, result);
    if (!checkpointer_) continue;
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

void Trainer::checkpoint(const EpochRun& e, int64_t global_step, bool mid_epoch,
                         Console& console, TrainResult& result) {
  TrainPosition pos;
  pos.global_step = global_step;
  pos.history = result.history;
  pos.samples = result.samples;
  if (mid_epoch) {
    // The epoch so far, summed over the ranks once, so a resumed epoch counts it once.
    pos.epoch_samples = e.samples;
    pos.epoch_loss_sum = comm_.allreduce(e.loss_sum, collective::ReduceOp::kSum);
  }
  auto rec = checkpointer_->save(state(), pos, e.stop, console);
  result.checkpoint_s += rec.seconds;
  result.checkpoints.push_back(std::move(rec));
}

TrainState Trainer::state() {
  TrainState st;
  st.model = model_.get();
  st.optimizer = optimizer_.get();
  st.scaler = scaler_.get();
  st.device = device_;
  return st;
}

EpochStats Trainer::finishEpoch(const EpochRun& e, Console& console) {
  const double train_secs = monotonicSeconds() - e.started;
  const double train_loss =
      comm_.allreduce(e.loss_sum, collective::ReduceOp::kSum) / std::max<int64_t>(1, e.samples);
  if (cfg_.train.check_finite) checkHealth(e.epoch);
  const auto ev = evaluate();
  EpochStats st{e.epoch, train_loss, ev.loss, ev.accuracy, e.samples / std::max(train_secs, 1e-9),
                monotonicSeconds() - e.started, noise_.windowBSimple()};
  noise_.resetWindow();
  console.line(strCat("epoch ", e.epoch + 1, "/", plan_.epochs, "  train_loss ",
                      formatFixed(train_loss, 4), "  eval_loss ", formatFixed(ev.loss, 4),
                      "  eval_acc ", formatFixed(100.0 * ev.accuracy, 2), " %  ",
                      static_cast<int64_t>(st.samples_per_s), " samples/s  (",
                      formatDuration(st.seconds), ")",
                      st.noise_scale > 0
                          ? strCat("  B_simple ", static_cast<int64_t>(std::lround(st.noise_scale)))
                          : std::string()));
  return st;
}

void Trainer::UtilizationSampler::sample(int64_t global_step) {
  if (!monitor || !monitor->available() || global_step % 10 != 0) return;
  const double u = monitor->utilization();
  if (u >= 0) {
    sum += u;
    ++count;
  }
}

TrainResult Trainer::train(Console& console, const std::function<bool()>& stop_requested) {
  TrainResult result;
  Sharder sharder(plan_, static_cast<uint64_t>(cfg_.train.seed));
  UtilizationSampler gpu;
  if (device_.is_cuda()) {
    gpu.monitor = std::make_unique<GpuMonitor>(device_.index());
    compat::cudaResetPeak(device_.index());
  }
  takeTime();
  const double t0 = monotonicSeconds();
  // A resumed run continues at resume_.global_step: epoch and step in it follow
  // from the plan (steps per epoch depend on G and N only: Note [equal shards]).
  int64_t global_step = resume_.global_step;
  result.history = resume_.history;
  result.samples = resume_.samples;
  const int64_t spe = std::max<int64_t>(1, plan_.steps_per_epoch);
  double train_time = 0;
  for (int64_t epoch = global_step / spe; epoch < plan_.epochs && global_step < plan_.total_steps;
       ++epoch) {
    EpochRun e;
    e.epoch = epoch;
    e.first = global_step - epoch * spe;
    e.steps = std::min(plan_.steps_per_epoch, plan_.total_steps - epoch * spe);
    if (e.first > 0) {
      e.samples = resume_.epoch_samples;
      if (comm_.rank() == 0) e.loss_sum = resume_.epoch_loss_sum;
      e.logged_loss = e.loss_sum;  // metrics.jsonl: intervals start at the resume
      e.logged_samples = e.samples;
    }
    sharder.setEpoch(epoch);
    // Job indices as in an uninterrupted epoch: the loader's transform seeds follow them.
    loader_->start(jobs(sharder, e.first, e.steps - e.first), epoch, e.first * plan_.accum);
    e.started = monotonicSeconds();
    runSteps(e, sharder, &global_step, stop_requested, console, t0, gpu, result);
    train_time += monotonicSeconds() - e.started - e.checkpoint_s;
    result.time.add(e.time);
    result.history.push_back(finishEpoch(e, console));
    logEpochMetrics(e, result.history.back(), global_step, t0, result);
    result.samples += e.samples;
    if (e.checkpoint_due && (e.stop || global_step < plan_.total_steps)) {
      checkpoint(e, global_step, /*mid_epoch=*/false, console, result);
    }
    if (e.stop) {
      result.completed = false;
      console.line(strCat("stop requested: every rank stopped after step ", global_step, " of ",
                          plan_.total_steps, " (epoch ", epoch + 1, ")"));
      break;
    }
  }
  result.steps = global_step;
  result.epochs = static_cast<int64_t>(result.history.size());
  result.wall_s = monotonicSeconds() - t0;
  if (!result.history.empty()) {
    const auto& last = result.history.back();
    result.train_loss = last.train_loss;
    result.eval_loss = last.eval_loss;
    result.eval_accuracy = last.eval_accuracy;
  }
  // Training throughput: real samples over the time spent in training steps.
  result.samples_per_s = result.samples / std::max(train_time, 1e-9);
  if (device_.is_cuda()) {
    result.peak_memory_mb = compat::cudaPeakAllocatedBytes(device_.index()) / (1 << 20);
    result.memory_total_mb = compat::cudaTotalBytes(device_.index()) / (1 << 20);
  }
  if (gpu.count > 0) result.gpu_utilization = gpu.sum / gpu.count;
  result.noise = noiseResult();
  if (scaler_) {
    result.skipped_steps = scaler_->skippedSteps();
    result.loss_scale = scaler_->scale();
  }
  return result;
}

}  // namespace batchdist::worker
