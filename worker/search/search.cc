#include "worker/search/search.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "collective/error.h"
#include "worker/common/console.h"
#include "worker/common/util.h"

namespace batchdist::worker {
namespace {

/// Timed steps per rank the re-measuring phase may bring the search up to.
constexpr int64_t kStepBudget = 40;

std::string mb(double v) { return formatFixed(v, 0) + " MB"; }

/// Note [search agreement]: a rank's failure travels as one number, so that one
/// MAX gives the worst kind and, among the ranks with that kind, the lowest rank
/// (an OOM on rank 3 and an error on rank 1 report the error on rank 1).
constexpr double kRankSlots = 1 << 24;
double failureCode(FailKind kind, int rank) {
  if (kind == FailKind::kNone) return -1;
  return static_cast<double>(kind) * kRankSlots + (kRankSlots - 1 - rank);
}
std::pair<FailKind, int> decodeFailure(double code) {
  if (code < 0) return {FailKind::kNone, -1};
  const auto kind = static_cast<int>(code / kRankSlots);
  return {static_cast<FailKind>(kind), static_cast<int>(kRankSlots - 1 - (code - kind * kRankSlots))};
}

}  // namespace

const char* toString(FailKind kind) {
  switch (kind) {
    case FailKind::kNone: return "ok";
    case FailKind::kOverBudget: return "over memory budget";
    case FailKind::kOutOfMemory: return "out of memory";
    case FailKind::kError: return "error";
  }
  return "?";
}

// ---------------------------------------------------------------------------
// Selection.

const Candidate& chooseCandidate(const std::vector<Candidate>& candidates,
                                 Objective objective, double tolerance,
                                 std::string* why) {
  const Candidate* best = nullptr;
  const Candidate* largest = nullptr;
  for (const auto& c : candidates) {
    if (c.failed) continue;
    if (!best || c.global_sps > best->global_sps) best = &c;
    if (!largest || c.per_gpu > largest->per_gpu) largest = &c;
  }
  if (!best) {
    const Candidate* smallest = nullptr;
    for (const auto& c : candidates) {
      if (!smallest || c.per_gpu < smallest->per_gpu) smallest = &c;
    }
    if (!smallest) throw Error("batch search: no candidate was tried (search.min > search.max?)");
    throw Error(strCat("batch search: no per-GPU batch fits; the smallest tried, ",
                       smallest->per_gpu, ", failed: ", smallest->reason, " (peak ",
                       mb(smallest->peak_mb),
                       "). Lower search.min, use a smaller model, fp16/bf16, or more memory "
                       "(search.memory_limit_mb / search.memory_fraction)"));
  }
  if (objective == Objective::kMaxFit) {
    if (why) *why = strCat("the largest per-GPU batch that fits on every rank");
    return *largest;
  }
  const Candidate* pick = best;
  for (const auto& c : candidates) {
    if (!c.failed && c.global_sps >= (1.0 - tolerance) * best->global_sps &&
        c.per_gpu < pick->per_gpu) {
      pick = &c;
    }
  }
  if (why) {
    *why = pick == best
               ? strCat("the highest throughput measured (", formatFixed(best->global_sps, 0),
                        " samples/s)")
               : strCat("the smallest within ", formatFixed(100 * tolerance, 0),
                        " % of the best throughput (", formatFixed(best->global_sps, 0),
                        " samples/s at per-GPU ", best->per_gpu, "): ",
                        formatFixed(pick->global_sps, 0), " samples/s");
  }
  return *pick;
}

// ---------------------------------------------------------------------------
// The walk.

/// Allowed per-GPU sizes. Fixed global batch: divisors of G/W (accumulation
/// derived). Otherwise any size from lo to hi; accumulation as configured.
struct BatchSearch::Space {
  bool fixed_global = false;
  int64_t share = 0;        ///< G / W when the global batch is fixed
  int64_t fixed_accum = 1;
  int64_t lo = 1;
  int64_t hi = 0;
  int64_t multiple_of = 1;

  bool allowed(int64_t m) const {
    if (m < lo || m > hi) return false;
    return fixed_global ? share % m == 0 : true;
  }
  int64_t accumFor(int64_t m) const { return fixed_global ? share / m : fixed_accum; }
  /// The smallest allowed size >= from, or 0.
  int64_t firstAllowedFrom(int64_t from) const {
    if (fixed_global) {
      for (int64_t m = std::max(from, lo); m <= std::min(hi, share); ++m) {
        if (allowed(m)) return m;
      }
      return 0;
    }
    return from <= hi ? std::max(from, lo) : 0;
  }
  /// Allowed sizes strictly between a and b (multiples of search.multiple_of
  /// unless the global batch fixes the divisors).
  std::vector<int64_t> between(int64_t a, int64_t b) const {
    std::vector<int64_t> out;
    for (int64_t m = a + 1; m < b; ++m) {
      if (allowed(m) && (fixed_global || m % multiple_of == 0)) out.push_back(m);
    }
    return out;
  }
};

BatchSearch::BatchSearch(const Config& cfg, collective::Communicator& comm, Measurer& measurer,
                         int64_t train_size, bool has_batchnorm, std::function<bool()> stop_requested)
    : cfg_(cfg),
      comm_(comm),
      measurer_(measurer),
      train_size_(train_size),
      has_bn_(has_batchnorm),
      stop_requested_(std::move(stop_requested)) {}

BatchSearch::Space BatchSearch::space() const {
  const auto& s = cfg_.search;
  const int64_t W = comm_.size();
  constexpr int64_t kUnbounded = std::numeric_limits<int64_t>::max() / 4;
  Space sp;
  sp.fixed_global = cfg_.batch.global > 0 && !cfg_.batch.global_auto;
  if (sp.fixed_global) {
    if (cfg_.batch.global % W != 0) {
      throw ConfigError(strCat(cfg_.source, ": batch.global=", cfg_.batch.global,
                               " is not divisible by world size ", W, "; use ",
                               cfg_.batch.global / W * W, " or ", (cfg_.batch.global / W + 1) * W));
    }
    sp.share = cfg_.batch.global / W;
  }
  sp.fixed_accum = cfg_.batch.accum > 0 ? cfg_.batch.accum : 1;
  // Note [equal shards]: a BatchNorm micro-batch holds at least 2 samples.
  sp.lo = std::max(s.min, has_bn_ ? std::max<int64_t>(2, cfg_.batch.min_per_gpu) : int64_t{1});
  sp.hi = s.max > 0 ? s.max : kUnbounded;
  sp.multiple_of = s.multiple_of;
  // Under drop, a global batch larger than the training set has no step at all.
  if (!sp.fixed_global && cfg_.batch.last_batch == LastBatch::kDrop) {
    sp.hi = std::min(sp.hi, train_size_ / (W * sp.fixed_accum));
  }
  return sp;
}

Candidate BatchSearch::agree(int64_t per_gpu, int64_t accum, const Measurement& m) {
  const int64_t W = comm_.size();
  const bool failed = m.fail != FailKind::kNone;
  const bool stop = stop_requested_ && stop_requested_();
  // One fixed collective per candidate: MAX of [failure, peak, sps, -sps, stop].
  const auto v = comm_.allreduce(
      {failureCode(m.fail, comm_.rank()), m.peak_mb, failed ? 0.0 : m.samples_per_s,
       failed ? -std::numeric_limits<double>::max() / 4 : -m.samples_per_s, stop ? 1.0 : 0.0},
      collective::ReduceOp::kMax);
  Candidate c;
  c.rank_peak_mb = comm_.allgather(m.peak_mb);
  c.per_gpu = per_gpu;
  c.accum = accum;
  c.global = per_gpu * accum * W;
  const auto [kind, rank] = decodeFailure(v[0]);
  c.failed = kind != FailKind::kNone;
  c.peak_mb = v[1];
  if (kind == FailKind::kError) {
    // A real bug, not a size limit: every rank stops; the failing one says what.
    throw TrainingError(strCat("batch search: per-GPU batch ", per_gpu, " failed on rank ", rank,
                               rank == comm_.rank() && !m.detail.empty() ? ": " + m.detail
                                                                         : std::string()));
  }
  if (v[4] > 0) throw SearchStopped(strCat("after per-GPU batch ", per_gpu));
  if (c.failed) {
    c.reason = strCat(toString(kind), " on rank ", rank);
    if (kind == FailKind::kOverBudget) c.reason += strCat(" (peak ", mb(c.peak_mb), " > budget)");
  } else {
    c.max_rank_sps = v[2];
    c.min_rank_sps = -v[3];
    c.global_sps = c.min_rank_sps * W;  // the slowest rank sets the pace
  }
  return c;
}

const Candidate& BatchSearch::measureOne(SearchResult& r, const Space& sp, int64_t m,
                                         Console* console) {
  const int64_t a = sp.accumFor(m);
  // The first candidate also pays for a cold process (allocator, thread pools).
  const auto local =
      measurer_.measure(m, a, r.candidates.empty() ? cfg_.search.warmup_steps + 2 : 0);
  r.timed_steps += local.timed_steps;
  r.candidates.push_back(agree(m, a, local));
  const auto& c = r.candidates.back();
  if (console) {
    console->line(strCat("  per-GPU ", m, " x accum ", a, ": ",
                         c.failed ? "FAILED " + c.reason
                                  : formatFixed(c.global_sps, 0) + " samples/s, peak " +
                                        mb(c.peak_mb)));
  }
  return c;
}

// Phase 1: double from the minimum up to the first failure, the cap, or (for
// the throughput objective) a plateau of two doublings without a gain.
void BatchSearch::doublingPhase(SearchResult& r, const Space& sp, Console* console,
                                int64_t* last_ok, int64_t* first_fail, double* best) {
  int flat = 0;
  for (int64_t m = sp.firstAllowedFrom(sp.lo); m != 0;) {
    const auto& c = measureOne(r, sp, m, console);
    if (c.failed) {
      *first_fail = m;
      return;
    }
    *last_ok = m;
    flat = c.global_sps > *best * (1.0 + cfg_.search.tolerance) ? 0 : flat + 1;
    *best = std::max(*best, c.global_sps);
    if (cfg_.search.objective == Objective::kThroughput && flat >= 2) return;
    if (m > std::numeric_limits<int64_t>::max() / 4) return;
    m = sp.firstAllowedFrom(2 * m);
  }
}

// Phase 2: binary search between the last success and the first failure, if
// the boundary can matter (max_fit, or throughput still rising at last_ok).
void BatchSearch::boundaryPhase(SearchResult& r, const Space& sp, Console* console,
                                int64_t last_ok, int64_t first_fail, double best) {
  if (last_ok == 0 || first_fail == 0) return;
  const Candidate* ok = nullptr;
  for (const auto& c : r.candidates) {
    if (c.per_gpu == last_ok) ok = &c;
  }
  const bool worth = cfg_.search.objective == Objective::kMaxFit ||
                     (ok && ok->global_sps >= (1.0 - cfg_.search.tolerance) * best);
  while (worth) {
    const auto inside = sp.between(last_ok, first_fail);
    if (inside.empty()) return;
    const int64_t mid = inside[inside.size() / 2];
    if (measureOne(r, sp, mid, console).failed) {
      first_fail = mid;
    } else {
      last_ok = mid;
    }
  }
}

// Phase 3 (throughput): the best of several noisy measurements is biased
// upwards, so the contenders near the top are measured once more and their
// two measurements averaged before the rule picks. Bounded by the step budget.
void BatchSearch::remeasurePhase(SearchResult& r, Console* console, double best) {
  const auto& s = cfg_.search;
  std::vector<std::size_t> contenders;
  for (std::size_t i = 0; i < r.candidates.size(); ++i) {
    const auto& c = r.candidates[i];
    if (!c.failed && c.global_sps >= (1.0 - 2 * s.tolerance - 0.1) * best) contenders.push_back(i);
  }
  std::sort(contenders.begin(), contenders.end(), [&](std::size_t a, std::size_t b) {
    return r.candidates[a].global_sps > r.candidates[b].global_sps;
  });
  const int64_t room = (kStepBudget - r.timed_steps) / std::max<int64_t>(1, s.timed_steps);
  contenders.resize(std::min<std::size_t>(
      contenders.size(), std::max<int64_t>(0, std::min<int64_t>(room, 4))));
  if (contenders.size() < 2) return;
  for (auto i : contenders) {
    const int64_t m = r.candidates[i].per_gpu;
    const auto local = measurer_.measure(m, r.candidates[i].accum, 0);
    r.timed_steps += local.timed_steps;
    const auto again = agree(m, r.candidates[i].accum, local);
    auto& c = r.candidates[i];
    if (again.failed) {
      c = again;  // failed now: it does not fit reliably
    } else {
      c.global_sps = 0.5 * (c.global_sps + again.global_sps);
      c.min_rank_sps = std::min(c.min_rank_sps, again.min_rank_sps);
      c.max_rank_sps = std::max(c.max_rank_sps, again.max_rank_sps);
      c.peak_mb = std::max(c.peak_mb, again.peak_mb);
      for (std::size_t k = 0; k < c.rank_peak_mb.size() && k < again.rank_peak_mb.size(); ++k) {
        c.rank_peak_mb[k] = std::max(c.rank_peak_mb[k], again.rank_peak_mb[k]);
      }
      c.measurements = 2;
    }
    if (console) {
      console->line(strCat("  per-GPU ", m, " re-measured: ",
                           c.failed ? "FAILED " + c.reason
                                    : formatFixed(again.global_sps, 0) + " samples/s (mean " +
                                          formatFixed(c.global_sps, 0) + ")"));
    }
  }
}

SearchResult BatchSearch::run(Console* console) {
  const auto& s = cfg_.search;
  const double t0 = monotonicSeconds();
  SearchResult r;
  r.objective = s.objective;
  r.tolerance = s.tolerance;
  r.world_size = comm_.size();
  r.device = measurer_.deviceName();
  for (double b : comm_.allgather(measurer_.memoryBudgetMb())) {
    if (b > 0 && (r.memory_budget_mb == 0 || b < r.memory_budget_mb)) r.memory_budget_mb = b;
  }
  const Space sp = space();
  if (console) {
    console->line(strCat("batch search: ", r.world_size, " rank(s) on ", r.device, ", objective ",
                         toString(s.objective), ", per-GPU from ", sp.lo,
                         sp.fixed_global ? strCat(" dividing ", sp.share, " (batch.global ",
                                                  cfg_.batch.global, ")")
                                         : std::string(),
                         r.memory_budget_mb > 0 ? ", memory budget " + mb(r.memory_budget_mb)
                                                : std::string(", no memory budget")));
  }
  int64_t last_ok = 0;
  int64_t first_fail = 0;
  double best = 0;
  doublingPhase(r, sp, console, &last_ok, &first_fail, &best);
  boundaryPhase(r, sp, console, last_ok, first_fail, best);
  if (s.objective == Objective::kThroughput) remeasurePhase(r, console, best);

  const auto& pick = chooseCandidate(r.candidates, s.objective, s.tolerance, &r.why);
  r.chosen = pick.per_gpu;
  r.chosen_accum = pick.accum;
  r.seconds = monotonicSeconds() - t0;
  return r;
}

}  // namespace batchdist::worker
