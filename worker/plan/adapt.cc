#include "worker/plan/adapt.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <map>

#include "common/error.h"

namespace batchdist::worker {
namespace {

/// 16 x G0, the default ceiling, saturating.
int64_t sixteenTimes(int64_t g0) {
  return g0 > std::numeric_limits<int64_t>::max() / 16 ? std::numeric_limits<int64_t>::max() : 16 * g0;
}

bool known(double b_noise) { return std::isfinite(b_noise) && b_noise > 0; }

/// The measured samples/s of each usable per-GPU batch; a per-GPU batch measured
/// twice keeps its lower figure (the model stays a lower bound) and the larger
/// uncertainty.
std::map<int64_t, double> measured(const AdaptSpace& s, std::map<int64_t, double>* uncertainty = nullptr) {
  std::map<int64_t, double> out;
  for (const auto& p : s.throughput) {
    if (p.per_gpu < s.min_per_gpu || !(p.samples_per_s > 0) || !std::isfinite(p.samples_per_s)) continue;
    if (s.fixed_per_gpu > 0 ? p.per_gpu != s.fixed_per_gpu : p.per_gpu % s.multiple_of != 0) continue;
    const auto [it, fresh] = out.emplace(p.per_gpu, p.samples_per_s);
    if (!fresh) it->second = std::min(it->second, p.samples_per_s);
    if (uncertainty != nullptr) {
      const double u = std::isfinite(p.uncertainty) ? std::max(0.0, p.uncertainty) : 0.0;
      auto& slot = (*uncertainty)[p.per_gpu];
      slot = std::max(slot, u);
    }
  }
  return out;
}

/// Note [goodput], throughput model: samples/s of m x a x W from the rate at a = 1.
double splitRate(const AdaptSpace& s, int64_t m, int64_t a, double sps1) {
  const double rank_batch = static_cast<double>(m) * static_cast<double>(s.world_size);
  const double t1 = rank_batch / sps1;
  const double c = std::clamp(s.fixed_step_s, 0.0, kMaxFixedShare * t1);
  const double t = static_cast<double>(a) * (t1 - c) + c;
  return rank_batch * static_cast<double>(a) / t;
}

/// Four significant digits, for the decision's log line.
std::string formatNumber(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.4g", v);
  return buf;
}

/// The fastest modelled split of global batch `g` among the measured `rates`
/// (Note [goodput], throughput model); on equal samples/s the larger per-GPU batch
/// (fewer micro-batches). samples_per_s 0 when no measured m divides g / W.
AdaptCandidate fastestSplit(const AdaptSpace& s, const std::map<int64_t, double>& rates, int64_t g) {
  AdaptCandidate best;
  if (s.world_size < 1 || g % s.world_size != 0) return best;
  const int64_t rank_batch = g / s.world_size;
  for (auto it = rates.rbegin(); it != rates.rend(); ++it) {  // descending m
    const int64_t m = it->first;
    if (m > rank_batch || rank_batch % m != 0) continue;
    const int64_t a = rank_batch / m;
    const double sps = splitRate(s, m, a, it->second);
    if (sps > best.samples_per_s) {
      best.split = {g, m, a};
      best.samples_per_s = sps;
    }
  }
  return best;
}

/// One rung of batch-size warmup's ladder: G0 x 2^k.
struct Doubling {
  int k = 0;
  int64_t global = 0;
};

/// G0 x 2^k for k = 0, 1, ... up to the ceiling (Note [batch-size warmup]), ascending.
std::vector<Doubling> doublings(const AdaptSpace& s) {
  std::vector<Doubling> out;
  int64_t g = s.g0;
  for (int k = 0; g > 0 && g <= s.ceiling; ++k) {
    out.push_back({k, g});
    if (g > s.ceiling / 2) break;  // the next is past the ceiling (and no overflow)
    g *= 2;
  }
  return out;
}

}  // namespace

std::string splitText(const AdaptSplit& s, int64_t world, int64_t tokens_per_sample) {
  const std::string tokens =
      tokens_per_sample > 0 ? strCat("; ", s.global * tokens_per_sample, " tokens") : "";
  return strCat(s.global, " (", s.per_gpu, " x ", s.accum, " x ", world, tokens, ")");
}

int64_t dataCeiling(int64_t n, int64_t min_steps) {
  if (n <= 0) return 0;
  return n / std::max<int64_t>(1, min_steps);
}

double statisticalEfficiency(double g, double g0, double b_noise) {
  if (!known(b_noise)) return g0 / g;
  return (b_noise + g0) / (b_noise + g);
}

double adascaleGain(double g, double g0, double b_noise) {
  if (!known(b_noise)) return 1.0;
  return g / g0 * statisticalEfficiency(g, g0, b_noise);
}

double relativeUncertainty(double sps, double low, double high) {
  if (!(sps > 0) || !std::isfinite(sps) || !std::isfinite(low) || !std::isfinite(high) ||
      !(high > low) || !(low > 0)) {
    return 0;
  }
  return (high - low) / (2 * sps);
}

double requiredMargin(const AdaptSpace& space, const AdaptSplit& current, const AdaptSplit& best) {
  if (current.per_gpu == best.per_gpu) return space.margin;
  std::map<int64_t, double> u;
  measured(space, &u);
  const double a = u.count(current.per_gpu) ? u.at(current.per_gpu) : 0.0;
  const double b = u.count(best.per_gpu) ? u.at(best.per_gpu) : 0.0;
  return space.margin + std::sqrt(a * a + b * b);
}

double modelledSamplesPerSecond(const AdaptSpace& space, const AdaptSplit& split) {
  if (split.per_gpu <= 0 || split.accum <= 0) return 0;
  const auto rates = measured(space);
  const auto it = rates.find(split.per_gpu);
  return it == rates.end() ? 0.0 : splitRate(space, split.per_gpu, split.accum, it->second);
}

bool isAdaptSplit(const AdaptSpace& s, const AdaptSplit& x) {
  if (x.per_gpu < s.min_per_gpu || x.accum < 1) return false;
  if (s.fixed_per_gpu > 0 ? x.per_gpu != s.fixed_per_gpu : x.per_gpu % s.multiple_of != 0) {
    return false;
  }
  if (x.global != x.per_gpu * x.accum * s.world_size) return false;
  return x.global >= s.g0 && x.global <= s.ceiling;
}

std::vector<AdaptCandidate> adaptCandidates(const AdaptSpace& s, double b_noise) {
  std::vector<AdaptCandidate> out;
  const auto rates = measured(s);
  if (rates.empty() || s.world_size < 1) return out;
  const int64_t w = s.world_size;
  const int64_t first = (s.g0 + w - 1) / w * w;
  for (int64_t g = first; g <= s.ceiling; g += w) {
    AdaptCandidate best = fastestSplit(s, rates, g);
    if (best.samples_per_s <= 0) continue;
    best.efficiency = statisticalEfficiency(static_cast<double>(g), static_cast<double>(s.g0), b_noise);
    best.goodput = best.samples_per_s * best.efficiency;
    out.push_back(best);
  }
  return out;
}

namespace {

/// Both rules' start: a decision that keeps `current`, with its reason already
/// given (non-empty `why`) while the noise scale is not known.
AdaptDecision keepUnlessKnown(const AdaptSpace& s, const AdaptSplit& current, double b_noise) {
  AdaptDecision d;
  d.current = current;
  d.chosen = current;
  if (!known(b_noise)) {
    d.why = strCat("global batch stays ", splitText(current, s.world_size, s.tokens_per_sample),
                   ": the gradient noise scale is not known yet");
  }
  return d;
}

}  // namespace

AdaptDecision decideGlobalBatch(const AdaptSpace& s, const AdaptSplit& current, double b_noise) {
  AdaptDecision d = keepUnlessKnown(s, current, b_noise);
  if (!d.why.empty()) return d;
  const auto text = [&](const AdaptSplit& x) { return splitText(x, s.world_size, s.tokens_per_sample); };
  const double cur_sps = modelledSamplesPerSecond(s, current);
  if (cur_sps <= 0) {
    d.why = strCat("global batch stays ", text(current),
                   ": no measured samples/s for per-GPU batch ", current.per_gpu);
    return d;
  }
  d.current_goodput = cur_sps * statisticalEfficiency(static_cast<double>(current.global),
                                                      static_cast<double>(s.g0), b_noise);
  const auto candidates = adaptCandidates(s, b_noise);
  const AdaptCandidate* best = nullptr;
  for (const auto& c : candidates) {  // ascending G, strictly better: ties keep the smaller G
    if (best == nullptr || c.goodput > best->goodput) best = &c;
  }
  if (best == nullptr) {
    d.why = strCat("global batch stays ", text(current),
                   ": no measured split in [", s.g0, ", ", s.ceiling, "]");
    return d;
  }
  d.chosen_goodput = best->goodput;
  d.gain = best->goodput / d.current_goodput;
  const std::string figures =
      strCat("B_simple ", formatNumber(b_noise), ", goodput ", formatNumber(best->goodput),
             " vs ", formatNumber(d.current_goodput), " (x", formatNumber(d.gain), ")");
  if (!isAdaptSplit(s, current)) {
    d.chosen = best->split;
    d.change = d.chosen != current;
    d.why = strCat("global batch ", text(current), " -> ", text(d.chosen),
                   ": the current split is outside [", s.g0, ", ", s.ceiling, "]; ", figures);
    return d;
  }
  const double margin = requiredMargin(s, current, best->split);
  if (best->split != current && best->goodput > d.current_goodput * (1.0 + margin)) {
    d.chosen = best->split;
    d.change = true;
    d.why = strCat("global batch ", text(current), " -> ", text(d.chosen), ": ", figures);
  } else {
    const std::string parts =
        margin > s.margin ? strCat(" (", formatNumber(100 * s.margin), " % + ",
                                   formatNumber(100 * (margin - s.margin)),
                                   " % the samples/s figures' uncertainty)")
                          : std::string();
    d.why = strCat("global batch stays ", text(current), ": best ", text(best->split),
                   " is within the ", formatNumber(100 * margin), " % margin", parts, "; ", figures);
  }
  return d;
}

std::optional<AdaptSplit> warmupSplit(const AdaptSpace& s, int64_t g, const AdaptSplit& current,
                                      bool* modelled) {
  if (modelled != nullptr) *modelled = false;
  if (s.world_size < 1 || g % s.world_size != 0) return std::nullopt;
  const auto best = fastestSplit(s, measured(s), g);
  if (best.samples_per_s > 0 && isAdaptSplit(s, best.split)) {
    if (modelled != nullptr) *modelled = true;
    return best.split;
  }
  // No figures: the per-GPU batch in force fits in memory; else the largest valid
  // m below it (a larger one is not known to fit: Note [oom back-off]).
  const int64_t rank_batch = g / s.world_size;
  const auto with = [&](int64_t m) { return AdaptSplit{g, m, rank_batch / m}; };
  const auto valid = [&](int64_t m) {
    return m > 0 && rank_batch % m == 0 && (current.per_gpu <= 0 || m <= current.per_gpu) &&
           isAdaptSplit(s, with(m));
  };
  if (valid(current.per_gpu)) return with(current.per_gpu);
  std::optional<AdaptSplit> out;
  for (int64_t f = 1; f * f <= rank_batch; ++f) {  // the divisors of G / W, in pairs
    if (rank_batch % f != 0) continue;
    for (const int64_t m : {rank_batch / f, f}) {
      if (valid(m) && (!out || m > out->per_gpu)) out = with(m);
    }
  }
  return out;
}

namespace {

/// Note [batch-size warmup]: the largest doubling of G0 within B that splits, at or
/// above `current`'s G (at it only when the split in force is not valid).
std::optional<AdaptSplit> warmupTarget(const AdaptSpace& s, const AdaptSplit& current,
                                       double b_noise, bool valid, Doubling* rung,
                                       bool* modelled) {
  std::optional<AdaptSplit> to;
  for (const auto& x : doublings(s)) {
    if (static_cast<double>(x.global) > b_noise) break;
    if (x.global < current.global || (x.global == current.global && valid)) continue;
    bool m = false;
    if (auto split = warmupSplit(s, x.global, current, &m)) {
      to = split;
      *rung = x;
      *modelled = m;
    }
  }
  return to;
}

/// A split in force that is no longer valid, with no doubling within B above it:
/// its G on a valid split, else the largest doubling below it that splits.
std::optional<AdaptSplit> warmupRepair(const AdaptSpace& s, const AdaptSplit& current) {
  if (current.global >= s.g0 && current.global <= s.ceiling) {
    if (auto split = warmupSplit(s, current.global, current)) return split;
  }
  std::optional<AdaptSplit> out;
  for (const auto& x : doublings(s)) {
    if (x.global > current.global) break;
    if (auto split = warmupSplit(s, x.global, current)) out = split;
  }
  return out;
}

/// Why batch-size warmup keeps `current` though B is known.
std::string warmupStays(const AdaptSpace& s, const AdaptSplit& current, double b_noise) {
  const std::string head =
      strCat("global batch stays ", splitText(current, s.world_size, s.tokens_per_sample),
             ": B_simple ", formatNumber(b_noise));
  for (const auto& x : doublings(s)) {
    if (x.global <= current.global) continue;
    if (static_cast<double>(x.global) > b_noise) {
      return strCat(head, " < ", x.global, " = G0 x 2^", x.k, ", the next doubling");
    }
    return strCat(head, " reaches ", x.global, " = G0 x 2^", x.k, ", which has no valid split");
  }
  return strCat(head, "; no doubling of G0 = ", s.g0, " above it within the ceiling ", s.ceiling);
}

}  // namespace

AdaptDecision decideWarmupBatch(const AdaptSpace& s, const AdaptSplit& current, double b_noise) {
  AdaptDecision d = keepUnlessKnown(s, current, b_noise);
  if (!d.why.empty()) return d;
  const auto text = [&](const AdaptSplit& x) { return splitText(x, s.world_size, s.tokens_per_sample); };
  const bool valid = isAdaptSplit(s, current);
  Doubling rung;
  bool modelled = false;
  auto to = warmupTarget(s, current, b_noise, valid, &rung, &modelled);
  std::string reason;
  if (to) {
    const double sps = modelled ? modelledSamplesPerSecond(s, *to) : 0.0;
    reason = strCat("B_simple ", formatNumber(b_noise), " >= ", rung.global, " = G0 x 2^", rung.k,
                    " (batch-size warmup); ",
                    modelled ? strCat("its fastest modelled split, ", formatNumber(sps), " samples/s")
                             : std::string("no samples/s figure for its per-GPU batches"));
  } else if (!valid && (to = warmupRepair(s, current))) {
    reason = strCat("the current split is outside the valid splits of [", s.g0, ", ", s.ceiling,
                    "]; B_simple ", formatNumber(b_noise));
  }
  if (!to) {
    d.why = warmupStays(s, current, b_noise);
    if (!valid) d.why += "; the split in force is not valid, and no valid split was found";
    return d;
  }
  d.chosen = *to;
  d.change = true;
  d.why = strCat("global batch ", text(current), " -> ", text(d.chosen), ": ", reason);
  return d;
}

AdaptDecision decideAdaptive(const AdaptSpace& s, const AdaptSplit& current, double b_noise) {
  return s.mode == BatchAdapt::kWarmup ? decideWarmupBatch(s, current, b_noise)
                                       : decideGlobalBatch(s, current, b_noise);
}

std::optional<AdaptSplit> resumeSplit(const AdaptSpace& s, int64_t g, double b_noise) {
  // Warmup: G on a valid split, else the largest doubling below it that splits;
  // never above G (the next decision grows it, from B).
  if (s.mode == BatchAdapt::kWarmup) return warmupRepair(s, {g, 0, 0});
  const auto candidates = adaptCandidates(s, b_noise);
  const AdaptCandidate* pick = nullptr;
  for (const auto& c : candidates) {
    if (c.split.global == g) return c.split;
    if (pick == nullptr || c.goodput > pick->goodput) pick = &c;
  }
  if (pick == nullptr) return std::nullopt;
  return pick->split;
}

AdaptSpace adaptSpace(const Config& cfg, const Plan& p, bool has_batchnorm) {
  AdaptSpace s;
  s.world_size = p.world_size;
  s.g0 = p.global;
  s.dataset_size = p.dataset_size;
  s.min_steps = cfg.batch.adapt_min_steps;
  s.min_per_gpu = minPerGpu(cfg, has_batchnorm);
  if (cfg.batch.per_gpu_auto) {
    s.multiple_of = cfg.search.multiple_of;
  } else if (cfg.batch.per_gpu > 0) {
    s.fixed_per_gpu = p.per_gpu;
  }
  s.adapt_max = cfg.batch.adapt_max > 0 ? cfg.batch.adapt_max : sixteenTimes(p.global);
  if (cfg.batch.adapt != BatchAdapt::kOff) s.mode = cfg.batch.adapt;
  s.tokens_per_sample = p.tokens_per_sample;
  checkAdaptReachable(s, cfg.source);
  return s;
}

void checkAdaptReachable(AdaptSpace& s, const std::string& source) {
  const int64_t w = s.world_size;
  if (s.adapt_max < s.g0) {
    throw ConfigError(strCat(source, ": batch.adapt_max=", s.adapt_max,
                             " is below the starting global batch G0=", s.g0,
                             " (batch.global); raise it above ", s.g0,
                             ", or set 0 for 16 x G0 = ", sixteenTimes(s.g0)));
  }
  const int64_t limit = dataCeiling(s.dataset_size, s.min_steps);
  if (s.g0 > limit) {
    throw ConfigError(strCat(source, ": batch.adapt: ", toString(s.mode),
                             ": the starting global batch G0=", s.g0,
                             " already leaves ", s.dataset_size / s.g0, " step(s) an epoch of the ",
                             s.dataset_size, " training samples, fewer than batch.adapt_min_steps=",
                             s.min_steps, ", so no larger batch is allowed; lower "
                             "batch.adapt_min_steps to ", std::max<int64_t>(1, s.dataset_size / s.g0),
                             ", lower batch.global, or use batch.adapt: off"));
  }
  s.ceiling = std::min(s.adapt_max, limit);
  if (s.adapt_max > limit) {
    s.warnings.push_back(strCat("batch.adapt_max=", s.adapt_max, " is more than the ",
                                s.dataset_size, " training samples allow with batch.adapt_min_steps=",
                                s.min_steps, " steps an epoch; the global batch stays at or below ",
                                s.dataset_size, " / ", s.min_steps, " = ", limit));
  }
  // The smallest equal-shard G above G0 (throughput aside: the search has not run yet).
  const int64_t unit = s.fixed_per_gpu > 0 ? s.fixed_per_gpu * w : s.multiple_of * w;
  int64_t next = (s.g0 / unit + 1) * unit;
  while (s.fixed_per_gpu == 0 && next / w < s.min_per_gpu) next += unit;
  if (next > s.ceiling) {
    const std::string rule =
        s.fixed_per_gpu > 0
            ? strCat("batch.per_gpu ", s.fixed_per_gpu, " x accumulation x world size ", w)
            : strCat("per-GPU batch (a multiple of ", s.multiple_of, ", at least ", s.min_per_gpu,
                     ") x accumulation x world size ", w);
    const std::string by_data =
        s.ceiling < s.adapt_max
            ? strCat(" (the ", s.dataset_size, " training samples cap it at ", limit,
                     " for batch.adapt_min_steps=", s.min_steps, "; lower that to ",
                     std::max<int64_t>(1, s.dataset_size / next), " to reach ", next, ")")
            : "";
    throw ConfigError(strCat(source, ": batch.adapt: ", toString(s.mode),
                             " has nothing to adapt: no global batch in (",
                             s.g0, ", ", s.ceiling, "]", by_data, " is ", rule,
                             "; the nearest above G0=", s.g0, " is ", next, " (", next / w,
                             " per rank); raise batch.adapt_max to at least ", next,
                             " or use batch.adapt: off"));
  }
}

double adaptProgress(const std::vector<AdaptSegment>& h, int64_t steps) {
  if (h.empty()) return static_cast<double>(std::max<int64_t>(0, steps));
  if (h.front().begin_step != 0) {
    throw Error(strCat("adaptive batch history starts at step ", h.front().begin_step,
                       ", not 0"));
  }
  double progress = 0;
  for (std::size_t i = 0; i < h.size(); ++i) {
    if (i + 1 < h.size() && h[i + 1].begin_step <= h[i].begin_step) {
      throw Error(strCat("adaptive batch history is not in step order: segment ", i + 1,
                         " begins at step ", h[i + 1].begin_step, ", segment ", i, " at ",
                         h[i].begin_step));
    }
    const int64_t end = std::min(steps, i + 1 < h.size() ? h[i + 1].begin_step : steps);
    if (end > h[i].begin_step) progress += h[i].gain * static_cast<double>(end - h[i].begin_step);
  }
  return progress;
}

double stepGain(AdaptGain rule, double g, double g0, double b_noise) {
  return rule == AdaptGain::kLinear ? g / g0 : adascaleGain(g, g0, b_noise);
}

double adaptLr(const Plan& p, OptimName optimizer, AdaptGain rule, double progress, int64_t g,
               double b_noise) {
  const double base = p.lrAtProgress(progress);
  const double gd = static_cast<double>(g), g0 = static_cast<double>(p.global);
  if (optimizer == OptimName::kAdamw) return base * std::sqrt(gd / g0);
  return base * stepGain(rule, gd, g0, b_noise);
}

}  // namespace batchdist::worker
