#include "worker/search/search.h"


#include <algorithm>
#include <cmath>
#include <limits>

#include "common/error.h"
#include "worker/common/console.h"
#include "worker/common/util.h"
#include "worker/plan/adapt.h"
#include "worker/plan/plan.h"
#include "worker/search/levers.h"

namespace batchdist::worker {
namespace {

/// At most this many contenders are re-measured in interleaved rounds.
constexpr std::size_t kMaxContenders = 4;
/// How far a first measurement may have been off and still be re-measured.
constexpr double kLuckMargin = 0.15;
/// A first measurement at least this share of the best's contends (is re-measured
/// in the interleaved rounds, Note [interleaved comparison]).
double contenderReach(double tolerance) { return 1.0 - 2 * tolerance - kLuckMargin; }
/// Note [search warm-up]: the first candidate's extra untimed steps.
constexpr int64_t kColdWarmup = 1;

std::string mb(double v) { return formatFixed(v, 0) + " MB"; }

/// "low..high, " of a candidate's 95 % interval; "" when its steps were too few
/// for one (Note [adaptive timing]: two slow steps).
std::string intervalText(const Candidate& c) {
  if (c.sps_low <= 0) return "";
  return strCat(formatFixed(c.sps_low, 0), "..", formatFixed(c.sps_high, 0), ", ");
}

/// "156 samples/s"; on token data (Note [tokens per sample] in worker/plan/plan.h)
/// "156 samples/s, 9970 tokens/s", as the search's lines give the tokens.
std::string rateText(double sps, int64_t tokens_per_sample) {
  if (tokens_per_sample <= 0) return strCat(formatFixed(sps, 0), " samples/s");
  return strCat(formatFixed(sps, 0), " samples/s, ",
                formatFixed(sps * static_cast<double>(tokens_per_sample), 0), " tokens/s");
}

}  // namespace

/// Note [search agreement]: a rank's failure travels as one number, so that one
/// MAX gives the worst kind and, among the ranks with that kind, the lowest rank
/// (an OOM on rank 3 and an error on rank 1 report the error on rank 1). It
/// travels in a double allreduce: kind x 2^24 + rank slot stays below 2^27, far
/// inside a double's 53 exact bits, for any rank below 2^24.
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
// Timing (Note [adaptive timing]).

TimingRule TimingRule::fromConfig(const SearchConfig& s) {
  TimingRule t;
  t.min_steps = s.timed_steps;
  t.max_steps = s.max_steps;
  t.min_time_s = s.min_time_s;
  t.max_time_s = s.max_time_s;
  t.target = s.tolerance / 3;
  return t;
}

bool TimingRule::wantsMore(int64_t n, double elapsed, const MedianEstimate& e) const {
  if (n >= max_steps) return false;
  // Slow steps: min_steps yields to max_time_s once a spread can be seen.
  if (n < min_steps && (n < kSlowStepFloor || elapsed < max_time_s)) return true;
  if (elapsed < min_time_s) return true;
  return elapsed < max_time_s && e.relative() > target;
}

int64_t TimingRule::nextCheck(int64_t n) const {
  int64_t next = n + std::max<int64_t>(1, n / 2);
  if (n < min_steps) next = n < kSlowStepFloor ? std::min(kSlowStepFloor, min_steps) : min_steps;
  return std::min(next, max_steps);
}

// ---------------------------------------------------------------------------
// Selection.

double relativeThroughput(const Candidate& c, const Candidate& best, bool conservative) {
  if (&c == &best) return 1.0;
  if (!c.round_sps.empty() && c.round_sps.size() == best.round_sps.size()) {
    std::vector<double> ratios;
    for (std::size_t i = 0; i < c.round_sps.size(); ++i) {
      ratios.push_back(best.round_sps[i] > 0 ? c.round_sps[i] / best.round_sps[i] : 0.0);
    }
    if (conservative) return *std::min_element(ratios.begin(), ratios.end());
    return median(std::move(ratios));
  }
  return best.global_sps > 0 ? c.global_sps / best.global_sps : 0.0;
}

/// A chosen candidate waiting for data this share of its step time is data-bound.
constexpr double kDataBoundWait = 0.2;

static std::string ruleText(Objective objective, double tolerance, int64_t rounds) {
  if (objective == Objective::kMaxFit) return "max_fit: the largest per-GPU batch that fits";
  return strCat("throughput: the smallest per-GPU batch whose samples/s is at least ",
                formatFixed(100 * (1 - tolerance), 0), " % of the best's",
                rounds > 0 ? strCat(" in every one of ", rounds,
                                    " interleaved rounds (the lowest per-round ratio decides)")
                           : std::string());
}


bool isChosen(const SearchResult& r, const Candidate& c) {
  return c.per_gpu == r.chosen && c.accum == r.chosen_accum && c.levers == r.chosen_levers;
}

namespace {

/// The rule's order among candidates that qualify: the smaller per-GPU batch,
/// and of one size (under other levers: Note [lever search]) the smaller peak.
bool smallerThan(const Candidate& a, const Candidate& b) {
  return a.per_gpu != b.per_gpu ? a.per_gpu < b.per_gpu : a.peak_mb < b.peak_mb;
}

/// ", under shard optimizer + recompute" when the candidates ran under several levers.
std::string leversClause(const std::vector<Candidate>& candidates, const Candidate& pick) {
  for (const auto& c : candidates) {
    if (c.levers != pick.levers) return strCat(", under ", leversText(pick.levers));
  }
  return "";
}

}  // namespace

bool comparedInRounds(const std::vector<Candidate>& candidates, const Candidate& c) {
  if (c.failed) return false;
  const auto paired = [](const Candidate& k) { return !k.failed && !k.round_sps.empty(); };
  return paired(c) || std::none_of(candidates.begin(), candidates.end(), paired);
}

const Candidate* bestCompared(const std::vector<Candidate>& candidates) {
  const Candidate* best = nullptr;
  for (const auto& c : candidates) {
    if (comparedInRounds(candidates, c) && (!best || c.global_sps > best->global_sps)) best = &c;
  }
  return best;
}

const Candidate& chooseCandidate(const std::vector<Candidate>& candidates,
                                 Objective objective, double tolerance,
                                 std::string* why, int64_t tokens_per_sample) {
  const Candidate* best = bestCompared(candidates);
  const Candidate* largest = nullptr;
  for (const auto& c : candidates) {
    if (c.failed) continue;
    if (!largest || c.per_gpu > largest->per_gpu ||
        (c.per_gpu == largest->per_gpu && c.peak_mb < largest->peak_mb)) {
      largest = &c;
    }
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
    if (why) {
      *why = strCat("the largest per-GPU batch that fits on every rank",
                    leversClause(candidates, *largest));
    }
    return *largest;
  }
  const Candidate* pick = best;
  for (const auto& c : candidates) {
    if (comparedInRounds(candidates, c) &&
        relativeThroughput(c, *best, /*conservative=*/true) >= 1.0 - tolerance &&
        smallerThan(c, *pick)) {
      pick = &c;
    }
  }
  if (why) {
    const auto rate = [&](const Candidate& c) { return rateText(c.global_sps, tokens_per_sample); };
    *why = pick == best
               ? strCat("the highest throughput measured (", rate(*best), ")")
               : strCat("the smallest within ", formatFixed(100 * tolerance, 0),
                        " % of the best throughput (", rate(*best), " at per-GPU ", best->per_gpu,
                        "): ", rate(*pick), ", ",
                        formatFixed(100 * relativeThroughput(*pick, *best), 1), " % of it");
    *why += leversClause(candidates, *pick);
  }
  return *pick;
}

void explainChoice(SearchResult& r) {
  std::string why;
  const auto& pick = chooseCandidate(r.candidates, r.objective, r.tolerance, &why,
                                     r.tokens_per_sample);
  if (isChosen(r, pick)) r.why = why;
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
  bool steps_capped = false;  ///< hi comes from batch.adapt_min_steps (auto global batch)

  bool allowed(int64_t m) const {
    if (m < lo || m > hi) return false;
    return fixed_global ? share % m == 0 : true;
  }
  int64_t accumFor(int64_t m) const { return fixed_global ? share / m : fixed_accum; }
  /// `x` rounded down to a multiple of search.multiple_of.
  int64_t roundDown(int64_t x) const {
    const int64_t unit = std::max<int64_t>(1, multiple_of);
    return x / unit * unit;
  }
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
  /// The walk's next size after `m`: the first allowed from 2m; past the bound
  /// (search.max, the data's: not a failure), the bound itself last, in
  /// multiples of search.multiple_of, so that the largest size allowed is tried.
  int64_t nextDoubling(int64_t m) const {
    const int64_t next = firstAllowedFrom(2 * m);
    if (next != 0 || fixed_global) return next;
    const int64_t top = roundDown(hi);
    return top > m && allowed(top) ? top : 0;
  }
  /// The sizes the search may measure: allowed, and multiples of search.multiple_of
  /// unless the global batch fixes the divisors (the lever search's predictions).
  bool searchable(int64_t m) const {
    return allowed(m) && (fixed_global || m % std::max<int64_t>(1, multiple_of) == 0);
  }
  /// The largest size allowed.
  int64_t top() const { return fixed_global ? std::min(hi, share) : hi; }
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
  sp.lo = std::max(s.min, minPerGpu(cfg_, has_bn_));
  sp.hi = s.max > 0 ? s.max : kUnbounded;
  sp.multiple_of = s.multiple_of;
  if (!sp.fixed_global) {
    // The search picks the global batch too (m x a x W): not one that leaves an
    // epoch fewer than batch.adapt_min_steps steps (the adaptive batch's ceiling,
    // dataCeiling), unless the data is too small for even the smallest size.
    const int64_t rank_share = W * sp.fixed_accum;
    const int64_t steps_cap = dataCeiling(train_size_, cfg_.batch.adapt_min_steps) / rank_share;
    if (train_size_ > 0 && steps_cap < sp.hi) {
      sp.hi = std::max(sp.lo, steps_cap);
      sp.steps_capped = true;
    }
    // Under drop, a global batch larger than the training set has no step at all.
    if (cfg_.batch.last_batch == LastBatch::kDrop) {
      sp.hi = std::min(sp.hi, train_size_ / rank_share);
    }
  }
  return sp;
}

Candidate BatchSearch::agree(int64_t per_gpu, int64_t accum, const Levers& levers,
                             const Measurement& m) {
  const int64_t W = comm_.size();
  const bool failed = m.fail != FailKind::kNone;
  const bool stop = stop_requested_ && stop_requested_();
  // One fixed collective per candidate: MAX of [failure, peak, sps, -sps, stop,
  // -low, -high] (the interval's ends: the lowest over the ranks).
  constexpr double kNone = -std::numeric_limits<double>::max() / 4;
  const auto v = comm_.allreduce(
      {failureCode(m.fail, comm_.rank()), m.peak_mb, failed ? 0.0 : m.samples_per_s,
       failed ? kNone : -m.samples_per_s, stop ? 1.0 : 0.0, failed ? kNone : -m.sps_low,
       failed ? kNone : -m.sps_high, failed ? 0.0 : m.data_wait_fraction, m.parts.parameters_mb,
       m.parts.gradients_mb, m.parts.optimizer_state_mb},
      collective::ReduceOp::kMax);
  Candidate c;
  c.rank_peak_mb = comm_.allgather(m.peak_mb);
  c.per_gpu = per_gpu;
  c.accum = accum;
  c.levers = levers;
  c.parts = {v[8], v[9], v[10]};
  if (comm_.rank() == 0) c.trace = m.trace;
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
  if (v[4] > 0) throw SearchStopped(per_gpu);
  if (c.failed) {
    c.reason = strCat(toString(kind), " on rank ", rank);
    if (kind == FailKind::kOverBudget) c.reason += strCat(" (peak ", mb(c.peak_mb), " > budget)");
  } else {
    c.max_rank_sps = v[2];
    c.min_rank_sps = -v[3];
    c.global_sps = c.min_rank_sps * W;  // the slowest rank sets the pace
    c.sps_low = -v[5] * W;
    c.sps_high = -v[6] * W;
    c.timed_steps = m.timed_steps;
    c.data_wait = v[7];
    if (comm_.rank() == 0) c.step_seconds = m.step_seconds;  // rank 0 writes search.json
  }
  return c;
}

const Candidate& BatchSearch::measureOne(SearchResult& r, const Space& sp, int64_t m,
                                         Console* console, bool adapt_range, const Levers* levers) {
  const int64_t a = adapt_range ? 1 : sp.accumFor(m);
  const Levers& under = levers ? *levers : base_;
  // Note [search warm-up]: the first candidate also pays for a cold process.
  const auto local = measurer_.measure(m, a, under, TimingRule::fromConfig(cfg_.search),
                                       r.candidates.empty() ? kColdWarmup : 0);
  r.timed_steps += local.timed_steps;
  auto& into = adapt_range ? r.adapt_range : r.candidates;
  into.push_back(agree(m, a, under, local));
  const auto& c = into.back();
  if (console) {
    const std::string tokens =
        r.tokens_per_sample > 0
            ? strCat(", ", formatFixed(c.global_sps * static_cast<double>(r.tokens_per_sample), 0),
                     " tokens/s")
            : std::string();
    console->line(strCat("  per-GPU ", m, " x accum ", a,
                         configLevers(cfg_) != base_ || levers ? strCat(" [", leversText(under), "]")
                                                               : std::string(),
                         ": ",
                         c.failed ? "FAILED " + c.reason
                                  : strCat(formatFixed(c.global_sps, 0), " samples/s (",
                                           intervalText(c), c.timed_steps, " steps)", tokens,
                                           ", peak ", mb(c.peak_mb))));
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
    m = sp.nextDoubling(m);
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

namespace {

/// A size that ran before failed when measured again: it does not fit reliably.
void failedAgain(Candidate& c, const Candidate& again) {
  c.failed = true;
  c.reason = again.reason + " (when measured again)";
  c.peak_mb = std::max(c.peak_mb, again.peak_mb);
}

/// The order of one interleaved round (Note [interleaved comparison]). Under
/// one set of levers rotated each round: A B C, B C A, C A B. Under several, the
/// contenders grouped by levers (a change of levers rebuilds the update strategy
/// and warms it up again: Note [lever switch]), the groups in the order of their
/// first contender and each group by size, and every other round the whole order
/// reversed (A B C, C B A, A B C: a round starts with the levers the last one
/// ended with, and a drift within rounds reaches both ends).
std::vector<std::size_t> roundOrder(const std::vector<Candidate>& candidates,
                                    const std::vector<std::size_t>& alive, int64_t round) {
  std::vector<std::size_t> order;
  const bool one_group = std::all_of(alive.begin(), alive.end(), [&](std::size_t i) {
    return candidates[i].levers == candidates[alive.front()].levers;
  });
  if (one_group) {
    for (std::size_t k = 0; k < alive.size(); ++k) {
      order.push_back(alive[(k + static_cast<std::size_t>(round)) % alive.size()]);
    }
    return order;
  }
  for (std::size_t k = 0; k < alive.size(); ++k) {
    const Levers& levers = candidates[alive[k]].levers;
    const bool placed = std::any_of(order.begin(), order.end(),
                                    [&](std::size_t i) { return candidates[i].levers == levers; });
    if (placed) continue;
    for (std::size_t j = k; j < alive.size(); ++j) {
      if (candidates[alive[j]].levers == levers) order.push_back(alive[j]);
    }
  }
  if (round % 2 == 1) std::reverse(order.begin(), order.end());
  return order;
}

}  // namespace

// Phase 3 (throughput): the best of several noisy measurements is biased
// upwards and the machine drifts, so the contenders near the top are measured
// again in interleaved rounds and compared in pairs (Note [interleaved comparison]).
void BatchSearch::interleavePhase(SearchResult& r, Console* console) {
  const auto& s = cfg_.search;
  if (s.rounds <= 0) return;
  const Candidate* best = bestCompared(r.candidates);  // no rounds yet: every one that ran
  if (!best) return;
  // Contenders: within reach of the best even if the best's one measurement was
  // lucky by a large margin (a burst of speed, a slow peer at the wrong time).
  std::vector<std::size_t> contenders;
  for (std::size_t i = 0; i < r.candidates.size(); ++i) {
    const auto& c = r.candidates[i];
    const double reach = contenderReach(s.tolerance);
    if (!c.failed && std::max(c.sps_high, c.global_sps) >= reach * best->global_sps) {
      contenders.push_back(i);
    }
  }
  // Past kMaxContenders: the fastest (the reference), then those within the
  // tolerance of it in the order the rule would take them (the smaller per-GPU
  // batch, of one size the smaller peak), then the others, the faster first.
  std::sort(contenders.begin(), contenders.end(), [&](std::size_t a, std::size_t b) {
    return r.candidates[a].global_sps > r.candidates[b].global_sps;
  });
  const auto within = std::stable_partition(
      contenders.begin() + (contenders.empty() ? 0 : 1), contenders.end(), [&](std::size_t i) {
        return r.candidates[i].global_sps >= (1 - s.tolerance) * best->global_sps;
      });
  std::stable_sort(contenders.begin() + (contenders.empty() ? 0 : 1), within,
                   [&](std::size_t a, std::size_t b) {
                     return smallerThan(r.candidates[a], r.candidates[b]);
                   });
  const std::size_t left_out = contenders.size() - std::min(contenders.size(), kMaxContenders);
  contenders.resize(std::min<std::size_t>(contenders.size(), kMaxContenders));
  if (contenders.size() < 2) return;
  std::sort(contenders.begin(), contenders.end(), [&](std::size_t a, std::size_t b) {
    return r.candidates[a].per_gpu < r.candidates[b].per_gpu;
  });
  if (console) {
    std::string list;
    for (auto i : contenders) list += strCat(list.empty() ? "" : ", ", r.candidates[i].per_gpu);
    console->line(strCat("  interleaved re-measuring of per-GPU ", list, ": ", s.rounds, " rounds",
                         left_out > 0 ? strCat(" (", left_out, " more within reach left out: at most ",
                                               kMaxContenders, ", the fastest and then the likeliest picks)")
                                      : std::string()));
  }
  std::vector<std::size_t> alive = contenders;
  for (int64_t round = 0; round < s.rounds && alive.size() >= 2; ++round) {
    const auto order = roundOrder(r.candidates, alive, round);
    std::vector<std::size_t> failed_now;
    std::string line;
    for (auto i : order) {
      auto& c = r.candidates[i];
      const auto again = measureAgain(r, c);
      if (again.failed) {
        failedAgain(c, again);
        failed_now.push_back(i);
      } else {
        addMeasurement(c, again);
        c.round_sps.push_back(again.global_sps);
      }
      line += strCat(line.empty() ? "" : ", ", c.per_gpu, ": ",
                     again.failed ? "FAILED" : formatFixed(again.global_sps, 0));
    }
    for (auto i : failed_now) alive.erase(std::find(alive.begin(), alive.end(), i));
    if (console) console->line(strCat("    round ", round + 1, ": ", line));
    ++r.rounds;
  }
  // A contender's estimate is now the median of its rounds: the walk's first
  // measurement was taken at another time and is not paired with the others'.
  for (auto i : alive) {
    auto& c = r.candidates[i];
    if (c.round_sps.size() == static_cast<std::size_t>(r.rounds)) c.global_sps = median(c.round_sps);
    else c.round_sps.clear();  // measured in fewer rounds than the others: not paired
  }
}

// Note [lever search], 2 and 3.
void BatchSearch::leverPhase(SearchResult& r, const Space& sp, const LeverSpace& levers,
                             Console* console) {
  int64_t m0 = 0;
  for (const auto& c : r.candidates) {
    if (c.levers == base_ && !c.failed) m0 = std::max(m0, c.per_gpu);
  }
  bool memory_bound = false;  // the search throws on errors: a failure is memory's
  for (const auto& c : r.candidates) memory_bound |= c.levers == base_ && c.failed && c.per_gpu > m0;
  const int64_t pick =
      m0 > 0 ? chooseCandidate(r.candidates, cfg_.search.objective, cfg_.search.tolerance).per_gpu : 0;
  if (console) {
    console->line(strCat("batch search: levers: the walk under ", leversText(base_), " ",
                         m0 == 0 ? "fit no size"
                                 : strCat("fit up to per-GPU ", m0, memory_bound
                                                                        ? ", bounded by memory"
                                                                        : ", not bounded by memory")));
  }
  const LeverWalk walk{m0, memory_bound, pick};
  for (const auto& l : levers.combinations) {
    r.levers.push_back(weighLevers(r, sp, l, walk, console));
    if (console) {
      const auto& o = r.levers.back();
      console->line(strCat("  ", leversText(l), ": ", o.verdict));
    }
  }
}

namespace {

/// The largest per-GPU batch measured to fit under `levers`; 0 if none.
int64_t largestFit(const std::vector<Candidate>& candidates, const Levers& levers) {
  int64_t top = 0;
  for (const auto& c : candidates) {
    if (c.levers == levers && !c.failed) top = std::max(top, c.per_gpu);
  }
  return top;
}

/// Note [lever search]: nothing fit under any lever weighed. The refusal names the
/// levers tried, the closest candidate (the lowest peak over the budget) with its parts
/// against the budget, the memory a sample costs where the model was fitted, and
/// what could still help.
std::string noFitText(const SearchResult& r) {
  const Candidate* closest = nullptr;
  std::vector<std::string> tried;
  for (const auto& c : r.candidates) {
    const auto name = leversText(c.levers);
    if (std::find(tried.begin(), tried.end(), name) == tried.end()) tried.push_back(name);
    // Over the budget ran whole, so its peak is the step's (an out-of-memory's is not).
    const bool whole = c.reason.rfind(toString(FailKind::kOverBudget), 0) == 0;
    if (whole && c.peak_mb > 0 && (!closest || c.peak_mb < closest->peak_mb)) closest = &c;
  }
  std::string names;
  for (const auto& t : tried) names += strCat(names.empty() ? "" : ", ", t);
  std::string text = strCat("batch search: no per-GPU batch fits under ", names, "; ");
  if (closest) {
    const auto& p = closest->parts;
    text += strCat("the closest, per-GPU ", closest->per_gpu, " under ", leversText(closest->levers),
                   ", peaked at ", mb(closest->peak_mb),
                   r.memory_budget_mb > 0 ? strCat(" against a budget of ", mb(r.memory_budget_mb)) : "",
                   " (parameters ", mb(p.parameters_mb), ", gradients ", mb(p.gradients_mb),
                   ", optimizer state ", mb(p.optimizer_state_mb), ", activations and the rest ",
                   mb(closest->restMb()), "): ", closest->reason);
  } else {
    const auto smallest = std::min_element(r.candidates.begin(), r.candidates.end(),
        [](const Candidate& a, const Candidate& b) { return a.per_gpu < b.per_gpu; });
    text += strCat("the smallest tried, ", smallest->per_gpu, ", failed: ", smallest->reason);
  }
  for (const auto& o : r.levers) {
    if (o.fitted && o.per_sample_mb > 0) {
      text += strCat("; ", leversText(o.levers), " takes ", formatFixed(o.per_sample_mb, 2), " MB a sample");
    }
  }
  return text + ". Lower search.min, use a smaller model, bf16, model.recompute: on, dist.shard: "
                "parameters (gpt, mlp), more ranks, or more memory (search.memory_limit_mb / "
                "search.memory_fraction)";
}

/// The largest per-GPU batch measured to fit under `recompute` and a sharding
/// other than parameters; 0 if none.
int64_t largestFitUnsharded(const std::vector<Candidate>& candidates, Recompute recompute) {
  int64_t top = 0;
  for (const auto& c : candidates) {
    if (c.levers.recompute == recompute && c.levers.shard != Shard::kParameters && !c.failed) {
      top = std::max(top, c.per_gpu);
    }
  }
  return top;
}

/// "predicted to fit up to per-GPU 48 (peak 343 MB of 406)", or why there is no prediction.
std::string predictedText(const LeverOutcome& o, double budget_mb) {
  if (o.predicted_max > 0) {
    return strCat("predicted to fit up to per-GPU ", o.predicted_max, " (peak ",
                  formatFixed(o.predicted_peak_mb, 0), " MB of ", formatFixed(budget_mb, 0), ")");
  }
  return o.fitted ? "predicted to fit no allowed size"
                  : "no memory model (fewer than two sizes measured with a peak)";
}

}  // namespace

LeverOutcome BatchSearch::weighLevers(SearchResult& r, const Space& sp, const Levers& levers,
                                      const LeverWalk& walk, Console* console) {
  if (walk.m0 == 0) return rescueLevers(r, sp, levers, console);
  LeverOutcome o = modelLevers(r, sp, levers, walk, console);
  const std::string predicted = predictedText(o, r.memory_budget_mb);
  if (levers == base_) {
    o.measured_max = walk.m0;
    o.timed = true;
    o.verdict = strCat("the walk's levers: fit up to per-GPU ", walk.m0,
                       walk.memory_bound && o.fitted ? strCat("; ", predicted) : std::string());
    return o;
  }
  if (levers.shard == Shard::kParameters && pruneParameters(r, sp, o, walk, predicted, console)) {
    return o;
  }
  if (levers.recompute != base_.recompute && levers.shard != base_.shard) {
    const Levers twin{base_.shard, levers.recompute};  // weighed before (leverSpace's order)
    const int64_t twin_fit = largestFit(r.candidates, twin);
    if (twin_fit > 0 && o.predicted_max > 0 && o.predicted_max <= twin_fit) {
      return besideTwin(r, sp, std::move(o), twin, twin_fit, console);
    }
  }
  if (walk.memory_bound && o.predicted_max > walk.m0) {
    confirmLevers(r, sp, o, walk.m0, console);
    return o;
  }
  const std::string why_not =
      !walk.memory_bound ? strCat("memory did not bound the walk (up to per-GPU ", walk.m0, ")")
                         : strCat(predicted, ": no larger than the walk's ", walk.m0);
  if (levers.recompute != base_.recompute) {
    o.measured_max = largestFit(r.candidates, levers);
    o.verdict = strCat("pruned: ", why_not, "; recompute would only cost time");
    return o;
  }
  o.timed = !measureOne(r, sp, walk.pick, console, false, &levers).failed;
  o.measured_max = largestFit(r.candidates, levers);
  o.verdict = strCat(why_not, "; timed at the walk's pick, per-GPU ", walk.pick,
                     ": the same batch in less memory");
  return o;
}

bool BatchSearch::pruneParameters(SearchResult& r, const Space& sp, LeverOutcome& o,
                                  const LeverWalk& walk, const std::string& predicted,
                                  Console* console) {
  // Note [lever search]: parameters gathers every unit twice a micro-batch, so it
  // is slower than the other shardings at the same batch: weighed only where it
  // fits a larger one than they were measured to.
  const int64_t others = largestFitUnsharded(r.candidates, o.levers.recompute);
  if (o.predicted_max <= others) {
    o.measured_max = largestFit(r.candidates, o.levers);
    o.verdict = strCat("pruned: ", predicted, ": no larger than the ", others,
                       " another sharding fit; parameters would only cost time (every unit "
                       "gathered in forward and again in backward)");
    return true;
  }
  // The units' collectives are replayed after an out-of-memory only once a
  // micro-batch has run whole (Note [collective replay]): one at the walk's fit first.
  if (walk.m0 > 0 && largestFit(r.candidates, o.levers) == 0) {
    measureOne(r, sp, walk.m0, console, false, &o.levers);
  }
  return false;
}

LeverOutcome BatchSearch::besideTwin(SearchResult& r, const Space& sp, LeverOutcome o,
                                     const Levers& twin, int64_t twin_fit, Console* console) {
  const Candidate* best = bestCompared(r.candidates);  // before the rounds: every one that ran
  const Candidate* there = nullptr;
  for (const auto& c : r.candidates) {
    if (!c.failed && c.levers == twin && c.per_gpu == twin_fit) there = &c;
  }
  const double share = best && there ? there->global_sps / best->global_sps : 0.0;
  const std::string why = strCat(predictedText(o, r.memory_budget_mb), ": no larger than ",
                                 leversText(twin), "'s ", twin_fit);
  if (share < contenderReach(cfg_.search.tolerance)) {
    o.measured_max = largestFit(r.candidates, o.levers);
    o.verdict = strCat("pruned: ", why, ", which runs at ", formatFixed(100 * share, 0),
                       " % of the best: the same batch in less memory would not contend");
    return o;
  }
  o.timed = !measureOne(r, sp, twin_fit, console, false, &o.levers).failed;
  o.measured_max = largestFit(r.candidates, o.levers);
  o.verdict = strCat(why, "; timed at ", twin_fit, ": the same batch in less memory");
  return o;
}

LeverOutcome BatchSearch::rescueLevers(SearchResult& r, const Space& sp, const Levers& levers,
                                       Console* console) {
  LeverOutcome o;
  o.levers = levers;
  const int64_t first = sp.firstAllowedFrom(sp.lo);
  if (levers != base_ && first > 0) {
    o.timed = !measureOne(r, sp, first, console, false, &levers).failed;
    o.measured_max = largestFit(r.candidates, levers);
  }
  o.verdict = levers == base_ ? "the walk's levers: no size fit"
              : o.timed       ? strCat("fits the smallest size, ", first, ", which the walk's levers did not")
                              : strCat("does not fit the smallest size, ", first, ", either");
  return o;
}

LeverOutcome BatchSearch::modelLevers(SearchResult& r, const Space& sp, const Levers& levers,
                                      const LeverWalk& walk, Console* console) {
  LeverOutcome o;
  o.levers = levers;
  // The fixed parts from the largest fitting measurement under the base.
  const Candidate* ref = nullptr;
  for (const auto& c : r.candidates) {
    if (c.levers == base_ && !c.failed && (!ref || c.per_gpu > ref->per_gpu)) ref = &c;
  }
  o.fixed_mb = fixedMbUnder(ref->parts, base_.shard, levers.shard, comm_.size(),
                            measurer_.unitWorkingMb());
  // Recompute's two probes, once per recompute setting, only where memory bounds:
  // the base's largest fitting size and the smallest that failed above it (as far
  // apart as the walk knows sizes near the boundary: a slope from small sizes is
  // mostly the process's own memory on the CPU).
  if (levers.recompute != base_.recompute && walk.memory_bound &&
      !fitRest(r.candidates, levers.recompute).valid) {
    int64_t above = 0;
    for (const auto& c : r.candidates) {
      if (c.levers == base_ && c.failed && c.per_gpu > walk.m0 && (above == 0 || c.per_gpu < above)) {
        above = c.per_gpu;
      }
    }
    const Levers probe{base_.shard, levers.recompute};
    for (const int64_t m : {walk.m0, above}) measureOne(r, sp, m, console, false, &probe);
  }
  const auto fit = fitRest(r.candidates, levers.recompute);
  o.fitted = fit.valid;
  o.intercept_mb = fit.intercept_mb;
  o.per_sample_mb = fit.per_sample_mb;
  o.predicted_max = predictLargest(fit, o.fixed_mb, r.memory_budget_mb, sp.lo, sp.top(),
                                   [&sp](int64_t m) { return sp.searchable(m); });
  if (o.predicted_max > 0) {
    o.predicted_peak_mb = o.fixed_mb + fit.intercept_mb +
                          fit.per_sample_mb * static_cast<double>(o.predicted_max);
  }
  return o;
}

void BatchSearch::confirmLevers(SearchResult& r, const Space& sp, LeverOutcome& o, int64_t m0,
                                Console* console) {
  // The predicted size, then the sizes below it down to m0 + 1.
  std::vector<int64_t> failed;
  for (int64_t m = o.predicted_max, tries = 0; m > m0 && tries < kConfirmTries; ++tries) {
    if (largestFit(r.candidates, o.levers) >= m) break;  // a probe measured it already
    if (!measureOne(r, sp, m, console, false, &o.levers).failed) break;
    failed.push_back(m);
    for (--m; m > m0 && !sp.searchable(m);) --m;
  }
  o.measured_max = largestFit(r.candidates, o.levers);
  o.timed = o.measured_max > 0;
  std::string tried;
  for (const int64_t f : failed) tried += strCat(tried.empty() ? "" : ", ", f);
  o.verdict = strCat(predictedText(o, r.memory_budget_mb), "; ",
                     o.measured_max > m0 ? strCat("measured to fit ", o.measured_max)
                                         : std::string("but none of the sizes tried fit"),
                     failed.empty() ? std::string() : strCat(" (out of memory at ", tried, ")"));
}

Candidate BatchSearch::measureAgain(SearchResult& r, const Candidate& c) {
  // A round needs less precision than a first measurement: the rounds' median
  // and the pairing do the rest. Half the time keeps the search's cost bounded.
  auto rule = TimingRule::fromConfig(cfg_.search);
  rule.min_time_s /= 2;
  rule.max_time_s /= 2;
  const auto local = measurer_.measure(c.per_gpu, c.accum, c.levers, rule, 0);
  r.timed_steps += local.timed_steps;
  return agree(c.per_gpu, c.accum, c.levers, local);
}

void BatchSearch::addMeasurement(Candidate& c, const Candidate& again) const {
  c.min_rank_sps = std::min(c.min_rank_sps, again.min_rank_sps);
  c.max_rank_sps = std::max(c.max_rank_sps, again.max_rank_sps);
  c.peak_mb = std::max(c.peak_mb, again.peak_mb);
  c.data_wait = std::max(c.data_wait, again.data_wait);
  for (std::size_t k = 0; k < c.rank_peak_mb.size() && k < again.rank_peak_mb.size(); ++k) {
    c.rank_peak_mb[k] = std::max(c.rank_peak_mb[k], again.rank_peak_mb[k]);
  }
  c.sps_low = std::min(c.sps_low, again.sps_low);
  c.sps_high = std::max(c.sps_high, again.sps_high);
  c.timed_steps += again.timed_steps;
  c.step_seconds.insert(c.step_seconds.end(), again.step_seconds.begin(), again.step_seconds.end());
  ++c.measurements;
}

SearchResult BatchSearch::run(Console* console) {
  const auto& s = cfg_.search;
  const double t0 = monotonicSeconds();
  SearchResult r;
  r.objective = s.objective;
  r.tolerance = s.tolerance;
  r.world_size = comm_.size();
  r.device = measurer_.deviceName();
  r.tokens_per_sample = tokensPerSample(cfg_);
  for (double b : comm_.allgather(measurer_.memoryBudgetMb())) {
    if (b > 0 && (r.memory_budget_mb == 0 || b < r.memory_budget_mb)) r.memory_budget_mb = b;
  }
  const Space sp = space();
  const auto levers = leverSpace(configLevers(cfg_), comm_.size(), measurer_.recomputeUnsupported(),
                                 measurer_.parametersUnsupported());
  base_ = levers.base;
  if (console) {
    console->line(strCat("batch search: ", r.world_size, " rank(s) on ", r.device, ", objective ",
                         toString(s.objective), ", per-GPU from ", sp.lo,
                         sp.fixed_global
                             ? strCat(" dividing ", sp.share, " (batch.global ", cfg_.batch.global,
                                      r.tokens_per_sample > 0
                                          ? strCat(" = ", cfg_.batch.global * r.tokens_per_sample,
                                                   " tokens")
                                          : std::string(),
                                      ")")
                             : std::string(),
                         r.memory_budget_mb > 0 ? ", memory budget " + mb(r.memory_budget_mb)
                                                : std::string(", no memory budget")));
    if (sp.steps_capped) {
      const int64_t g = sp.hi * sp.fixed_accum * comm_.size();
      console->line(strCat("  per-GPU batch up to ", sp.hi, " (global batch ", g, "): ",
                           train_size_, " training samples, ", train_size_ / g,
                           " steps an epoch", train_size_ / g < cfg_.batch.adapt_min_steps
                                                  ? " even at the smallest size"
                                                  : std::string(),
                           "; batch.adapt_min_steps=", cfg_.batch.adapt_min_steps,
                           " bounds the global batch the search may choose"));
    }
  }
  if (console) {
    for (const auto& note : levers.notes) console->line("  " + note);
    if (levers.weighed()) {
      std::string list;
      for (const auto& l : levers.combinations) list += strCat(list.empty() ? "" : ", ", leversText(l));
      console->line(strCat("  levers weighed (Note [lever search]): ", list, "; the walk runs under ",
                           leversText(base_)));
    }
  }
  int64_t last_ok = 0;
  int64_t first_fail = 0;
  double best = 0;
  doublingPhase(r, sp, console, &last_ok, &first_fail, &best);
  boundaryPhase(r, sp, console, last_ok, first_fail, best);
  if (levers.weighed()) leverPhase(r, sp, levers, console);
  if (s.objective == Objective::kThroughput) interleavePhase(r, console);
  if (!r.candidates.empty() &&
      std::none_of(r.candidates.begin(), r.candidates.end(), [](const Candidate& c) { return !c.failed; })) {
    throw Error(noFitText(r));
  }

  const auto& pick =
      chooseCandidate(r.candidates, s.objective, s.tolerance, &r.why, r.tokens_per_sample);
  r.rule = ruleText(s.objective, s.tolerance, r.rounds);
  const Candidate* top = bestCompared(r.candidates);
  for (auto& c : r.candidates) {
    if (!c.failed && top) c.relative = relativeThroughput(c, *top);
  }
  r.chosen = pick.per_gpu;
  r.chosen_accum = pick.accum;
  r.chosen_levers = pick.levers;
  dataBound(r, pick);
  if (cfg_.batch.adapt != BatchAdapt::kOff) adaptRangePhase(r, sp, pick, console);
  r.seconds = monotonicSeconds() - t0;
  return r;
}

// Note [adapt range]: with batch.adapt: goodput the global batch may grow from G0
// to the adaptive ceiling (Note [goodput] in worker/plan/adapt.h), and a larger G
// is only worth it where a step of it is faster per sample. The walk above
// measured the per-GPU batches that divide G0 / W; here the doubling goes on past
// the largest that fitted, at accumulation 1, in multiples of search.multiple_of,
// up to the ceiling / W (and search.max), until a size fails or two doublings in
// a row gain less than the tolerance. The sizes are kept apart (adapt_range in
// search.json): they are not choices for G0, only throughput figures for the
// adaptive decision, which reaches a G between them by accumulation. Under
// batch.adapt: warmup (Note [batch-size warmup]) G grows whatever they say, and
// they pick the split each G runs at: the fastest, and one known to fit.
//
// Pairing. The decision's question is how much faster per sample a larger
// per-GPU batch is than the split in force, i.e. a ratio to the pick's
// samples/s; but the pick was measured minutes earlier, and on a machine whose
// speed drifts that ratio is off by the drift (on a shared 2-core CPU, one
// search measured the pick at ~9 000 samples/s in two of its three rounds and
// 13 600 in the third, the adapt range later at full speed: the decision saw a
// x1.34 gain that was mostly the drift). So with
// search.rounds > 0 the pick and the adapt range are measured again in that many
// interleaved rounds (rotated, half the time each, as the contenders are); each
// size's samples/s becomes the pick's x the median over the rounds of its ratio
// to the pick in the same round, its round figures go to round_samples_per_s,
// and its interval becomes the wider of its own and the rounds' spread of the
// ratio (half of max - min, relative to the median). The pick keeps its figure,
// which the adaptive figures are now relative to: adaptThroughput() gives the
// decision the pick's uncertainty as 0 then (Note [goodput] in worker/plan/adapt.h). The cost: the
// rounds x (1 + the adapt range's sizes) measurements at half the time.
void BatchSearch::adaptRangePhase(SearchResult& r, const Space& sp, const Candidate& pick,
                                  Console* console) {
  const int64_t W = comm_.size();
  const int64_t g0 = cfg_.batch.global;
  const int64_t adapt_max = cfg_.batch.adapt_max > 0 ? cfg_.batch.adapt_max : 16 * g0;
  const int64_t ceiling = std::min(adapt_max, dataCeiling(train_size_, cfg_.batch.adapt_min_steps));
  const int64_t hi = std::min(sp.hi, ceiling / W);
  int64_t top = 0;
  double best = 0;
  for (const auto& c : r.candidates) {
    if (c.failed || c.accum != 1 || c.levers != pick.levers) continue;
    top = std::max(top, c.per_gpu);
    best = std::max(best, c.global_sps);
  }
  if (top == 0) return;
  if (console && 2 * top <= hi) {
    console->line(strCat("batch search: batch.adapt: ", toString(cfg_.batch.adapt),
                         ": per-GPU batches above ", top,
                         " up to ", hi, " (global ", hi * W, ") for the adaptive global batch"));
  }
  int flat = 0;
  for (int64_t m = 2 * top; top < hi; m = std::min(2 * m, std::max(hi, m + 1))) {
    // Doubling, and the ceiling itself last (rounded to multiple_of).
    const int64_t size = sp.roundDown(std::min(m, hi));
    if (size <= top) break;
    const auto& c = measureOne(r, sp, size, console, /*adapt_range=*/true, &pick.levers);
    if (c.failed) break;
    flat = c.global_sps > best * (1.0 + cfg_.search.tolerance) ? 0 : flat + 1;
    best = std::max(best, c.global_sps);
    if (flat >= 2) break;
    top = size;
  }
  pairAdaptRange(r, pick, console);
}

void BatchSearch::pairAdaptRange(SearchResult& r, const Candidate& pick, Console* console) {
  const auto& s = cfg_.search;
  if (s.rounds <= 0) return;
  std::vector<std::size_t> alive;
  for (std::size_t i = 0; i < r.adapt_range.size(); ++i) {
    if (!r.adapt_range[i].failed) alive.push_back(i);
  }
  if (pick.failed || pick.global_sps <= 0 || alive.empty()) return;
  if (console) {
    std::string list;
    for (auto i : alive) list += strCat(list.empty() ? "" : ", ", r.adapt_range[i].per_gpu);
    console->line(strCat("  paired re-measuring of per-GPU ", list, " against the pick (",
                         pick.per_gpu, " x accum ", pick.accum, "): ", s.rounds, " rounds"));
  }
  // Each size's own interval, from its first measurement (addMeasurement widens
  // it over the rounds, i.e. over the drift the pairing takes out).
  std::vector<double> own(r.adapt_range.size(), 0.0);
  for (auto i : alive) {
    const auto& c = r.adapt_range[i];
    own[i] = relativeUncertainty(c.global_sps, c.sps_low, c.sps_high);
  }
  constexpr std::size_t kPick = std::numeric_limits<std::size_t>::max();
  std::vector<std::vector<double>> ratios(r.adapt_range.size());
  std::vector<std::vector<double>> rounds(r.adapt_range.size());
  int64_t done = 0;
  for (int64_t round = 0; round < s.rounds; ++round) {
    std::vector<std::size_t> order{kPick};
    order.insert(order.end(), alive.begin(), alive.end());
    std::rotate(order.begin(), order.begin() + round % static_cast<int64_t>(order.size()), order.end());
    double pick_sps = 0;
    std::vector<std::pair<std::size_t, double>> got;
    std::string line;
    for (auto i : order) {
      const Candidate& which = i == kPick ? pick : r.adapt_range[i];
      const int64_t m = which.per_gpu;
      const auto again = measureAgain(r, which);
      line += strCat(line.empty() ? "" : ", ", m, ": ",
                     again.failed ? "FAILED" : formatFixed(again.global_sps, 0));
      if (again.failed) {
        if (i == kPick) continue;  // no reference this round: its figures are not paired
        failedAgain(r.adapt_range[i], again);  // no figure for the decision
        alive.erase(std::find(alive.begin(), alive.end(), i));
        continue;
      }
      if (i == kPick) {
        pick_sps = again.global_sps;
      } else {
        got.emplace_back(i, again.global_sps);
        addMeasurement(r.adapt_range[i], again);
      }
    }
    if (console) console->line(strCat("    round ", round + 1, ": ", line));
    if (pick_sps <= 0) continue;
    ++done;
    for (const auto& [i, sps] : got) {
      ratios[i].push_back(sps / pick_sps);
      rounds[i].push_back(sps);
    }
  }
  for (auto i : alive) {
    auto& c = r.adapt_range[i];
    if (ratios[i].empty() || static_cast<int64_t>(ratios[i].size()) != done) continue;
    const double ratio = median(ratios[i]);
    const auto [lo, hi] = std::minmax_element(ratios[i].begin(), ratios[i].end());
    const double spread = std::max(own[i], (*hi - *lo) / (2 * ratio));
    c.global_sps = pick.global_sps * ratio;
    c.sps_low = c.global_sps * (1 - spread);
    c.sps_high = c.global_sps * (1 + spread);
    c.round_sps = rounds[i];
  }
}

std::vector<ThroughputPoint> adaptThroughput(const SearchResult& r) {
  const bool paired = std::any_of(r.adapt_range.begin(), r.adapt_range.end(),
                                  [](const Candidate& c) { return !c.round_sps.empty(); });
  std::vector<ThroughputPoint> out;
  for (const auto* list : {&r.candidates, &r.adapt_range}) {
    for (const auto& c : *list) {
      if (c.failed) continue;
      const bool pick = list == &r.candidates && c.per_gpu == r.chosen && c.accum == r.chosen_accum;
      out.push_back({c.per_gpu, c.global_sps,
                     paired && pick ? 0.0 : relativeUncertainty(c.global_sps, c.sps_low, c.sps_high)});
    }
  }
  return out;
}

// Note [data-bound search]: every candidate is timed on the real training step,
// loader included, so when the loader cannot keep up, candidates faster than it
// tie at its rate and the rule (the smallest within the tolerance) takes the
// smallest of them. What is left is to say so: the loader's rate, the model's
// (the step without its wait for data) and what to change.
void BatchSearch::dataBound(SearchResult& r, const Candidate& pick) {
  r.loader_sps = -comm_.allreduce(-measurer_.loaderSamplesPerSecond(), collective::ReduceOp::kMax);
  if (pick.data_wait < kDataBoundWait || pick.global_sps <= 0) return;
  const int64_t W = comm_.size();
  const double per_rank = pick.global_sps / W;
  const double model = per_rank / std::max(1e-9, 1.0 - pick.data_wait);
  r.data_bound = strCat(
      "data-bound: per-GPU batch ", pick.per_gpu, " waited for the loader ",
      formatFixed(100 * pick.data_wait, 0), " % of its step time; the loader delivers ~",
      formatFixed(per_rank, 0), " samples/s per rank",
      r.loader_sps > 0 ? strCat(" (its ", measurer_.loaderWorkers(), " thread(s) decode up to ~",
                                formatFixed(r.loader_sps, 0), ")")
                       : std::string(),
      ", the model alone ~", formatFixed(model, 0),
      "; larger batches tie at the loader's rate, so the smallest within the tolerance was "
      "taken. Raise data.workers, use data.cache: ram if the data set fits, or preprocess to "
      "smaller images");
}

}  // namespace batchdist::worker
