#include "worker/train/step/step_timing.h"

#include <torch/cuda.h>

#include <algorithm>
#include <cmath>

#include "collective/torch_compat.h"
#include "common/error.h"
#include "worker/common/util.h"
#include "worker/search/stats.h"
#include "worker/train/step/memory.h"

namespace batchdist::worker {

DeviceProbe::DeviceProbe(at::Device device, const SearchConfig& search) : device_(device) {
  if (device_.is_cuda()) {
    budget_mb_ = search.memory_fraction * compat::cudaTotalBytes(device_.index()) / (1 << 20);
    name_ = compat::cudaDeviceName(device_.index());
  } else {
    budget_mb_ = static_cast<double>(search.memory_limit_mb);
    name_ = "cpu";
  }
}

void DeviceProbe::resetPeak() const { resetPeakMemory(device_); }

double DeviceProbe::peakMb() const { return peakMemoryMb(device_); }

void DeviceProbe::synchronize() const {
  if (device_.is_cuda()) torch::cuda::synchronize(device_.index());
}

void DeviceProbe::emptyCache() const {
  if (device_.is_cuda()) compat::cudaEmptyCache();
}

void recordFailure(const std::exception& e, Measurement& out) {
  out.fail = isOutOfMemory(e) ? FailKind::kOutOfMemory : FailKind::kError;
  if (out.fail == FailKind::kError) out.detail = firstLine(e.what());
}

namespace {

/// Past the budget (the peak so far): a failure (Note [search warm-up]: not timed on).
void markOverBudget(const DeviceProbe& probe, Measurement& out) {
  if (out.fail == FailKind::kNone && probe.budgetMb() > 0 &&
      std::max(out.peak_mb, probe.peakMb()) > probe.budgetMb()) {
    out.fail = FailKind::kOverBudget;
  }
}

/// Note [adaptive timing]: each timed step is timed alone and the median taken
/// (a step delayed by the scheduler, or a peer's, does not move it); the ranks
/// agree at the check points whether to go on. Steps from `first`.
void timeSteps(collective::Communicator& comm, const DeviceProbe& probe, const TimingRule& rule,
               int64_t first, const CandidateRun& run, Measurement& out) {
  const double started = monotonicSeconds();
  for (int64_t n = 0, check = rule.nextCheck(0);;) {
    probe.synchronize();
    const double t = monotonicSeconds();
    run.step(first + n, out);
    probe.synchronize();
    out.step_seconds.push_back(monotonicSeconds() - t);
    if (++n < check) continue;
    markOverBudget(probe, out);
    const bool failed = out.fail != FailKind::kNone;
    const bool more =
        !failed && rule.wantsMore(n, monotonicSeconds() - started, medianEstimate(out.step_seconds));
    const auto v = comm.allreduce({more ? 1.0 : 0.0, failed ? 1.0 : 0.0}, collective::ReduceOp::kMax);
    if (v[0] == 0 || v[1] > 0 || n >= rule.max_steps) return;
    check = rule.nextCheck(n);
  }
}

/// out's samples/s and its interval from its timed steps of `samples_per_step` samples.
void setRates(int64_t samples_per_step, bool decoded, Measurement& out) {
  const auto e = medianEstimate(out.step_seconds);
  const double samples = static_cast<double>(samples_per_step);
  out.timed_steps = e.n;
  // Note [data-bound search]: a loader that cannot keep up delivers in bursts
  // (some steps find a batch ready, the next waits for several), so the median
  // step overstates the rate; with a decoded source the mean step counts too.
  double mean = 0;
  for (const double x : out.step_seconds) mean += x;
  mean /= std::max<std::size_t>(1, out.step_seconds.size());
  const double k = decoded && e.median > 0 ? std::max(1.0, mean / e.median) : 1.0;
  out.samples_per_s = samples / std::max(e.median * k, 1e-9);
  out.sps_low = std::isfinite(e.half_width) ? samples / ((e.median + e.half_width) * k) : 0.0;
  out.sps_high = std::isfinite(e.half_width) && e.median > e.half_width
                     ? samples / ((e.median - e.half_width) * k)
                     : out.samples_per_s * 2;
}

}  // namespace

void timeCandidate(collective::Communicator& comm, const DeviceProbe& probe,
                   const TimingRule& rule, const CandidateRun& run, Measurement& out) {
  probe.resetPeak();
  for (int64_t i = 0; i < run.warm; ++i) run.step(i, out);
  if (run.after_warmup) run.after_warmup();
  bool failed_in_warmup = false;
  if (run.warm > 0) {
    // Note [search warm-up]: whether any rank failed (out of memory, or past its
    // budget) in the untimed steps; then no rank times the candidate.
    markOverBudget(probe, out);
    failed_in_warmup = comm.allreduce(out.fail != FailKind::kNone ? 1.0 : 0.0,
                                      collective::ReduceOp::kMax) > 0;
  }
  if (!failed_in_warmup) timeSteps(comm, probe, rule, run.warm, run, out);
  out.peak_mb = probe.peakMb();
  if (out.fail == FailKind::kNone) setRates(run.samples_per_step, run.decoded, out);
  markOverBudget(probe, out);
}

}  // namespace batchdist::worker
