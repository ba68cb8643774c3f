#pragma once
// A Measurer with a chosen out-of-memory threshold and throughput curve, so tests
// can give every rank its own limits (the real one is exercised end to end).

#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "worker/search/search.h"

namespace batchdist::testsupport {

class SimulatedMeasurer : public worker::Measurer {
 public:
  /// Fails (out of memory) above `oom_above`; samples/s = peak * m / (m + half),
  /// a curve that saturates; memory = base + per_sample * m (MB).
  SimulatedMeasurer(int64_t oom_above, double peak_sps, double half, double base_mb = 100,
                    double per_sample_mb = 1, double budget_mb = 0, double noise = 0)
      : oom_above_(oom_above), peak_(peak_sps), half_(half), base_(base_mb),
        per_sample_(per_sample_mb), budget_(budget_mb), noise_(noise) {}

  /// From per-GPU batch `per_gpu` up, this rank fails with `kind` (kError: a
  /// real fault, with a detail naming this measurer).
  SimulatedMeasurer& failFrom(int64_t per_gpu, worker::FailKind kind) {
    fail_from_ = per_gpu;
    fail_kind_ = kind;
    return *this;
  }

  /// The memory levers (Note [lever search]): parameters and gradients of
  /// `params_mb` each and optimizer state of `state_mb` (1/`world` of it under
  /// dist.shard: optimizer, and of the gradients too under gradients) add to the
  /// base; recompute keeps `recompute_keep` of the per-sample memory and costs
  /// `recompute_cost` of the samples/s, sharding `shard_cost` (twice that under
  /// gradients); the memory budget decides what fits.
  SimulatedMeasurer& withLevers(double params_mb, double state_mb, int64_t world, double recompute_keep,
                                double recompute_cost, double shard_cost) {
    params_ = params_mb;
    state_ = state_mb;
    world_ = world;
    keep_ = recompute_keep;
    recompute_cost_ = recompute_cost;
    shard_cost_ = shard_cost;
    return *this;
  }
  /// dist.shard: parameters weighed: it keeps 1/`world` of the parameters and
  /// `working_mb` whole (the units at once), and costs 3 x `shard_cost`.
  SimulatedMeasurer& withParameterUnits(double working_mb) {
    working_ = working_mb;
    units_ = true;
    return *this;
  }
  std::string recomputeUnsupported() const override { return recompute_unsupported; }
  std::string parametersUnsupported() const override {
    return units_ ? "" : "the simulated model has no parameter units";
  }
  double unitWorkingMb() const override { return working_; }

  worker::Measurement measure(int64_t per_gpu, int64_t accum, const worker::Levers& levers,
                              const worker::TimingRule& rule, int64_t extra_warmup) override {
    (void)extra_warmup;
    (void)rule;
    ++calls;
    seen.push_back({per_gpu, levers});
    worker::Measurement m;
    const bool sharded = levers.shard != worker::Shard::kNone;
    const bool units = levers.shard == worker::Shard::kParameters;
    const bool grads = levers.shard == worker::Shard::kGradients || units;
    const bool recompute = levers.recompute == worker::Recompute::kOn;
    const double w = static_cast<double>(world_);
    m.parts = {units ? params_ / w + working_ : params_, grads ? params_ / w : params_,
               sharded ? state_ / w : state_};
    m.peak_mb = base_ + m.parts.fixedMb() +
                per_sample_ * (recompute ? keep_ : 1.0) * static_cast<double>(per_gpu);
    if (fail_from_ > 0 && per_gpu >= fail_from_) {
      m.fail = fail_kind_;
      if (fail_kind_ == worker::FailKind::kError) m.detail = "simulated fault";
      return m;
    }
    if (per_gpu > oom_above_) {
      m.fail = worker::FailKind::kOutOfMemory;
      return m;
    }
    // Deterministic "noise": a fixed wiggle per size.
    const double wiggle = 1.0 + noise_ * std::sin(static_cast<double>(per_gpu) * 12.9898);
    m.samples_per_s = peak_ * per_gpu / (per_gpu + half_) * wiggle *
                      (recompute ? 1 - recompute_cost_ : 1.0) *
                      (sharded ? 1 - (units ? 3 : grads ? 2 : 1) * shard_cost_ : 1.0);
    m.sps_low = 0.99 * m.samples_per_s;
    m.sps_high = 1.01 * m.samples_per_s;
    m.timed_steps = 3;
    if (budget_ > 0 && m.peak_mb > budget_) m.fail = worker::FailKind::kOverBudget;
    (void)accum;
    return m;
  }
  double memoryBudgetMb() const override { return budget_; }
  std::string deviceName() const override { return "simulated"; }

  int calls = 0;
  std::vector<std::pair<int64_t, worker::Levers>> seen;  ///< every measure()'s size and levers
  std::string recompute_unsupported;

 private:
  double params_ = 0, state_ = 0, keep_ = 1, recompute_cost_ = 0, shard_cost_ = 0, working_ = 0;
  bool units_ = false;
  int64_t world_ = 1;
  int64_t oom_above_;
  double peak_, half_, base_, per_sample_, budget_, noise_;
  int64_t fail_from_ = 0;
  worker::FailKind fail_kind_ = worker::FailKind::kNone;
};

}  // namespace batchdist::testsupport
