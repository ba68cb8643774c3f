#include "worker/trainer.h"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <iostream>

#include "collective/error.h"

namespace batchdist::worker {
namespace {

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

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
  const double t = now();
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
                 at::Device device, const Plan& plan)
    : cfg_(cfg), comm_(comm), data_(data), device_(device), plan_(plan) {
  // Same seed on every rank: identical initial weights without communication;
  // rank 0's state is broadcast anyway so that no rank can start different.
  torch::manual_seed(static_cast<uint64_t>(cfg.train.seed));
  model_ = buildModel(cfg.model, data.train.sample_shape, data.train.classes);
  model_->to(device_);
  collective::broadcastCoalesced(comm_, modelState(*model_), 0);
  // Per-rank stream for dropout etc., deterministic for a fixed world size.
  torch::manual_seed(static_cast<uint64_t>(cfg.train.seed) + 1000003ull * (comm_.rank() + 1));
  optimizer_ = makeOptimizer(cfg.optim, *model_);
  sync_ = std::make_unique<collective::GradientSynchronizer>(
      comm_, model_->parameters(), static_cast<std::size_t>(cfg.dist.bucket_mb * (1 << 20)));
  train_x_ = data.train.x.to(device_);
  train_y_ = data.train.y.to(device_);
}

// Note [loss normalisation]: each micro-batch's loss is sum_i w_i * l_i / R,
// where R is the number of real (weight 1) samples in the whole global step,
// known on every rank from the plan. Autograd sums over micro-batches, the
// gradient synchroniser sums over ranks, so the update is the mean gradient over
// the R samples, whatever the split G = m x a x W; padded samples (w = 0) add nothing.
double Trainer::trainStep(const Sharder& sharder, int64_t step, double lr, bool* stop) {
  const double loss = computeGradients(sharder, step);
  syncGradients(stop);
  applyUpdate(lr);
  return loss;
}

double Trainer::computeGradients(const Sharder& sharder, int64_t step) {
  model_->train();
  optimizer_->zeroGrad();
  const double denom = static_cast<double>(std::max<int64_t>(1, sharder.realSamples(step)));
  double loss_sum = 0;
  for (int64_t k = 0; k < plan_.accum; ++k) {
    const auto mb = sharder.micro(step, k, comm_.rank());
    if (mb.indices.empty()) continue;  // only under last_batch: keep
    auto idx = torch::tensor(mb.indices, torch::kLong).to(device_);
    auto w = torch::tensor(mb.weights, torch::kFloat).to(device_);
    auto out = model_->forward(train_x_.index_select(0, idx));
    auto per_sample = torch::nn::functional::cross_entropy(
        out, train_y_.index_select(0, idx),
        torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kNone));
    auto weighted = (per_sample * w).sum();
    (weighted / denom).backward();
    loss_sum += weighted.item<double>();
  }
  return loss_sum;
}

void Trainer::clearGradients() {
  for (auto& p : model_->parameters()) p.mutable_grad() = torch::Tensor();
}

void Trainer::syncGradients(bool* stop) {
  if (!stop) {
    sync_->sumGradients();
    return;
  }
  double flag = *stop ? 1.0 : 0.0;
  sync_->sumGradients(&flag);
  *stop = flag > 0.5;
}

void Trainer::applyUpdate(double lr) { optimizer_->step(lr); }

EvalResult Trainer::evaluate() {
  torch::NoGradGuard no_grad;
  // Every rank evaluates with rank 0's BatchNorm statistics (DDP's broadcast_buffers).
  auto buffers = model_->buffers();
  collective::broadcastCoalesced(comm_, buffers, 0);
  model_->eval();
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
      auto x = val.x.slice(0, b, e).to(device_);
      auto y = val.y.slice(0, b, e).to(device_);
      auto out = model_->forward(x);
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
  for (const auto& item : model_->named_parameters()) {
    if (bad.empty() && !torch::isfinite(item.value()).all().item<bool>()) bad = item.key();
    checksum += item.value().to(torch::kDouble).sum().item<double>();
  }
  for (const auto& item : model_->named_buffers()) {
    if (item.value().is_floating_point() && bad.empty() &&
        !torch::isfinite(item.value()).all().item<bool>()) {
      bad = item.key() + " (buffer)";
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
  const double t0 = now();
  int64_t global_step = 0;
  double train_time = 0;
  for (int64_t epoch = 0; epoch < plan_.epochs && global_step < plan_.total_steps; ++epoch) {
    sharder.setEpoch(epoch);
    const double te = now();
    double loss_sum = 0;
    int64_t samples = 0;
    bool stop = false;
    for (int64_t s = 0; s < plan_.steps_per_epoch && global_step < plan_.total_steps && !stop; ++s) {
      stop = stop_requested && stop_requested();
      loss_sum += trainStep(sharder, s, plan_.lrAt(global_step), &stop);
      samples += sharder.realSamples(s);
      ++global_step;
      if (console.enabled()) {
        const double dt = now() - te;
        const double rate = samples / std::max(dt, 1e-9);
        const double run_rate = (now() - t0) / global_step;
        console.status(strCat("epoch ", epoch + 1, "/", plan_.epochs, " step ", s + 1, "/",
                              plan_.steps_per_epoch, "  loss ",
                              formatFixed(loss_sum * comm_.size() / std::max<int64_t>(1, samples), 4),
                              "  lr ", plan_.lrAt(global_step - 1), "  ",
                              static_cast<int64_t>(rate),
                              " samples/s  ETA ",
                              formatDuration(run_rate * (plan_.total_steps - global_step))));
      }
    }
    const double train_secs = now() - te;
    train_time += train_secs;
    const double train_loss =
        comm_.allreduce(loss_sum, collective::ReduceOp::kSum) / std::max<int64_t>(1, samples);
    if (cfg_.train.check_finite) checkHealth(epoch);
    const auto ev = evaluate();
    EpochStats st{epoch, train_loss, ev.loss, ev.accuracy, samples / std::max(train_secs, 1e-9),
                  now() - te};
    result.history.push_back(st);
    result.samples += samples;
    console.line(strCat("epoch ", epoch + 1, "/", plan_.epochs, "  train_loss ",
                        formatFixed(train_loss, 4), "  eval_loss ", formatFixed(ev.loss, 4), "  eval_acc ",
                        formatFixed(100.0 * ev.accuracy, 2), " %  ",
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
  result.wall_s = now() - t0;
  if (!result.history.empty()) {
    const auto& last = result.history.back();
    result.train_loss = last.train_loss;
    result.eval_loss = last.eval_loss;
    result.eval_accuracy = last.eval_accuracy;
  }
  // Training throughput: real samples over the time spent in training steps.
  result.samples_per_s = result.samples / std::max(train_time, 1e-9);
  return result;
}

}  // namespace batchdist::worker
