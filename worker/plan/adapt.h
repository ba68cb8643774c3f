#pragma once
// The adaptive global batch (batch.adapt: goodput or warmup): pure arithmetic, no
// MPI, no torch.
//
// Note [goodput]: a step at global batch G makes more progress than a step at the
// starting batch G0, but less than G / G0 times as much: with the gradient noise
// scale B (B_simple, Note [gradient noise scale] in worker/train/step/noise_scale.h),
// AdaScale's gain (Johnson et al. 2020) is
//     r(G) = (G / G0) x (B + G0) / (B + G),
// i.e. one step at G is worth r steps at G0, and a sample at G is worth
//     E(G) = r / (G / G0) = (B + G0) / (B + G)
// samples at G0 (the statistical efficiency, 1 at G0, falling toward G0 / G when
// G >> B). Progress per second is therefore proportional to the goodput
//     goodput(G, m, a) = samples/s(m, a) x E(G)
// (Pollux, Qiao et al. OSDI 2021). Every adapt_every_steps steps and at epoch ends
// all ranks evaluate every reachable G from the same shared figures (the smoothed
// B, the search's samples/s per per-GPU batch, the exposed per-step cost) and
// decideGlobalBatch() names the best one. Because E(G) < 1 for every G > G0, a
// larger batch only pays where it is faster per sample: a larger per-GPU batch
// that the search measured faster, or accumulation amortising the allreduce.
//
// Throughput model. The search times each per-GPU batch m at accumulation 1, so
// its step time is T1(m) = m W / sps(m). Of that, `fixed_step_s` seconds (the
// exposed allreduce and the optimizer update, which the trainer measures) are paid
// once per optimizer step whatever the accumulation; the rest, T1(m) - c, once
// per micro-batch. So a split (m, a) takes
//     T(m, a) = a (T1(m) - c) + c,     sps(m, a) = m a W / T(m, a).
// c is capped at half of T1(m) (kMaxFixedShare): c is measured at one split and
// T1 at others, and an inconsistent pair must not promise unbounded speed-ups
// from accumulation. With c unknown (0) the model is the per-sample rate of m, a
// lower bound: accumulation never makes a sample slower. Per-GPU batches that
// were not measured are not candidates (no extrapolation past the data); the
// search measures a geometric ladder, so m x a x W still covers G densely.
//
// Hysteresis. G changes only when the best candidate's modelled goodput beats the
// current split's by more than `margin` (5 %) plus, where the two splits differ in
// m, the uncertainty of the ratio of their measured samples/s: the quadrature sum
// sqrt(u1^2 + u2^2) of the relative half-widths of the search's 95 % intervals
// (ThroughputPoint::uncertainty). A gain the measurements cannot tell from noise
// is no reason to move: on the CNN of bench/adaptive.sh per-GPU 16 measured
// +-3.7 % and 64 +-1.0 %, and the rule had moved on a modelled x1.08. The
// interval is a floor on the real uncertainty (a machine's speed also wanders
// between runs), so no further slack is taken off it. When the search paired
// the adapt range with its pick (Note [adapt range] in worker/search/search.cc),
// those figures are ratios to the pick measured side by side, u is the rounds'
// spread of that ratio, and the pick's own u is 0. Splits of the same m share their
// measurement and add no uncertainty. The 5 % is for B, a noisy estimate: between
// two candidates the goodput ratio moves by less than the relative change of B
// (d ln[(B+G1)/(B+G2)] / d ln B lies in (-1, 1)), so going A -> B -> A needs the
// ratio to swing by more than 2 x 5 % = 10 %: B wobbling by +-3 % cannot do it.
// Ties go to the smaller G (fewer samples per step for the same progress rate).
// The decision is a pure function of its inputs, so ranks given the same shared
// figures (allreduced or broadcast) decide the same G without a further exchange.
//
// B unknown (not measured yet, or its estimate not positive): no decision (G
// stays) and the gain is 1: a step counts as one G0 step, the conservative view.
//
// Learning rate. SGD and LARS follow AdaScale: lr = lr_G0(progress) x r, where
// lr_G0 is the plan's schedule at G0 (warmup, milestones, cosine) evaluated at
// the G0-equivalent progress, and progress advances by r per step. AdamW, whose
// update is normalised per coordinate, takes Pollux's square-root rule,
// lr = lr_G0(progress) x sqrt(G / G0) -- but its progress still advances by r, as
// Pollux does for every rule: r is a property of the gradient statistics (how
// much less noisy a step at G is than one at G0), not of the optimizer, and one
// clock for all keeps a schedule's end (cosine at min_lr, the last milestone)
// where the plan put it, in G0-equivalent steps, whichever optimizer runs. As in
// AdaScale, training is complete when the progress reaches the plan's total
// steps (at G0), not after a number of epochs.
//
// batch.adapt_gain: linear replaces r by G / G0 (for the progress, and for the
// lr of SGD and LARS; AdamW keeps sqrt(G / G0)): a step at G counts as G / G0
// steps at G0, so the budget is the plan's samples, and the lr follows G as a
// fixed run at G with optim.lr_scaling: linear would have it. It is the linear
// scaling rule applied at every change of G (as in Smith et al. 2018, "Don't
// decay the learning rate, increase the batch size"). It trusts that G is below
// the critical batch, where AdaScale measures how far below: r < G / G0 always,
// so under AdaScale a run at G > G0 makes more passes over the data than the
// plan and its lr is lower than the linear rule's. The decision (goodput, from
// the efficiency E) is the same under both.
//
// Note [batch-size warmup]: batch.adapt: warmup grows G as the critical batch
// grows, whatever the throughput. Merrill, Arora, Groeneveld and Hajishirzi
// ("Critical Batch Size Revisited", 2025) measured the critical batch size of
// OLMo runs: near 0 at initialisation, growing fast, then a plateau; starting the
// batch small and doubling it as the critical batch grows trained OLMo-1B to a
// slightly better loss in 43 % fewer gradient steps. They measured the critical
// batch directly, by branching runs at several batch sizes (finding the noise
// scale a proxy hard to trust), and set the doublings from those measurements;
// a run here has only its own online estimate, the smoothed B_simple (Note
// [gradient noise scale]), so B stands in for the critical batch. The decision
// (decideWarmupBatch()), at the same points as goodput's (adapt_every_steps,
// epoch ends, not in the lr warmup unless batch.adapt_in_warmup):
//  - G takes the largest G0 x 2^k above the current G that is at most B and has
//    a split within the ceiling (isAdaptSplit: the same resolution and data
//    ceiling N / adapt_min_steps as goodput), so B reaching 2 G doubles G, and B
//    far above G takes several doublings in one decision.
//    Doublings, as the OLMo runs did, rather than any G <= B: a noisy B must
//    reach the next power of two before G moves, and every G0 x 2^k splits
//    (at worst G0's per-GPU batch with 2^k times its accumulation).
//  - G never shrinks: the critical batch grows and then plateaus, so a fall of
//    B is read as the estimate's noise (or the lr schedule's transient), and a
//    larger batch already taken is not given back. B unknown: G stays.
//  - Its split: the fastest modelled one among the measured per-GPU batches
//    (adaptCandidates()'s choice for that G, Note [goodput] throughput model);
//    with no figure for any per-GPU batch dividing G / W, the per-GPU batch in
//    force with more accumulation (known to fit in memory), else the largest
//    valid per-GPU batch below it.
//  - A split in force that is no longer valid (an out-of-memory back-off's, or a
//    resume on another world) moves as under goodput: to the target above, else
//    to G's own fastest split, else to the largest doubling below G that splits.
// Pure and deterministic, as goodput's decision: every rank decides the same
// from the same shared B. The lr and the progress follow batch.adapt_gain
// exactly as under goodput. The OLMo runs kept the lr schedule and the budget in
// tokens, i.e. a step at G counts G / G0 steps at G0: that is adapt_gain: linear
// (AdamW's lr takes sqrt(G / G0) under either rule). Under the default,
// adascale, a step at G <= B still counts r >= (G / G0) (B + G0) / (2 B), about
// half of G / G0 or more, and the run makes more passes over the data.
// When to choose it over goodput: where G should follow the critical batch
// (fewer optimizer steps, more data parallelism: many accelerators) even when a
// larger batch is no faster per sample on the hardware at hand (on the CPU
// runs of bench/adaptive.sh's GPT goodput stayed at G0).

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "worker/config/config.h"
#include "worker/plan/plan.h"

namespace batchdist::worker {

/// The default hysteresis of decideGlobalBatch() (Note [goodput]).
constexpr double kAdaptMargin = 0.05;
/// The largest share of a step at accumulation 1 the throughput model treats as
/// paid once per optimizer step (Note [goodput]).
constexpr double kMaxFixedShare = 0.5;

/// The largest global batch that leaves an epoch of `n` training samples at
/// least `min_steps` steps (batch.adapt_min_steps): n / min_steps. The adaptive
/// batch never exceeds it, and the noise-scale advice (worker/report) caps B_simple
/// with it. 0 when `n` is unknown (<= 0).
int64_t dataCeiling(int64_t n, int64_t min_steps);

/// Statistical efficiency of global batch `g` against `g0` for noise scale
/// `b_noise`: (B + G0) / (B + G), the worth of a sample at G in samples at G0.
/// B unknown (<= 0, or not finite): G0 / G, i.e. a gain of 1.
double statisticalEfficiency(double g, double g0, double b_noise);

/// AdaScale's gain: (G / G0) x (B + G0) / (B + G), the worth of a step at `g` in
/// steps at `g0`; between 1 and G / G0 for G >= G0. B unknown: 1.
double adascaleGain(double g, double g0, double b_noise);

/// The worth of a step at `g` in steps at `g0` under batch.adapt_gain: AdaScale's
/// gain (kAdascale) or G / G0 (kLinear, whatever B). 1 at G0.
double stepGain(AdaptGain rule, double g, double g0, double b_noise);

/// One point of the batch search: global samples/s of per-GPU batch `per_gpu`
/// at accumulation 1 (the slowest rank's samples/s x W).
struct ThroughputPoint {
  int64_t per_gpu = 0;
  double samples_per_s = 0;
  /// Half the width of its 95 % interval over samples_per_s (0: unknown), for
  /// the hysteresis (Note [goodput]).
  double uncertainty = 0;
};

/// The relative uncertainty of a search candidate's samples/s, (high - low) / (2
/// x sps) from its 95 % interval; 0 when the interval is missing or not finite.
double relativeUncertainty(double sps, double low, double high);

/// Everything the choice of G depends on besides B (Note [goodput]).
struct AdaptSpace {
  int64_t world_size = 1;    ///< W
  int64_t g0 = 0;            ///< the starting global batch (batch.global)
  int64_t adapt_max = 0;     ///< batch.adapt_max resolved (0 in the config: 16 x G0)
  int64_t ceiling = 0;       ///< min(adapt_max, N / min_steps): the largest G used
  int64_t dataset_size = 0;  ///< N, training samples
  int64_t min_steps = 8;     ///< batch.adapt_min_steps
  int64_t min_per_gpu = 1;   ///< minPerGpu(cfg, has_bn)
  int64_t multiple_of = 1;   ///< search.multiple_of where the search chose m; else 1
  int64_t fixed_per_gpu = 0; ///< > 0: the config fixed m, only accumulation varies
  std::vector<ThroughputPoint> throughput;  ///< measured per-GPU batches (any order)
  double fixed_step_s = 0;   ///< seconds per optimizer step not repeated per micro-batch (0: unknown)
  double margin = kAdaptMargin;
  /// Which decision decideAdaptive() makes: goodput's or batch-size warmup's.
  BatchAdapt mode = BatchAdapt::kGoodput;
  /// Note [tokens per sample]: > 0, the decisions' lines give G in tokens too.
  int64_t tokens_per_sample = 0;
  std::vector<std::string> warnings;  ///< from adaptSpace(), for the plan's warnings
};

/// A split of the global batch: G = per_gpu x accum x W (Note [equal shards]).
struct AdaptSplit {
  int64_t global = 0;
  int64_t per_gpu = 0;
  int64_t accum = 0;
  bool operator==(const AdaptSplit& o) const {
    return global == o.global && per_gpu == o.per_gpu && accum == o.accum;
  }
  bool operator!=(const AdaptSplit& o) const { return !(*this == o); }
};

struct AdaptCandidate {
  AdaptSplit split;
  double samples_per_s = 0;  ///< modelled
  double efficiency = 0;     ///< statisticalEfficiency(G, G0, B)
  double goodput = 0;        ///< samples_per_s x efficiency
};

/// Modelled global samples/s of `split` (Note [goodput], throughput model);
/// 0 when its per-GPU batch was not measured.
double modelledSamplesPerSecond(const AdaptSpace& space, const AdaptSplit& split);

/// Whether `split` is one the adaptive batch may use: G = m x a x W, a >= 1,
/// m >= min_per_gpu, m a multiple of multiple_of (or the fixed m), G0 <= G <=
/// ceiling (so N / G >= min_steps). Measured or not.
bool isAdaptSplit(const AdaptSpace& space, const AdaptSplit& split);

/// One candidate per reachable G in [G0, ceiling], in ascending G: its fastest
/// split among the measured per-GPU batches (ties: the larger m), with its
/// modelled samples/s, efficiency and goodput for noise scale `b_noise`.
std::vector<AdaptCandidate> adaptCandidates(const AdaptSpace& space, double b_noise);

struct AdaptDecision {
  AdaptSplit current;
  AdaptSplit chosen;          ///< == current when !change
  double current_goodput = 0; ///< modelled
  double chosen_goodput = 0;  ///< modelled, the best candidate's
  double gain = 1;            ///< chosen_goodput / current_goodput (1 when unknown)
  bool change = false;
  std::string why;            ///< one line for the log: the numbers the decision rests on
};

/// The margin the best candidate must beat `current` by (Note [goodput],
/// hysteresis): space.margin, plus the quadrature sum of the two per-GPU batches'
/// uncertainties when their m differ.
double requiredMargin(const AdaptSpace& space, const AdaptSplit& current, const AdaptSplit& best);

/// The global batch for the next adapt_every_steps steps (Note [goodput]): the
/// best candidate when it beats `current` by more than requiredMargin(), or when
/// `current` is no longer a valid split; `current` otherwise, and always when B
/// is unknown or `current`'s per-GPU batch has no throughput figure.
/// Deterministic: ties go to the smaller G.
AdaptDecision decideGlobalBatch(const AdaptSpace& space, const AdaptSplit& current, double b_noise);

/// The global batch for the next adapt_every_steps steps under batch-size warmup
/// (Note [batch-size warmup]): the largest G0 x 2^k <= B (`b_noise`) with a split
/// within the ceiling, at or above `current`'s G, on its fastest modelled split
/// (warmupSplit()); `current` when no such G is above it, and always when B is
/// unknown. Never smaller than `current`'s G unless `current` is not a valid split.
/// Deterministic. The gain fields stay 1 (no goodput is modelled).
AdaptDecision decideWarmupBatch(const AdaptSpace& space, const AdaptSplit& current, double b_noise);

/// The split batch-size warmup runs global batch `g` at: the fastest modelled one
/// among the measured per-GPU batches (ties: the larger m); with no figure for a
/// per-GPU batch that divides g / W, `current`'s per-GPU batch with more
/// accumulation, else the largest per-GPU batch making a valid split, at most
/// `current`'s (a larger one is not known to fit; `current` with per_gpu 0: any).
/// A valid split (isAdaptSplit) or nothing; `modelled` (optional) says whether it
/// came from figures.
std::optional<AdaptSplit> warmupSplit(const AdaptSpace& space, int64_t g, const AdaptSplit& current,
                                      bool* modelled = nullptr);

/// The decision of space.mode: decideGlobalBatch() (goodput) or decideWarmupBatch()
/// (warmup).
AdaptDecision decideAdaptive(const AdaptSpace& space, const AdaptSplit& current, double b_noise);

/// A resume on another world size (Note [adaptive checkpoint] in
/// worker/train/adapt/adaptive_batch.h): the split of global batch `g` over space's world.
/// goodput: `g`'s fastest measured split, else the candidate of the best goodput
/// for `b_noise`; warmup (Note [batch-size warmup]): `g` on warmupSplit()'s split,
/// else the largest doubling of G0 below `g` that splits. Nothing when no measured
/// split (goodput) or no valid split (warmup) exists.
std::optional<AdaptSplit> resumeSplit(const AdaptSpace& space, int64_t g, double b_noise);

/// "G (m x a x W)", as the decision's lines write a split; "G (m x a x W; T tokens)"
/// when a sample is `tokens_per_sample` > 0 tokens (Note [tokens per sample]).
std::string splitText(const AdaptSplit& s, int64_t world, int64_t tokens_per_sample = 0);

/// The adaptive space of a run (no throughput yet) from its config and the plan at
/// G0, checked by checkAdaptReachable(). The search chooses m when batch.per_gpu
/// is auto (multiples of search.multiple_of); a per_gpu the config gives is kept.
/// Throws ConfigError.
AdaptSpace adaptSpace(const Config& cfg, const Plan& plan_at_g0, bool has_batchnorm);

/// ConfigError (naming `source`, the keys, and the nearest valid values) when no
/// equal-shard split lies in (G0, ceiling]; a warning in space.warnings when
/// adapt_max exceeds N / adapt_min_steps (the latter is used).
void checkAdaptReachable(AdaptSpace& space, const std::string& source);

/// One stretch of an adaptive run: from optimizer step `begin_step` (0-based)
/// until the next segment's, every step ran at `global` with gain `gain` (stepGain).
struct AdaptSegment {
  int64_t begin_step = 0;
  int64_t global = 0;
  double gain = 1;
};

/// The G0-equivalent progress after `steps` optimizer steps: the sum of the gains
/// of the steps before it. `history` starts at step 0 with increasing begin_step
/// (Error otherwise). Equals `steps` for a run that stayed at G0.
double adaptProgress(const std::vector<AdaptSegment>& history, int64_t steps);

/// The learning rate at G0-equivalent progress `progress` and global batch `g`
/// (Note [goodput]): plan_at_g0.lrAtProgress(progress) x stepGain(rule, ...) (SGD,
/// LARS) or x sqrt(G / G0) (AdamW).
double adaptLr(const Plan& plan_at_g0, OptimName optimizer, AdaptGain rule, double progress,
               int64_t g, double b_noise);

}  // namespace batchdist::worker
