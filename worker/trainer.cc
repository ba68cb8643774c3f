#include "worker/trainer.h"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <iostream>

#include "collective/error.h"
#include "worker/util.h"
#include "collective/torch_compat.h"
#include "worker/gpu_monitor.h"

namespace batchdist::worker {
namespace {

double pct(double part, double whole) { return whole > 0 ? 100.0 * part / whole : 0.0; }

}  // namespace

std::string formatFixed(double v, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", digits, v);
  return buf;
}

std::string formatDuration(double s) {
  if (!std::isfinite(s) || s < 0) return "?";
  const auto total = static_cast<int64_t>(std::llround(s));
  char buf[32];
  if (total >= 3600) {
    std::snprintf(buf, sizeof buf, "%lld:%02lld:%02lld", static_cast<long long>(total / 3600),
                  static_cast<long long>(total / 60 % 60), static_cast<long long>(total % 60));
  } else {
    std::snprintf(buf, sizeof buf, "%lld:%02lld", static_cast<long long>(total / 60),
                  static_cast<long long>(total % 60));
  }
  return buf;
}

void Console::line(const std::string& s) {
  if (!enabled_) return;
  if (pending_) std::cout << "\r\033[K";
  pending_ = false;
  std::cout << s << std::endl;
}

void Console::status(const std::string& s) {
  if (!enabled_) return;
  const double t = monotonicSeconds();
  if (tty_) {
    if (t - last_plain_ < 0.2) return;  // a terminal needs no more than 5 updates a second
    std::cout << "\r\033[K" << s << std::flush;
    pending_ = true;
    last_plain_ = t;
  } else if (t - last_plain_ >= 5.0) {
    std::cout << s << std::endl;
    last_plain_ = t;
  }
}

Trainer::Trainer(const Config& cfg, collective::Communicator& comm, const DataSplit& data,
                 at::Device device, const Plan& plan, const std::string& base_dir)
    : cfg_(cfg), comm_(comm), data_(data), device_(device), plan_(plan) {
  checkPrecision(cfg.train.precision, device);
  // Same seed on every rank: identical initial weights without communication;
  // rank 0's state is broadcast anyway (TorchScript modules bring their own).
  torch::manual_seed(static_cast<uint64_t>(cfg.train.seed));
  const auto transform = Transform::fromConfig(cfg.data, /*training=*/true);
  model_ = buildModel(cfg.model, transform.outputShape(data.train.sample_shape),
                      data.train.classes, base_dir, &comm_);
  model_->to(device_);
  collective::broadcastCoalesced(comm_, model_->state(), 0);
  // Per-rank stream for dropout etc., deterministic for a fixed world size.
  torch::manual_seed(static_cast<uint64_t>(cfg.train.seed) + 1000003ull * (comm_.rank() + 1));
  optimizer_ = makeOptimizer(cfg.optim, model_->parameters());
  sync_ = std::make_unique<collective::GradientSynchronizer>(
      comm_, model_->parameters(), static_cast<std::size_t>(cfg.dist.bucket_mb * (1 << 20)));
  LoaderOptions lo;
  lo.workers = cfg.data.workers;
  lo.prefetch = cfg.data.prefetch;
  lo.pin_memory = cfg.data.pin_memory;
  lo.device = device_;
  lo.transform = transform;
  lo.seed = static_cast<uint64_t>(cfg.train.seed) * 31 + comm_.rank();
  loader_ = std::make_unique<Loader>(data.train, lo);
  eval_transform_ = Transform::fromConfig(cfg.data, /*training=*/false);
  if (cfg.train.precision == "fp16") {
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

double Trainer::trainStep(int64_t real, double lr, bool* stop) {
  const double loss = computeGradients(real);
  syncGradients(stop);
  applyUpdate(lr);
  return loss;
}

// Note [loss normalisation]: each micro-batch's loss is sum_i w_i * l_i / R,
// where R is the number of real (weight 1) samples in the whole global step,
// known on every rank from the plan. Autograd sums over micro-batches, the
// gradient synchroniser sums over ranks, so the update is the mean gradient over
// the R samples, whatever the split G = m x a x W; padded samples (w = 0) add nothing.
double Trainer::computeGradients(int64_t real) {
  model_->train(true);
  optimizer_->zeroGrad();
  const double denom = static_cast<double>(std::max<int64_t>(1, real));
  const double scale = scaler_ ? scaler_->scale() : 1.0;
  // Summed on the device, read once per step: no host sync per micro-batch.
  torch::Tensor loss_sum = torch::zeros({}, torch::TensorOptions().dtype(torch::kDouble).device(device_));
  for (int64_t k = 0; k < plan_.accum; ++k) {
    const double t0 = monotonicSeconds();
    const auto batch = loader_->next();
    const double t1 = monotonicSeconds();
    time_.data_wait += t1 - t0;
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
    loss_sum += weighted.detach().to(torch::kDouble);
    time_.compute += monotonicSeconds() - t1;
  }
  return loss_sum.item<double>();
}

void Trainer::clearGradients() {
  for (auto& p : model_->parameters()) p.mutable_grad() = torch::Tensor();
}

void Trainer::syncGradients(bool* stop) {
  // Timed with device synchronisation around it: what remains is the exposed
  // communication (nothing overlaps it yet).
  synchronize();
  const double t0 = monotonicSeconds();
  if (!stop) {
    sync_->sumGradients();
  } else {
    double flag = *stop ? 1.0 : 0.0;
    sync_->sumGradients(&flag);
    *stop = flag > 0.5;
  }
  synchronize();
  time_.comm += monotonicSeconds() - t0;
}

void Trainer::applyUpdate(double lr) {
  const double t0 = monotonicSeconds();
  // fp16: gradients are already summed over ranks, so every rank reaches the same verdict.
  if (scaler_ && !unscaleOrSkip(*scaler_, model_->parameters())) {
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

TrainResult Trainer::train(Console& console, const std::function<bool()>& stop_requested) {
  TrainResult result;
  Sharder sharder(plan_, static_cast<uint64_t>(cfg_.train.seed));
  std::unique_ptr<GpuMonitor> gpu;
  if (device_.is_cuda()) {
    gpu = std::make_unique<GpuMonitor>(device_.index());
    compat::cudaResetPeak(device_.index());
  }
  double util_sum = 0;
  int64_t util_n = 0;
  takeTime();
  const double t0 = monotonicSeconds();
  int64_t global_step = 0;
  double train_time = 0;
  for (int64_t epoch = 0; epoch < plan_.epochs && global_step < plan_.total_steps; ++epoch) {
    sharder.setEpoch(epoch);
    const int64_t steps = std::min(plan_.steps_per_epoch, plan_.total_steps - global_step);
    loader_->start(jobs(sharder, 0, steps), epoch);
    const double te = monotonicSeconds();
    double loss_sum = 0;
    int64_t samples = 0;
    TimeBreakdown epoch_time;
    bool stop = false;
    for (int64_t s = 0; s < steps && !stop; ++s) {
      stop = stop_requested && stop_requested();
      loss_sum += trainStep(sharder.realSamples(s), plan_.lrAt(global_step), &stop);
      samples += sharder.realSamples(s);
      ++global_step;
      epoch_time.add(takeTime());
      if (gpu && gpu->available() && global_step % 10 == 0) {
        const double u = gpu->utilization();
        if (u >= 0) {
          util_sum += u;
          ++util_n;
        }
      }
      if (console.enabled()) {
        const double dt = monotonicSeconds() - te;
        const double rate = samples / std::max(dt, 1e-9);
        const double run_rate = (monotonicSeconds() - t0) / global_step;
        std::string extra = strCat("  data ", formatFixed(pct(epoch_time.data_wait, epoch_time.total()), 0),
                                   "% comm ", formatFixed(pct(epoch_time.comm, epoch_time.total()), 0), "%");
        if (device_.is_cuda()) {
          extra += strCat("  mem ", formatFixed(compat::cudaPeakAllocatedBytes(device_.index()) / (1 << 30), 1),
                          " GiB");
        }
        console.status(strCat("epoch ", epoch + 1, "/", plan_.epochs, " step ", s + 1, "/",
                              plan_.steps_per_epoch, "  loss ",
                              formatFixed(loss_sum * comm_.size() / std::max<int64_t>(1, samples), 4),
                              "  lr ", plan_.lrAt(global_step - 1), "  ",
                              static_cast<int64_t>(rate), " samples/s", extra, "  ETA ",
                              formatDuration(run_rate * (plan_.total_steps - global_step))));
      }
    }
    const double train_secs = monotonicSeconds() - te;
    train_time += train_secs;
    result.time.add(epoch_time);
    const double train_loss =
        comm_.allreduce(loss_sum, collective::ReduceOp::kSum) / std::max<int64_t>(1, samples);
    if (cfg_.train.check_finite) checkHealth(epoch);
    const auto ev = evaluate();
    EpochStats st{epoch, train_loss, ev.loss, ev.accuracy, samples / std::max(train_secs, 1e-9),
                  monotonicSeconds() - te};
    result.history.push_back(st);
    result.samples += samples;
    console.line(strCat("epoch ", epoch + 1, "/", plan_.epochs, "  train_loss ",
                        formatFixed(train_loss, 4), "  eval_loss ", formatFixed(ev.loss, 4),
                        "  eval_acc ", formatFixed(100.0 * ev.accuracy, 2), " %  ",
                        static_cast<int64_t>(st.samples_per_s), " samples/s  (",
                        formatDuration(st.seconds), ")"));
    if (stop) {
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
  if (util_n > 0) result.gpu_utilization = util_sum / util_n;
  if (scaler_) {
    result.skipped_steps = scaler_->skippedSteps();
    result.loss_scale = scaler_->scale();
  }
  return result;
}

std::vector<std::string> diagnose(const Config& cfg, const TrainResult& r, at::Device device,
                                  const std::string& device_name) {
  std::vector<std::string> out;
  const double total = r.time.total();
  if (total <= 0) return out;
  const double data = pct(r.time.data_wait, total);
  const double comm = pct(r.time.comm, total);
  if (data > 10) {
    out.push_back(strCat("data: ", formatFixed(data, 0), " % of step time waiting for batches (",
                         formatFixed(r.time.data_wait, 1), " s of ", formatFixed(total, 1),
                         " s); raise data.workers (now ", cfg.data.workers, ") or data.prefetch (now ",
                         cfg.data.prefetch, "), or preprocess offline"));
  }
  if (comm > 30) {
    out.push_back(strCat("communication: ", formatFixed(comm, 0),
                         " % of step time in the gradient allreduce (", formatFixed(r.time.comm, 1),
                         " s); a larger per-GPU batch or gradient accumulation (batch.accum) "
                         "amortises it"));
  }
  if (device.is_cuda() && r.memory_total_mb > 0 && r.peak_memory_mb < 0.5 * r.memory_total_mb) {
    out.push_back(strCat("memory: peak ", formatFixed(r.peak_memory_mb / 1024, 1), " GiB of ",
                         formatFixed(r.memory_total_mb / 1024, 1), " GiB (",
                         formatFixed(pct(r.peak_memory_mb, r.memory_total_mb), 0),
                         " %); a larger batch fits: try batch.per_gpu: auto"));
  }
  if (device.is_cuda() && cfg.train.precision == "fp32") {
    out.push_back(strCat("precision: fp32 on ", device_name,
                         ", whose tensor cores run bf16/fp16 far faster; try train.precision: bf16 "
                         "(or fp16), which also halves activation memory"));
  }
  if (r.gpu_utilization >= 0 && r.gpu_utilization < 70) {
    out.push_back(strCat("utilization: the GPU was busy ", formatFixed(r.gpu_utilization, 0),
                         " % of the time (NVML); see the data and communication shares above"));
  }
  return out;
}

}  // namespace batchdist::worker
