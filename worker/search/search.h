#pragma once
// Coordinated per-GPU batch search: every rank measures, all agree, throughput decides.
//
// Note [search agreement]: the search never deadlocks because every rank makes the
// same collective calls in the same order whatever happens locally:
//  - inside a candidate, the measured training step runs its gradient allreduce on
//    every step even on a rank whose forward/backward ran out of memory (that rank
//    contributes zeros; the search model is thrown away afterwards);
//  - after every candidate, all ranks agree through one allreduce(MAX) of
//    [failure code, peak memory, samples/s, -samples/s, stop], i.e. the worst
//    failure (kind and lowest rank in one number), the MAX of peak memory, the MIN
//    (and MAX) of samples/s and whether any rank was asked to stop, then one
//    allgather of each rank's peak (for the report);
//  - the next candidate is a pure function of the agreed results, so every rank
//    walks the same sequence and stops at the same point.
// A candidate fails if any rank ran out of memory (a cuDNN "not supported" at a
// large batch counts as out of memory) or its peak memory exceeded the budget.
//
// Note [search warm-up]: a measurement first runs search.warmup_steps [1] untimed
// steps (the new size's allocations, the loader's first batches); the search's
// first measurement kColdWarmup [1] more (a cold process: thread pools, the
// allocator's first growth), and one more after a change of levers (Note [lever
// switch] in worker/train/step/step_measurer.cc). One, not two: in a GPT's joint search
// on 2 CPU ranks (bench/lever_search.sh's workload) run without any, 5 timed steps
// a measurement, the first step after a change of size was within the others'
// spread (per-GPU 8: 0.78 0.78 0.86 0.79 0.82 s; 16: 0.86 0.78 0.82 0.90 0.85;
// the first measurement, after 2 untimed steps in a fresh process, is the 8), and
// the median discounts one slow step anyway. The one step takes the CUDA
// allocator's growth at a new size (its cache is emptied between measurements).
// At ~0.8 s a step the second step cost, by that count (not timed apart), ~18 s of a
// search of 22 measurements.
// After the untimed steps the ranks agree (one allreduce) whether any failed or
// went past its memory budget: then none times the candidate (its peak is known:
// a failing size cost its untimed steps and 2 timed ones, now the untimed only); a budget crossed
// while timed stops the timing at the next check (Note [adaptive timing]).
//
// Note [adaptive timing]: a candidate is timed step by step until its estimate is
// good enough, not for a fixed count: at least search.timed_steps steps and
// search.min_time_s seconds, then until the relative 95 % half-width of the median
// step time is below search.tolerance / 3, within search.max_steps and
// search.max_time_s. Slow steps (two of them already past search.max_time_s, as a
// large model's or a large global batch's) stop at two: each is precise on its
// own, the interleaved rounds pair the contenders again, and five such steps per
// candidate made a search of ten candidates minutes long. Each rank decides for
// itself, but the ranks only stop together: after the timed-step counts of
// TimingRule::nextCheck (2, then search.timed_steps, then ~x1.5; the same on every
// rank) one allreduce(MAX) of [wants more, failed] says whether any rank wants
// more (or any failed: then all stop). The check runs outside the timed interval.
//
// Note [interleaved comparison]: the machine drifts (other jobs, clocks, caches),
// so the contenders near the top are measured again in rounds, A B C, B C A,
// C A B, and compared in pairs within a round: a contender's throughput relative
// to the best is the median over rounds of (its samples/s / the best's samples/s)
// in the same round. Drift that hits a whole round cancels out of the ratio.
// The rule takes a contender only if it is within the tolerance in every round
// (its lowest per-round ratio): "not worse by more than the tolerance, given the
// measured spread"; on a flat plateau a borderline smaller batch loses to a
// larger one that is certainly as fast. At most 4 contenders: the fastest (the
// reference), then those within the tolerance of it in the order the rule would
// take them (smaller per-GPU batch, smaller peak), then the faster others. Once
// rounds ran, only the contenders are compared and chosen (comparedInRounds): a
// first measurement taken at another time is paired with nothing (one within reach but left out won a lever search on a burst of speed:
// 133 samples/s once, against the contenders' medians of 124-129). Contenders
// under several levers (Note
// [lever search]) are grouped by levers in a round and the order reversed every
// other round (A B C, C B A) instead of rotated, so a round switches levers once
// per lever combination, not once per contender (a switch costs a warm-up step:
// Note [search warm-up]).

#include <algorithm>
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "collective/communicator.h"
#include "worker/config/config.h"
#include "worker/plan/adapt.h"
#include "worker/search/stats.h"

namespace batchdist::worker {

class Console;

enum class FailKind : int { kNone = 0, kOverBudget = 1, kOutOfMemory = 2, kError = 3 };
const char* toString(FailKind kind);

/// A rank's failure as one number for a MAX allreduce (Note [search agreement]):
/// the maximum decodes to the worst kind and, for that kind, the lowest rank.
/// -1 for kNone. Exact for every rank below 2^24.
double failureCode(FailKind kind, int rank);
/// The kind and rank of failureCode()'s value; {kNone, -1} for a negative code.
std::pair<FailKind, int> decodeFailure(double code);

/// How long one candidate is timed (Note [adaptive timing]).
struct TimingRule {
  /// Timed steps a candidate gets at least, however slow: two show a spread.
  static constexpr int64_t kSlowStepFloor = 2;
  int64_t min_steps = 3;
  int64_t max_steps = 1000;
  double min_time_s = 0.3;
  double max_time_s = 1.0;
  double target = 0.05 / 3;  ///< relative 95 % half-width of the median step time

  static TimingRule fromConfig(const SearchConfig& s);
  /// Whether this rank wants more timed steps after `n` of them, `elapsed`
  /// seconds since the first, with median estimate `e`.
  bool wantsMore(int64_t n, double elapsed, const MedianEstimate& e) const;
  /// The next timed-step count after `n` at which the ranks agree whether to go
  /// on: min_steps, then about x1.5 each time, never beyond max_steps.
  int64_t nextCheck(int64_t n) const;
};

/// What a rank holds for the update, by part (Note [memory by part] in
/// worker/train/result.h): the fixed parts of the memory model (Note [lever search]).
struct MemoryParts {
  double parameters_mb = 0;
  double gradients_mb = 0;
  double optimizer_state_mb = 0;
  double fixedMb() const { return parameters_mb + gradients_mb + optimizer_state_mb; }
};

/// One rank's measurement of one candidate.
struct Measurement {
  FailKind fail = FailKind::kNone;
  std::string detail;        ///< what failed, for kError
  double samples_per_s = 0;  ///< this rank's samples/s: per-rank batch / median step time
  double sps_low = 0;        ///< samples/s at the 95 % interval's ends of the median
  double sps_high = 0;
  double peak_mb = 0;        ///< this rank's peak memory during the candidate
  int64_t timed_steps = 0;
  std::vector<double> step_seconds;  ///< every timed step, in order
  double data_wait_fraction = 0;     ///< share of the timed steps spent waiting for the loader
  MemoryParts parts;                 ///< this rank's, under the candidate's levers
  std::string trace;                 ///< Note [search traces]: this rank's trace of it ("": none)
};

struct LeverSpace;

/// Measures a candidate per-GPU batch on this rank. Implementations must make the
/// same collective calls on every rank whatever happens locally (Note [search agreement]).
class Measurer {
 public:
  virtual ~Measurer() = default;
  /// Times per-GPU batch `per_gpu` x `accum` under `levers` (concrete: no auto)
  /// and `rule`; `extra_warmup` steps are added to the configured warmup (a cold
  /// process). Collective.
  virtual Measurement measure(int64_t per_gpu, int64_t accum, const Levers& levers,
                              const TimingRule& rule, int64_t extra_warmup = 0) = 0;
  /// Why the model cannot recompute its activations ("" if it can): model.recompute:
  /// auto then weighs off only (Note [lever search]).
  virtual std::string recomputeUnsupported() const { return ""; }
  /// Why dist.shard: auto cannot weigh parameters here ("" if it can: Note [lever search]).
  virtual std::string parametersUnsupported() const { return "the model has no parameter units"; }
  /// MB of the parameters whole at once under dist.shard: parameters (the same on every rank).
  virtual double unitWorkingMb() const { return 0; }
  /// Peak memory (MB) a candidate must stay under; 0 = no budget.
  virtual double memoryBudgetMb() const = 0;
  /// e.g. "NVIDIA H100 80GB HBM3" or "cpu".
  virtual std::string deviceName() const = 0;
  /// Samples/s this rank's loader threads could decode, from the candidates so far
  /// (decoded sources; 0: unknown or in-memory data).
  virtual double loaderSamplesPerSecond() const { return 0; }
  /// The rank's loader threads (for the data-bound diagnosis).
  virtual int64_t loaderWorkers() const { return 0; }
};

/// One candidate as all ranks agreed on it.
struct Candidate {
  int64_t per_gpu = 0;
  int64_t accum = 1;
  int64_t global = 0;
  Levers levers;                 ///< sharding and recompute it ran under (Note [lever search])
  bool failed = false;
  std::string reason;            ///< empty unless failed
  std::string trace;             ///< rank 0's trace of one of its steps (Note [search traces])
  double min_rank_sps = 0;       ///< slowest rank's samples/s
  double max_rank_sps = 0;       ///< fastest rank's samples/s
  double global_sps = 0;         ///< world x slowest rank: the job's throughput
  double sps_low = 0;            ///< its 95 % interval (world x the ranks' lowest ends)
  double sps_high = 0;
  int64_t measurements = 1;      ///< times measured (interleaved contenders: 1 + rounds)
  std::vector<double> round_sps; ///< global samples/s per interleaved round (contenders only)
  double relative = 0;           ///< vs the best (Note [interleaved comparison]); 0: not compared
  int64_t timed_steps = 0;       ///< over all its measurements, per rank
  std::vector<double> step_seconds;  ///< rank 0's timed steps, every measurement
  double peak_mb = 0;            ///< max over ranks
  std::vector<double> rank_peak_mb;  ///< each rank's own peak (ranks may have different budgets)
  double data_wait = 0;          ///< max over ranks of the share of step time waiting for data
  MemoryParts parts;             ///< max over ranks, by part
  /// Peak less the fixed parts: activations, workspace and the process's own (CPU).
  double restMb() const { return std::max(0.0, peak_mb - parts.fixedMb()); }
};

/// Note [lever search]: what the search made of one lever combination.
struct LeverOutcome {
  Levers levers;
  double fixed_mb = 0;        ///< parameters + gradients + optimizer state per rank (formulas)
  double intercept_mb = 0;    ///< the rest's fit at per-GPU 0
  double per_sample_mb = 0;   ///< the rest's slope: activations per sample
  bool fitted = false;        ///< the rest was fitted (two sizes measured under its recompute)
  int64_t predicted_max = 0;  ///< the largest allowed per-GPU batch predicted to fit (0: none)
  double predicted_peak_mb = 0;  ///< the model's peak at predicted_max
  int64_t measured_max = 0;   ///< the largest measured to fit under these levers (0: none)
  bool timed = false;         ///< candidates under these levers compete
  std::string verdict;        ///< why it was timed or pruned, in words
};

struct SearchResult {
  int64_t chosen = 0;  ///< per-GPU batch
  int64_t chosen_accum = 1;
  Levers chosen_levers;  ///< Note [lever search]
  /// Note [lever search]: one per combination weighed (empty: no lever was auto).
  std::vector<LeverOutcome> levers;
  bool cached = false;
  Objective objective = Objective::kThroughput;
  double tolerance = 0;
  double memory_budget_mb = 0;  ///< tightest rank's budget
  std::string device;
  int64_t world_size = 1;
  int64_t timed_steps = 0;  ///< timed steps per rank, warmups excluded
  double seconds = 0;
  std::vector<Candidate> candidates;
  /// batch.adapt (goodput, warmup): per-GPU batches above G0 / W measured at accumulation 1
  /// for the adaptive global batch (Note [adapt range]); not choices for G0.
  std::vector<Candidate> adapt_range;
  std::string why;  ///< one sentence: why this candidate
  std::string rule; ///< the selection rule that decided, in words
  int64_t rounds = 0;  ///< interleaved rounds over the contenders
  double loader_sps = 0;  ///< the slowest rank's loader capacity, samples/s (0: unknown)
  /// Note [tokens per sample] (worker/plan/plan.h): tokens/s beside samples/s in
  /// the lines, table, search.json and TensorBoard; 0: samples are not tokens.
  int64_t tokens_per_sample = 0;
  /// Set when the chosen batch is data-bound (Note [data-bound search]): what the
  /// loader delivers, what the model would, and what to change.
  std::string data_bound;
};

/// Whether `c` is r's choice: its per-GPU batch, accumulation and levers.
bool isChosen(const SearchResult& r, const Candidate& c);

/// `c`'s throughput relative to `best`: the median of the per-round ratios when
/// both were measured in the same interleaved rounds (`conservative`: the lowest
/// of them), else the ratio of their estimates (Note [interleaved comparison]).
double relativeThroughput(const Candidate& c, const Candidate& best, bool conservative = false);

/// Note [interleaved comparison]: whether `c` takes part in the comparison: it did
/// not fail and, once any candidate was measured in rounds, it was too.
bool comparedInRounds(const std::vector<Candidate>& candidates, const Candidate& c);
/// The fastest candidate compared (null when every one failed).
const Candidate* bestCompared(const std::vector<Candidate>& candidates);

/// The selection rule. throughput: the smallest candidate whose global samples/s
/// is within `tolerance` of the best measured (conservative relativeThroughput >=
/// 1 - tolerance);
/// max_fit: the largest that fits. Among candidates of one per-GPU batch under
/// different levers (Note [lever search]), the smallest peak memory.
/// Throws Error naming the smallest size tried and the memory seen when none fits.
/// `why` gets the sentence of why; with `tokens_per_sample` > 0 (Note [tokens per
/// sample] in worker/plan/plan.h) its rates give tokens/s beside samples/s.
const Candidate& chooseCandidate(const std::vector<Candidate>& candidates,
                                 Objective objective, double tolerance,
                                 std::string* why = nullptr, int64_t tokens_per_sample = 0);

/// r.why said again from r's candidates and r.tokens_per_sample, as a fresh search
/// says it: a cached result (written before its why gave tokens/s, or before
/// tokens_per_sample was kept) then reads like a fresh one. Unchanged when the
/// rule picks another candidate than r.chosen (a cache written under other rules).
void explainChoice(SearchResult& r);

/// The samples/s table of the adaptive global batch (Note [adaptive training] in
/// worker/train/adapt/adaptive_batch.h): every candidate that ran, the walk's and the adapt
/// range's, with its relative uncertainty. When the search paired the adapt range
/// with the pick (Note [adapt range], pairing) those figures are ratios to the
/// pick, so the pick's own uncertainty is 0 there.
std::vector<ThroughputPoint> adaptThroughput(const SearchResult& r);

/// Thrown on every rank when a stop was requested (SIGTERM ...) during the search;
/// every rank learns it in the same per-candidate agreement.
class SearchStopped : public Error {
 public:
  explicit SearchStopped(int64_t last_per_gpu)
      : Error(strCat("after per-GPU batch ", last_per_gpu)), last_per_gpu_(last_per_gpu) {}
  /// The per-GPU batch of the last candidate measured.
  int64_t lastPerGpu() const { return last_per_gpu_; }

 private:
  int64_t last_per_gpu_;
};

/// Runs the search over `comm`; collective.
class BatchSearch {
 public:
  /// `stop_requested` is polled after every candidate (e.g. a SIGTERM flag); when
  /// it is true on any rank, run() throws SearchStopped on every rank.
  BatchSearch(const Config& cfg, collective::Communicator& comm, Measurer& measurer,
              int64_t train_size, bool has_batchnorm, std::function<bool()> stop_requested = {});
  SearchResult run(Console* console);

 private:
  /// The per-GPU sizes the walk may try, from the config and the world size.
  struct Space;
  Space space() const;
  Candidate agree(int64_t per_gpu, int64_t accum, const Levers& levers, const Measurement& m);
  /// Measures `per_gpu` (at the space's accumulation, or 1 for the adapt range)
  /// under `levers` (null: the base's) and appends it to r.candidates (or r.adapt_range).
  const Candidate& measureOne(SearchResult& r, const Space& sp, int64_t per_gpu, Console* console,
                              bool adapt_range = false, const Levers* levers = nullptr);
  void doublingPhase(SearchResult& r, const Space& sp, Console* console, int64_t* last_ok,
                     int64_t* first_fail, double* best);
  void boundaryPhase(SearchResult& r, const Space& sp, Console* console, int64_t last_ok,
                     int64_t first_fail, double best);
  void interleavePhase(SearchResult& r, Console* console);
  /// Note [lever search], 2 and 3: after the walk under the base levers.
  void leverPhase(SearchResult& r, const Space& sp, const LeverSpace& levers, Console* console);
  /// What the walk under the base levers found (Note [lever search], 1).
  struct LeverWalk {
    int64_t m0 = 0;             ///< the largest size that fit
    bool memory_bound = false;  ///< a larger size ran out of memory or over the budget
    int64_t pick = 0;           ///< the rule's pick among the walk's sizes
  };
  /// Note [lever search], 3: one combination's prediction, confirmation or pruning.
  LeverOutcome weighLevers(SearchResult& r, const Space& sp, const Levers& levers,
                           const LeverWalk& walk, Console* console);
  /// ... dist.shard: parameters: true (pruned, `o` says why) unless predicted to fit
  /// more than every other sharding under its recompute measured; then it is
  /// measured once at the walk's fit before the confirmation (Note [collective replay]).
  bool pruneParameters(SearchResult& r, const Space& sp, LeverOutcome& o, const LeverWalk& walk,
                       const std::string& predicted, Console* console);
  /// ... a sharding on top of recompute that fits no larger size than its twin (the
  /// same recompute under the base's sharding) measured, `twin_fit`: timed there
  /// or pruned (Note [lever search], 3).
  LeverOutcome besideTwin(SearchResult& r, const Space& sp, LeverOutcome o, const Levers& twin,
                          int64_t twin_fit, Console* console);
  /// ... when nothing fit under the base: the smallest size under `levers`, once.
  LeverOutcome rescueLevers(SearchResult& r, const Space& sp, const Levers& levers, Console* console);
  /// ... the memory model of `levers` (recompute's probes measured first where needed).
  LeverOutcome modelLevers(SearchResult& r, const Space& sp, const Levers& levers,
                           const LeverWalk& walk, Console* console);
  /// ... the predicted size measured, then the ones below it down to m0 + 1.
  void confirmLevers(SearchResult& r, const Space& sp, LeverOutcome& o, int64_t m0, Console* console);
  /// Note [adapt range]; `pick` is the walk's choice, in r.candidates (which the
  /// adapt range, kept in r.adapt_range, does not grow: the reference stays valid).
  void adaptRangePhase(SearchResult& r, const Space& sp, const Candidate& pick, Console* console);
  /// Note [adapt range], pairing: the adapt range against the pick, in rounds.
  void pairAdaptRange(SearchResult& r, const Candidate& pick, Console* console);
  /// One more measurement of a size already measured, in a round (interleaved or
  /// paired): half the timing budget of a first one, agreed over the ranks.
  Candidate measureAgain(SearchResult& r, const Candidate& c);
  void addMeasurement(Candidate& c, const Candidate& again) const;
  /// Note [data-bound search]: the loader's rate and, if the pick waited for data, why.
  void dataBound(SearchResult& r, const Candidate& pick);

  const Config& cfg_;
  collective::Communicator& comm_;
  Measurer& measurer_;
  int64_t train_size_;
  bool has_bn_;
  std::function<bool()> stop_requested_;
  Levers base_;  ///< the walk's levers (Note [lever search])
};

}  // namespace batchdist::worker
