#include "worker/search/levers.h"

#include <algorithm>
#include <cmath>
#include <map>

#include "common/error.h"

namespace batchdist::worker {

LeverSpace leverSpace(const Levers& configured, int64_t world,
                      const std::string& recompute_unsupported,
                      const std::string& parameters_unsupported) {
  LeverSpace out;
  std::vector<Shard> shards{configured.shard};
  if (configured.shard == Shard::kAuto) {
    shards = {Shard::kNone};
    if (world > 1) {
      shards.push_back(Shard::kOptimizer);
      shards.push_back(Shard::kGradients);
      if (parameters_unsupported.empty()) {
        shards.push_back(Shard::kParameters);
      } else {
        out.notes.push_back(strCat("dist.shard: auto: ", parameters_unsupported,
                                   ": parameters not weighed"));
      }
    } else {
      out.notes.push_back("dist.shard: auto: one rank holds the whole state anyway: none");
    }
  }
  std::vector<Recompute> recomputes{configured.recompute};
  if (configured.recompute == Recompute::kAuto) {
    recomputes = {Recompute::kOff};
    if (recompute_unsupported.empty()) {
      recomputes.push_back(Recompute::kOn);
    } else {
      out.notes.push_back(strCat("model.recompute: auto: ", recompute_unsupported, ": off"));
    }
  }
  out.base = {shards.front(), recomputes.front()};
  // Cheaper in time first: sharding costs an all-gather (and under gradients a
  // reduce-scatter per micro-batch), recompute a forward.
  for (const auto r : recomputes) {
    for (const auto s : shards) out.combinations.push_back({s, r});
  }
  return out;
}

RestFit fitRest(const std::vector<Candidate>& candidates, Recompute recompute) {
  // The largest peak seen at each size (a size measured again keeps its highest).
  std::map<int64_t, double> rest;
  int64_t largest_fit = 0;
  for (const auto& c : candidates) {
    if (c.levers.recompute != recompute || c.peak_mb <= 0) continue;
    // An out-of-memory stopped before its peak: no figure. Over the budget ran whole.
    if (c.failed && c.reason.rfind(toString(FailKind::kOverBudget), 0) != 0) continue;
    auto& v = rest[c.per_gpu];
    v = std::max(v, c.restMb());
    if (!c.failed) largest_fit = std::max(largest_fit, c.per_gpu);
  }
  RestFit fit;
  if (rest.size() < 2) return fit;
  // The two largest, or across the boundary where sizes above it were measured:
  // the largest that fit and the smallest over the budget above it (a peak that
  // grows faster than linearly, as a CPU's resident set can, is then not
  // extrapolated from two sizes far past the boundary).
  auto hi = std::prev(rest.end());
  if (const auto above = rest.upper_bound(largest_fit); largest_fit > 0 && above != rest.end()) {
    hi = above;
  }
  if (hi == rest.begin()) return fit;
  const auto lo = std::prev(hi);
  fit.per_sample_mb = std::max(0.0, (hi->second - lo->second) / static_cast<double>(hi->first - lo->first));
  fit.intercept_mb = hi->second - fit.per_sample_mb * static_cast<double>(hi->first);
  fit.valid = true;
  return fit;
}

int shardSaving(Shard s) {
  switch (s) {
    case Shard::kOptimizer: return 1;
    case Shard::kGradients: return 2;
    case Shard::kParameters: return 3;
    default: return 0;
  }
}

double fixedMbUnder(const MemoryParts& measured, Shard measured_shard, Shard target, int64_t world,
                    double unit_working_mb) {
  if (target == measured_shard) return measured.fixedMb();
  const double w = static_cast<double>(std::max<int64_t>(1, world));
  // Whole again where the measurement was sharded, then split as `target` splits.
  const auto part = [&](double mb, int saved_from) {
    const double whole = shardSaving(measured_shard) >= saved_from ? mb * w : mb;
    return shardSaving(target) >= saved_from ? whole / w : whole;
  };
  // Note [parameter units]: parameters splits them too, and holds the units whole at once.
  const auto working = [&](Shard s) { return shardSaving(s) >= 3 ? unit_working_mb : 0.0; };
  return part(measured.parameters_mb - working(measured_shard), 3) + working(target) +
         part(measured.gradients_mb, 2) + part(measured.optimizer_state_mb, 1);
}

int64_t predictLargest(const RestFit& fit, double fixed_mb, double budget_mb, int64_t lo, int64_t hi,
                       const std::function<bool(int64_t)>& allowed) {
  if (!fit.valid || budget_mb <= 0) return 0;
  const double room = budget_mb - fixed_mb - fit.intercept_mb;
  if (room < 0) return 0;
  int64_t top = hi;
  if (fit.per_sample_mb > 0) {
    const double m = std::floor(room / fit.per_sample_mb);
    if (m < static_cast<double>(hi)) top = static_cast<int64_t>(m);
  }
  constexpr int64_t kMaxScan = int64_t{1} << 20;  // allowed() is dense: a size is near
  for (int64_t m = top; m >= lo && top - m < kMaxScan; --m) {
    if (allowed(m)) return m;
  }
  return 0;
}

}  // namespace batchdist::worker
