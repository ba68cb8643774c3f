#include "worker/train/oom_guard.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <map>

#include "common/device_compat.h"
#include "common/error.h"
#include "worker/common/console.h"
#include "worker/common/util.h"
#include "worker/train/step/memory.h"

namespace batchdist::worker {
namespace {

std::string ranksText(const std::vector<int64_t>& ranks) {
  std::string out = ranks.size() == 1 ? "rank " : "ranks ";
  for (std::size_t i = 0; i < ranks.size(); ++i) out += strCat(i ? ", " : "", ranks[i]);
  return out;
}

std::string memoryText(const OomBackoff& b, bool cuda) {
  if (cuda) {
    return strCat("peak ", formatFixed(b.peak_mb, 0), " MB allocated of ",
                  formatFixed(b.capacity_mb, 0), " MB on the GPU");
  }
  return strCat("peak resident ", formatFixed(b.peak_mb, 0), " MB",
                b.capacity_mb > 0 ? strCat(", limit ", formatFixed(b.capacity_mb, 0),
                                           " MB (search.memory_limit_mb)")
                                  : std::string());
}

}  // namespace

OomGuard::OomGuard(collective::Communicator& comm, at::Device device, const Config& cfg,
                   const FaultPlan* faults)
    : comm_(comm), device_(device) {
  if (faults) faults_ = faults->oomTries(comm_.rank());
  state_.recover_after = cfg.train.oom_recover_after_steps;
  if (!device_.is_cuda()) limit_mb_ = static_cast<double>(cfg.search.memory_limit_mb);
}

void OomGuard::armFault(int64_t global_step) {
  const auto it = std::find_if(faults_.begin(), faults_.end(),
                               [&](const auto& f) { return f.first == global_step + 1; });
  inject_ = it != faults_.end();
  inject_forward_ = inject_ && it->second;
  if (inject_) faults_.erase(it);
}

void OomGuard::beginTry(const Model& model) {
  saveBuffers(model);
  resetStepPeak();
}

bool OomGuard::overLimit() const { return limit_mb_ > 0 && stepPeakMb() > limit_mb_; }

// Every step, so kept cheap: one concatenation per dtype (ResNet-50's 160
// buffers: two kernels), into storage kept from step to step. The buffers are
// looked up each time: a checkpoint restore may have replaced them.
void OomGuard::saveBuffers(const Model& model) {
  at::NoGradGuard no_grad;
  std::map<int, std::vector<at::Tensor>> by_dtype;
  for (const auto& b : model.buffers()) by_dtype[static_cast<int>(b.scalar_type())].push_back(b);
  buffers_.resize(by_dtype.size());
  std::size_t i = 0;
  for (auto& [dtype, group] : by_dtype) {
    auto& copy = buffers_[i++];
    std::vector<at::Tensor> flat;
    for (const auto& b : group) flat.push_back(b.detach().reshape({-1}));
    if (!copy.saved.defined()) copy.saved = at::empty({0}, group.front().options());
    at::cat_out(copy.saved, flat, 0);  // resizes once, then reuses the storage
    copy.live = std::move(group);
  }
}

void OomGuard::restoreBuffers() {
  at::NoGradGuard no_grad;
  for (auto& copy : buffers_) {
    int64_t offset = 0;
    for (auto& b : copy.live) {
      b.detach().copy_(copy.saved.narrow(0, offset, b.numel()).view(b.sizes()));
      offset += b.numel();
    }
  }
}

void OomGuard::resetStepPeak() {
  // CPU: only when a limit is checked (it trims the heap).
  if (!device_.is_cuda() && limit_mb_ <= 0) return;
  // The step's peak is kept first, so the run's peak in report.json is not just
  // its last step's.
  run_peak_mb_ = std::max(run_peak_mb_, stepPeakMb());
  resetPeakMemory(device_);
}

double OomGuard::stepPeakMb() const { return peakMemoryMb(device_); }

double OomGuard::capacityMb() const {
  return device_.is_cuda() ? compat::cudaTotalBytes(device_.index()) / (1 << 20) : limit_mb_;
}

OomFigures OomGuard::agreeFigures(bool failed_here) {
  // Every rank knows the step failed somewhere, so every rank is here: one
  // allreduce of (failed, peak, capacity) per rank.
  const int w = comm_.size();
  std::vector<double> v(3 * w, 0.0);
  if (failed_here) {
    v[3 * comm_.rank()] = 1;
    v[3 * comm_.rank() + 1] = stepPeakMb();
    v[3 * comm_.rank() + 2] = capacityMb();
  }
  v = comm_.allreduce(v, collective::ReduceOp::kSum);
  OomFigures f;
  for (int r = 0; r < w; ++r) {
    if (v[3 * r] < 0.5) continue;
    if (f.ranks.empty() || v[3 * r + 1] > f.peak_mb) {
      f.peak_mb = v[3 * r + 1];
      f.capacity_mb = v[3 * r + 2];
    }
    f.ranks.push_back(r);
  }
  return f;
}

OomBackoff OomGuard::backOff(const Plan& plan, const OomFigures& f, int64_t min_per_gpu,
                             int64_t global_step) {
  OomBackoff b;
  b.step = global_step + 1;
  b.ranks = f.ranks;
  b.from_per_gpu = plan.per_gpu;
  b.from_accum = plan.accum;
  b.peak_mb = f.peak_mb;
  b.capacity_mb = f.capacity_mb;
  b.retry = state_.retrying;
  const int64_t next = backedOffPerGpu(plan.per_gpu, min_per_gpu);
  if (next == 0) return b;
  b.to_per_gpu = next;
  b.to_accum = plan.per_gpu * plan.accum / next;
  if (state_.retrying) state_.recover_after *= 2;  // the larger batch still does not fit: wait longer
  state_.retrying = false;
  state_.larger.push_back(plan.per_gpu);
  return b;
}

int64_t OomGuard::recoverTo(const Plan& plan) {
  auto& s = state_;
  if (s.recover_after <= 0 || s.larger.empty() || s.good_steps < s.recover_after) return 0;
  // The newest per-GPU batch backed off from that splits this G (an adaptive
  // change of G may have left some that do not: Note [oom back-off]).
  const int64_t rank_batch = plan.per_gpu * plan.accum;
  const auto it = std::find_if(s.larger.rbegin(), s.larger.rend(), [&](int64_t m) {
    return m > plan.per_gpu && rank_batch % m == 0;
  });
  if (it == s.larger.rend()) return 0;
  const int64_t m = *it;
  s.larger.erase(std::next(it).base());
  s.retrying = true;
  return m;
}

void OomGuard::adaptiveSplit(int64_t per_gpu) {
  // Note [oom back-off]: the new split is no retry, and `larger` keeps every
  // per-GPU batch above it that ran out of memory, also those that do not split
  // this G: the adaptive decisions stay below all of them, and a retry
  // (recoverTo) takes the newest that splits G.
  state_.retrying = false;
  auto& larger = state_.larger;
  larger.erase(std::remove_if(larger.begin(), larger.end(),
                              [&](int64_t m) { return m <= per_gpu; }),
               larger.end());
}

std::string oomWhat(const OomBackoff& b, bool cuda) {
  return strCat("out of memory at step ", b.step, " on ", ranksText(b.ranks),
                " with per-GPU batch ", b.from_per_gpu, " x accumulation ", b.from_accum, " (",
                memoryText(b, cuda), ")");
}

std::string oomFailure(const OomBackoff& b, bool cuda, int64_t min_per_gpu) {
  return strCat(
      oomWhat(b, cuda), ", and no smaller split is left: ",
      min_per_gpu > 1 ? strCat("the model has BatchNorm, which needs at least ", min_per_gpu,
                               " samples per micro-batch (batch.min_per_gpu)")
                      : std::string("one sample per micro-batch is the least"),
      "; every rank stopped after step ", b.step - 1,
      ". Lower the memory a sample needs (a smaller model or data.resize, train.precision: "
      "bf16) or give each rank more memory");
}

}  // namespace batchdist::worker
