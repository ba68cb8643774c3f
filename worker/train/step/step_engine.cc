#include "worker/train/step/step_engine.h"

#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <iostream>
#include <thread>

#include "collective/torch_compat.h"
#include "common/error.h"
#include "common/trace.h"
#include "worker/common/util.h"
#include "worker/train/checkpoint/checkpoint.h"
#include "worker/train/step/memory.h"

namespace batchdist::worker {
namespace {

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

/// The levers an engine trains under: `asked`, or the config's own, which must
/// be concrete by then (Note [lever search]: the search or a resume decides auto).
Levers concreteLevers(const Config& cfg, const std::optional<Levers>& asked) {
  const Levers l = asked ? *asked : configLevers(cfg);
  if (hasAutoLevers(l)) {
    throw Error(strCat("internal: a step engine needs concrete levers, not ", autoLeversText(l)));
  }
  return l;
}

}  // namespace

StepEngine::StepEngine(const Config& cfg, collective::Communicator& comm, const DataSplit& data,
                       at::Device device, const Plan& plan, const FaultPlan* faults,
                       std::optional<Levers> levers)
    : cfg_(withLevers(cfg, concreteLevers(cfg, levers))), comm_(comm), device_(device), plan_(plan),
      noise_(cfg.train.noise_scale, cfg.train.noise_scale_every, comm.size()) {
  const FaultPlan none;
  const FaultPlan& f = faults ? *faults : none;  // Note [fault plan]
  checkPrecision(cfg_.train.precision, device, cfg_.source);
  // Same seed on every rank: identical initial weights without communication;
  // rank 0's state is broadcast anyway (TorchScript modules bring their own).
  torch::manual_seed(static_cast<uint64_t>(cfg_.train.seed));
  const auto transform = Transform::fromConfig(cfg_.data, /*training=*/true);
  const auto task = chooseTask(cfg_, data);  // Note [task choice]: the same on every rank
  task_ = makeTask(task.kind, task.module);
  const auto input_shape = transform.outputShape(data.train.sample_shape);
  model_ = buildModel(cfg_.model, input_shape, task.outputs, cfg_.base_dir, &comm_);
  model_->to(device_);
  model_->setChannelsLast(channelsLast(cfg_.train, cfg_.model, device_.is_cuda()));
  // Note [module loss]: a module that returns its own loss is tried here, on every rank.
  task_->probe(*model_, data.train, input_shape, {device_, cfg_.train.precision},
               plan_.samples_padded > 0);
  collective::broadcastCoalesced(comm_, model_->state(), 0);
  // Per-rank stream for dropout etc., deterministic for a fixed world size.
  torch::manual_seed(static_cast<uint64_t>(cfg_.train.seed) + 1000003ull * (comm_.rank() + 1));
  // Note [frozen parameters]: only parameters that require grad are trained,
  // synchronised and decayed; a frozen backbone stays exactly as loaded.
  update_ = makeUpdateStrategy(cfg_, comm_, model_->trainableParameters(), model_->units());
  model_->setUnitHooks(update_->unitHooks());  // Note [parameter units]
  buildLoaders(data, f);
  slow_update_us_ = f.slow_update_us;
}

StepEngine::~StepEngine() = default;

void StepEngine::buildLoaders(const DataSplit& data, const FaultPlan& f) {
  const auto warn = [rank = comm_.rank(), size = comm_.size()](const std::string& msg) {
    std::cerr << strCat("[rank ", rank, "/", size, "] warning: ", msg, "\n") << std::flush;
  };
  const auto seed = static_cast<uint64_t>(cfg_.train.seed);
  const bool channels_last = model_->channelsLast();  // Note [channels last]
  LoaderOptions lo =
      loaderOptions(cfg_.data, data.train, /*training=*/true, device_, seed, warn, f.slow_read_us);
  lo.seed = seed * 31 + comm_.rank();
  lo.transform.channels_last = channels_last;
  loader_ = std::make_unique<Loader>(data.train, lo);
  std::unique_ptr<Loader> val_loader;  // decoded validation sets (Note [loader])
  if (data.val.source) {
    auto vo = loaderOptions(cfg_.data, data.val, /*training=*/false, device_, seed, warn,
                            f.slow_read_us);
    vo.transform.channels_last = channels_last;
    val_loader = std::make_unique<Loader>(data.val, vo);
  }
  auto eval_transform = Transform::fromConfig(cfg_.data, /*training=*/false);
  eval_transform.channels_last = channels_last;
  evaluator_ = std::make_unique<Evaluator>(comm_, *model_, *task_, data.val, std::move(val_loader),
                                           eval_transform, device_, cfg_.train.precision,
                                           cfg_.batch.eval_per_gpu);
}

bool StepEngine::setLevers(const Levers& to) {
  const Levers from = levers();
  if (to.recompute != from.recompute && !model_->setRecompute(to.recompute == Recompute::kOn)) {
    return false;
  }
  const bool reshard = to.shard != from.shard;
  cfg_ = withLevers(cfg_, to);
  if (reshard) {
    if (UnitHooks* units = update_->unitHooks()) {
      // Note [parameter units]: leaving parameters, every rank gathers every unit
      // (collective: the search switches levers on every rank together); the
      // parameters keep the gathered memory once the units are gone.
      units->gatherAll();
      model_->setUnitHooks(nullptr);
    }
    update_.reset();
    update_ = makeUpdateStrategy(cfg_, comm_, model_->trainableParameters(), model_->units());
    model_->setUnitHooks(update_->unitHooks());
  }
  return true;
}

void StepEngine::synchronize() const {
  if (device_.is_cuda()) torch::cuda::synchronize(device_.index());
}

TimeBreakdown StepEngine::takeTime() {
  auto t = time_;
  time_ = TimeBreakdown{};
  return t;
}

double StepEngine::takeUpdateSeconds() {
  const double s = update_s_;
  update_s_ = 0;
  return s;
}

std::vector<MicroBatch> StepEngine::jobs(const Sharder& sharder, int64_t first, int64_t count) const {
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

double StepEngine::trainStep(int64_t real, double lr, bool* stop, bool* checkpoint) {
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
double StepEngine::computeGradients(int64_t real, InjectOom inject) {
  model_->train(true);
  update_->zeroGrad();
  const double scale = update_->lossScale();
  update_->setMeasureNorms(noise_.beginStep(plan_, real, scale));  // Note [noise cadence]
  // Summed on the device, read once per step: no host sync per micro-batch.
  torch::Tensor loss_sum =
      torch::zeros({}, torch::TensorOptions().dtype(torch::kDouble).device(device_));
  const double denom = static_cast<double>(std::max<int64_t>(1, real));
  for (int64_t k = 0; k < plan_.accum; ++k) microStep(k, scale / denom, inject, loss_sum);
  return loss_sum.item<double>();
}

void StepEngine::microStep(int64_t k, double scale, InjectOom inject, at::Tensor& loss_sum) {
  const double t0 = monotonicSeconds();
  const auto batch = loader_->next();
  const double t1 = monotonicSeconds();
  time_.data_wait += t1 - t0;
  // Note [overlapped reducer]: only the last micro-batch's backward sends.
  // The side channel is given in syncGradients() (Note [side channel]).
  const bool final_micro = k == plan_.accum - 1;
  update_->beforeBackward(k, plan_.accum);
  if (batch.x.size(0) == 0) return;  // only under last_batch: keep
  std::optional<InjectedOom> fault;
  if (final_micro && inject.backward) {
    const auto params = model_->trainableParameters();
    if (!params.empty()) fault.emplace(params.front());
  }
  torch::Tensor weighted;
  {
    trace::Range range("batchdist/forward");  // Note [trace ranges]
    weighted = forwardLoss(batch, final_micro && inject.forward);
  }
  {
    trace::Range range("batchdist/backward");
    (weighted * scale).backward();
  }
  if (noise_.wantsMicroBatches()) noise_.afterMicroBatch(k, model_->trainableParameters(), device_);
  loss_sum += weighted.detach().to(torch::kDouble);
  time_.compute += monotonicSeconds() - t1;
}

// Note [sync batchnorm failure]: with synchronised BatchNorm every rank ends the
// forward with one agreement; a rank that failed joins the allreduces it missed.
torch::Tensor StepEngine::forwardLoss(const Batch& batch, bool inject) {
  SyncBatchNorm* sync = model_->syncBatchNorm();
  torch::Tensor weighted;
  try {
    if (sync) sync->beginForward();
    if (inject) {
      // Halfway through forward: before the middle BatchNorm allreduce, or the
      // middle unit's gather (Note [parameter units]), or else before the forward.
      if (sync && sync->synchronising()) {
        sync->failBeforeCollective(sync->layers() / 2);
      } else if (UnitHooks* units = update_->unitHooks()) {
        units->failBeforeUnit(model_->units().size() / 2);
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

ComputeOutcome StepEngine::computeOrCatch(int64_t real, InjectOom inject, double* loss) {
  try {
    *loss = computeGradients(real, inject);
  } catch (const PeerOutOfMemory&) {
    // Note [sync batchnorm failure]: not this rank's failure; the side channel
    // carries the failing rank's, and every rank discards the step.
    update_->backwardFailed();
    return ComputeOutcome::kPeerOutOfMemory;
  } catch (const std::exception& e) {
    if (!isOutOfMemory(e)) throw;
    // The failed graph was freed as the exception unwound. Under dist.shard:
    // parameters this makes the unit collectives the others make (Note [collective replay]).
    update_->backwardFailed();
    if (device_.is_cuda()) compat::cudaEmptyCache();
    return ComputeOutcome::kOutOfMemory;
  }
  return ComputeOutcome::kOk;
}

void StepEngine::clearGradients() { update_->dropGrad(); }

void StepEngine::syncGradients(bool* stop, bool* checkpoint, bool* oom) {
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
  // A failed step is redone (Note [oom back-off]): it measures nothing.
  if (!oom || !*oom) noise_.afterSync(update_->lastNorms());
}

void StepEngine::applyUpdate(double lr) {
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

NoiseScaleResult StepEngine::noiseResult() const {
  return noise_.result(plan_, shardsGradients(cfg_.dist, comm_.size()));
}

TrainState StepEngine::state() {
  TrainState st;
  st.model = model_.get();
  st.optimizer = &update_->optimizer();
  st.scaler = update_->scaler();
  st.device = device_;
  return st;
}

void StepEngine::checkHealth(int64_t epoch) {
  torch::NoGradGuard no_grad;
  const WholeParameters whole(*model_);  // Note [parameter units]
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

}  // namespace batchdist::worker
