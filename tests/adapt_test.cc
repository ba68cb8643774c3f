// The adaptive global batch (Note [goodput] in worker/plan/adapt.h): pure logic.
#include <gtest/gtest.h>

#include <array>
#include <algorithm>
#include <cmath>
#include <limits>
#include <random>

#include "common/error.h"
#include "tests/config_errors.h"
#include "worker/config/config.h"
#include "worker/plan/adapt.h"
#include "worker/train/adapt/adapt_record.h"
#include "worker/train/adapt/adaptive_batch.h"
#include "worker/plan/plan.h"

using batchdist::ConfigError;
using namespace batchdist::worker;
using batchdist::testsupport::configError;

namespace {

/// The ConfigError of adaptSpace() for `yaml` on `world` ranks and `n` samples.
std::string spaceErrorOf(const std::string& yaml, int64_t world, int64_t n,
                         AdaptSpace* out = nullptr) {
  try {
    const auto cfg = parseConfig(yaml, "test.yaml");
    const auto space = adaptSpace(cfg, makePlan(cfg, world, n, false), false);
    if (out) *out = space;
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "<no error>";
}

/// W = 4, G0 = 256, no BatchNorm, m free (multiples of 1), plenty of data.
AdaptSpace space4() {
  AdaptSpace s;
  s.world_size = 4;
  s.g0 = 256;
  s.adapt_max = 4096;
  s.dataset_size = 1'000'000;
  s.ceiling = 4096;
  return s;
}

/// G0 = 64 on 2 ranks, 2000 samples: 31 steps an epoch, 5 epochs, 155 steps at
/// G0; lr 0.1, a 10-step warmup, then cosine to 0.001.
Plan cosinePlan155() {
  return makePlan(parseConfig("batch: {global: 64}\ntrain: {epochs: 5}\n"
                              "optim: {lr: 0.1, base_batch: 64, warmup_steps: 10, "
                              "schedule: cosine, min_lr: 0.001}\n",
                              "t.yaml"),
                  2, 2000, false);
}

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

/// Batch-size warmup's space (Note [batch-size warmup]): W = 2, G0 = 16 (8 x 1 x 2),
/// ceiling 1024, m free, per-GPU 2 .. 512 measured on tests/adaptive.sh's pinned
/// curve (a rank's step 1 ms + 10 us a sample): each faster per sample than the one
/// below, so a G's fastest split is its largest measured m.
AdaptSpace warmupSpace() {
  AdaptSpace s;
  s.mode = BatchAdapt::kWarmup;
  s.world_size = 2;
  s.g0 = 16;
  s.adapt_max = 1024;
  s.ceiling = 1024;
  s.dataset_size = 1'000'000;
  for (int64_t m = 2; m <= 512; m *= 2) {
    s.throughput.push_back({m, 2.0 * static_cast<double>(m) / (1e-3 + 1e-5 * static_cast<double>(m))});
  }
  return s;
}

}  // namespace

TEST(Adapt, EfficiencyAndGainByHand) {
  // G0 = 256, G = 1024, B = 768: E = (768 + 256) / (768 + 1024) = 1024 / 1792 = 4/7;
  // r = (1024 / 256) x 4/7 = 16/7.
  EXPECT_NEAR(statisticalEfficiency(1024, 256, 768), 4.0 / 7.0, 1e-15);
  EXPECT_NEAR(adascaleGain(1024, 256, 768), 16.0 / 7.0, 1e-14);
  // At G0 nothing changes: E = 1, r = 1.
  EXPECT_DOUBLE_EQ(statisticalEfficiency(256, 256, 100), 1.0);
  EXPECT_DOUBLE_EQ(adascaleGain(256, 256, 100), 1.0);
  // B >> G: perfect scaling, r -> G / G0 = 4 (B = 1e9: r = 4 x (1e9 + 256) / (1e9 + 1024)).
  EXPECT_NEAR(adascaleGain(1024, 256, 1e9), 4.0 * (1e9 + 256) / (1e9 + 1024), 1e-12);
  EXPECT_GT(adascaleGain(1024, 256, 1e9), 3.99999);
  // B << G0: no gain from the larger batch, r -> 1 (B = 1: r = 4 x 257 / 1025 = 1.00293).
  EXPECT_NEAR(adascaleGain(1024, 256, 1), 4.0 * 257 / 1025, 1e-15);
  // B = 256 = G0, G = 768: E = 512 / 1024 = 0.5, r = 3 x 0.5 = 1.5.
  EXPECT_DOUBLE_EQ(statisticalEfficiency(768, 256, 256), 0.5);
  EXPECT_DOUBLE_EQ(adascaleGain(768, 256, 256), 1.5);
  // B unknown (0, negative, NaN, inf): gain 1, efficiency G0 / G = 0.25.
  for (double b : {0.0, -5.0, std::nan(""), std::numeric_limits<double>::infinity()}) {
    EXPECT_DOUBLE_EQ(adascaleGain(1024, 256, b), 1.0) << b;
    EXPECT_DOUBLE_EQ(statisticalEfficiency(1024, 256, b), 0.25) << b;
  }
}

TEST(Adapt, ThroughputModelByHand) {
  auto s = space4();
  s.throughput = {{32, 1280}};  // T1 = 32 x 4 / 1280 = 0.1 s
  // c unknown: every accumulation runs at the measured per-sample rate.
  EXPECT_DOUBLE_EQ(modelledSamplesPerSecond(s, {512, 32, 4}), 1280);
  // c = 0.02 s: T(32, 4) = 4 x 0.08 + 0.02 = 0.34 s for 512 samples: 1505.88/s.
  s.fixed_step_s = 0.02;
  EXPECT_NEAR(modelledSamplesPerSecond(s, {512, 32, 4}), 512 / 0.34, 1e-9);
  EXPECT_NEAR(modelledSamplesPerSecond(s, {128, 32, 1}), 1280, 1e-9);  // a = 1: as measured
  // c = 0.08 s is capped at half of T1 (0.05 s): T(32, 2) = 2 x 0.05 + 0.05 = 0.15 s for 256.
  s.fixed_step_s = 0.08;
  EXPECT_NEAR(modelledSamplesPerSecond(s, {256, 32, 2}), 256 / 0.15, 1e-9);
  // Per-GPU batches not measured have no figure.
  EXPECT_EQ(modelledSamplesPerSecond(s, {512, 64, 2}), 0);
  // Measured twice: the lower figure.
  s.fixed_step_s = 0;
  s.throughput = {{32, 1280}, {32, 1200}};
  EXPECT_DOUBLE_EQ(modelledSamplesPerSecond(s, {128, 32, 1}), 1200);
}

TEST(Adapt, LargerFasterPerGpuBatchIsChosenWhenItPays) {
  auto s = space4();
  s.g0 = 128;
  s.throughput = {{32, 1000}, {64, 1600}};
  // B = 1000: G = 256 (64 x 1 x 4) runs 1600/s at E = 1128 / 1256 = 0.898: goodput 1437,
  // against 1000 at G0 = 128 (32 x 1 x 4).
  const auto d = decideGlobalBatch(s, {128, 32, 1}, 1000);
  EXPECT_TRUE(d.change) << d.why;
  EXPECT_EQ(d.chosen, (AdaptSplit{256, 64, 1})) << d.why;
  EXPECT_NEAR(d.chosen_goodput, 1600.0 * 1128 / 1256, 1e-9);
  EXPECT_NEAR(d.gain, 1.6 * 1128 / 1256, 1e-12);
  EXPECT_TRUE(contains(d.why, "128 (32 x 1 x 4) -> 256 (64 x 1 x 4)")) << d.why;
  // Small B: larger batches are worth little; 256 still runs 1.6x faster per sample,
  // but at B = 10 its efficiency is 138 / 266 = 0.52 < 1 / 1.6: G stays.
  const auto small = decideGlobalBatch(s, {128, 32, 1}, 10);
  EXPECT_FALSE(small.change) << small.why;
  EXPECT_EQ(small.chosen, (AdaptSplit{128, 32, 1}));
}

TEST(Adapt, AccumulationPaysOnlyWhenTheStepHasAFixedCost) {
  auto s = space4();
  s.throughput = {{64, 1600}};  // G0 = 256 = 64 x 1 x 4; T1 = 0.16 s
  // c unknown: accumulation is no faster per sample and E < 1: G stays at G0.
  auto d = decideGlobalBatch(s, {256, 64, 1}, 5000);
  EXPECT_FALSE(d.change) << d.why;
  // c = 0.06 s of each step is the allreduce: with B = 5000, a = 4 gives
  // T = 4 x 0.10 + 0.06 = 0.46 s for 1024 samples (2226/s) at E = 5256 / 6024 = 0.8725.
  s.fixed_step_s = 0.06;
  d = decideGlobalBatch(s, {256, 64, 1}, 5000);
  ASSERT_TRUE(d.change) << d.why;
  EXPECT_EQ(d.chosen.per_gpu, 64);
  EXPECT_GT(d.chosen.accum, 1);
  // The chosen split is the best of all candidates.
  for (const auto& c : adaptCandidates(s, 5000)) EXPECT_LE(c.goodput, d.chosen_goodput);
}

TEST(Adapt, UnknownNoiseScaleOrThroughputKeepsTheBatch) {
  auto s = space4();
  s.throughput = {{64, 1600}, {128, 4000}};
  for (double b : {0.0, -1.0, std::nan("")}) {
    const auto d = decideGlobalBatch(s, {256, 64, 1}, b);
    EXPECT_FALSE(d.change) << b;
    EXPECT_EQ(d.chosen, (AdaptSplit{256, 64, 1}));
    EXPECT_DOUBLE_EQ(d.gain, 1.0);
    EXPECT_TRUE(contains(d.why, "noise scale is not known")) << d.why;
  }
  // The same figures with B known: 128 x 1 x 4 = 512 is 2.5x faster, so it changes.
  EXPECT_TRUE(decideGlobalBatch(s, {256, 64, 1}, 1000).change);
  // The current per-GPU batch never measured: no comparison, no change.
  const auto d = decideGlobalBatch(s, {256, 32, 2}, 1000);
  EXPECT_FALSE(d.change);
  EXPECT_TRUE(contains(d.why, "no measured samples/s for per-GPU batch 32")) << d.why;
}

TEST(Adapt, TheTableInForceLeavesOutBackedOffBatchesAndStandsInForAnUnmeasuredSplit) {
  auto s = space4();
  s.throughput = {{16, 1000}, {32, 1500}, {64, 1600}, {128, 4000}};
  // Nothing backed off and the split in force measured: the table as it is.
  EXPECT_EQ(spaceInForce(s, {}, 32).throughput.size(), 4u);
  // Backed off from 128, then from 64: nothing at or above the smallest (64) is left.
  auto now = spaceInForce(s, {128, 64}, 32);
  ASSERT_EQ(now.throughput.size(), 2u);
  EXPECT_EQ(now.throughput[0].per_gpu, 16);
  EXPECT_EQ(now.throughput[1].per_gpu, 32);
  EXPECT_EQ(now.g0, 256);  // the rest of the space as it was
  // The split in force (24, made by a back-off) was never measured: the table's
  // lowest figure stands for it.
  now = spaceInForce(s, {48}, 24);
  ASSERT_EQ(now.throughput.size(), 3u);
  EXPECT_EQ(now.throughput.back().per_gpu, 24);
  EXPECT_DOUBLE_EQ(now.throughput.back().samples_per_s, 1000);
  // An empty table (a fixed batch.per_gpu before its first figure) stays empty.
  EXPECT_TRUE(spaceInForce(AdaptSpace{}, {64}, 32).throughput.empty());
  EXPECT_EQ(s.throughput.size(), 4u);  // the measured table is not touched

  // With the stand-in a split the search never measured still moves (without it
  // decideGlobalBatch keeps it: UnknownNoiseScaleOrThroughputKeepsTheBatch) ...
  s.throughput = {{64, 1600}, {128, 4000}};
  auto d = decideGlobalBatch(spaceInForce(s, {}, 32), {256, 32, 2}, 1000);
  EXPECT_TRUE(d.change) << d.why;
  EXPECT_EQ(d.chosen, (AdaptSplit{512, 128, 1}));
  // ... but never back to a per-GPU batch that ran out of memory.
  d = decideGlobalBatch(spaceInForce(s, {128}, 32), {256, 32, 2}, 1000);
  EXPECT_FALSE(d.change) << d.why;
  EXPECT_LT(d.chosen.per_gpu, 128);
}

TEST(Adapt, HysteresisStopsFlappingWhileTheNoiseScaleWobbles) {
  // Two candidates of equal goodput at B0 = 2000: G = 256 (64 x 1 x 4, 1600/s, E = 1) and
  // G = 512 (128 x 1 x 4) at s2 = 1600 x 2512 / 2256 (E = 2256 / 2512). B +-3 % moves
  // their ratio by about +-0.3 %: the best flips, but never by more than 5 %.
  const double b0 = 2000;
  auto s = space4();
  s.throughput = {{64, 1600}, {128, 1600.0 * (b0 + 512) / (b0 + 256)}};
  const auto run = [&](double margin) {
    s.margin = margin;
    AdaptSplit current{256, 64, 1};
    int changes = 0;
    for (int k = 0; k < 200; ++k) {
      const double b = b0 * (1.0 + 0.03 * std::sin(0.7 * k));
      const auto d = decideGlobalBatch(s, current, b);
      if (d.change) ++changes;
      current = d.chosen;
    }
    return changes;
  };
  EXPECT_GT(run(0.0), 10);  // without a margin it flaps with B
  EXPECT_EQ(run(kAdaptMargin), 0);
  // Started at 512, it stays at 512 as well.
  s.margin = kAdaptMargin;
  AdaptSplit current{512, 128, 1};
  for (int k = 0; k < 200; ++k) {
    const auto d = decideGlobalBatch(s, current, b0 * (1.0 + 0.03 * std::sin(0.7 * k)));
    EXPECT_FALSE(d.change) << k << ": " << d.why;
  }
}

TEST(Adapt, AMoveBetweenPerGpuBatchesMustBeatTheirMeasurementUncertaintyToo) {
  // B = 2000: E(512) = 2256 / 2512 against E(256) = 1. 128 x 1 x 4 is set x1.08 faster in
  // goodput than 64 x 1 x 4: above the 5 % margin, below 5 % + the figures' uncertainty.
  const double b = 2000;
  const double eff = (b + 256) / (b + 512);
  auto s = space4();
  const auto at = [&](double gain, double u64, double u128) {
    s.throughput = {{64, 1600, u64}, {128, 1600 * gain / eff, u128}};
    return decideGlobalBatch(s, {256, 64, 1}, b);
  };
  const auto plain = at(1.08, 0, 0);  // no interval known: the 5 % margin alone
  EXPECT_TRUE(plain.change) << plain.why;
  EXPECT_EQ(plain.chosen, (AdaptSplit{512, 128, 1}));
  EXPECT_NEAR(plain.gain, 1.08, 1e-9);
  // +-3.7 % and +-1.0 %: the ratio's uncertainty is sqrt(3.7^2 + 1^2) = 3.833 %.
  const auto noisy = at(1.08, 0.037, 0.010);
  EXPECT_FALSE(noisy.change) << noisy.why;
  EXPECT_EQ(noisy.chosen, (AdaptSplit{256, 64, 1}));
  EXPECT_TRUE(contains(noisy.why, "within the 8.833 % margin (5 % + 3.833 % the samples/s "
                                  "figures' uncertainty)"))
      << noisy.why;
  EXPECT_NEAR(requiredMargin(s, {256, 64, 1}, {512, 128, 1}), 0.05 + std::sqrt(0.037 * 0.037 + 0.0001),
              1e-12);
  // A gain beyond both moves.
  const auto clear = at(1.10, 0.037, 0.010);
  EXPECT_TRUE(clear.change) << clear.why;
  // An unknown interval counts as 0: the other one alone is added.
  s.throughput = {{64, 1600, 0.037}, {128, 1900, 0}};
  EXPECT_NEAR(requiredMargin(s, {256, 64, 1}, {512, 128, 1}), 0.087, 1e-12);
  // Splits of the same per-GPU batch share one measurement: no uncertainty added.
  s.throughput = {{64, 1600, 0.2}};
  EXPECT_DOUBLE_EQ(requiredMargin(s, {256, 64, 1}, {512, 64, 2}), kAdaptMargin);
  // A per-GPU batch measured twice keeps the lower samples/s and the larger interval.
  s.throughput = {{64, 1600, 0.01}, {64, 1700, 0.03}, {128, 1900, 0}};
  EXPECT_NEAR(requiredMargin(s, {256, 64, 1}, {512, 128, 1}), 0.08, 1e-12);
  EXPECT_DOUBLE_EQ(modelledSamplesPerSecond(s, {256, 64, 1}), 1600);
}

TEST(Adapt, RelativeUncertaintyOfASearchFigure) {
  EXPECT_DOUBLE_EQ(relativeUncertainty(1000, 950, 1070), 0.06);
  EXPECT_EQ(relativeUncertainty(1000, 0, 0), 0);      // no interval (an old cache entry)
  EXPECT_EQ(relativeUncertainty(1000, 1000, 1000), 0);
  EXPECT_EQ(relativeUncertainty(0, 950, 1070), 0);
  EXPECT_EQ(relativeUncertainty(1000, 950, std::numeric_limits<double>::infinity()), 0);
  EXPECT_EQ(relativeUncertainty(std::nan(""), 950, 1070), 0);
}

TEST(Adapt, TiesGoToTheSmallerGlobalBatch) {
  // B = 768: E(512) = 1024 / 1280 = 0.8; 128 x 1 x 4 at 2000/s gives goodput 1600, as
  // 64 x 1 x 4 = 256 at 1600/s (E = 1) does.
  auto s = space4();
  s.throughput = {{64, 1600}, {128, 2000}};
  const auto cands = adaptCandidates(s, 768);
  ASSERT_GE(cands.size(), 2u);
  ASSERT_EQ(cands[0].split, (AdaptSplit{256, 64, 1}));
  ASSERT_EQ(cands[1].split, (AdaptSplit{512, 128, 1}));
  ASSERT_EQ(cands[0].goodput, cands[1].goodput);  // the premise: an exact tie
  // From 768 (64 x 3 x 4: 1600/s, E = 1024 / 1536) both beat the current split by 50 %.
  const auto d = decideGlobalBatch(s, {768, 64, 3}, 768);
  EXPECT_TRUE(d.change);
  EXPECT_EQ(d.chosen.global, 256);
  // Within one G, the larger per-GPU batch wins a tie of samples/s: 512 = 64 x 2 x 4 and
  // 128 x 1 x 4 both at 1600/s (c = 0).
  s.throughput = {{64, 1600}, {128, 1600}};
  for (const auto& c : adaptCandidates(s, 768)) {
    if (c.split.global == 512) {
      EXPECT_EQ(c.split.per_gpu, 128);
    }
  }
}

TEST(Adapt, EveryCandidateAndDecisionIsAnEqualShardSplitInRange) {
  std::mt19937_64 gen(21);
  const auto pick = [&](int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(gen);
  };
  int spaces = 0, decisions = 0, unreachable = 0;
  for (int trial = 0; trial < 400; ++trial) {
    Config cfg;
    const bool has_bn = pick(0, 1) == 1;
    const int64_t w = pick(1, 16);
    const int64_t q = std::vector<int64_t>{1, 2, 4, 8}[pick(0, 3)];
    cfg.batch.min_per_gpu = pick(1, 4);
    cfg.batch.per_gpu_auto = true;
    cfg.search.multiple_of = q;
    const int64_t min_m = minPerGpu(cfg, has_bn);
    const int64_t m0 = q * ((min_m + q - 1) / q) * pick(1, 4);
    const int64_t g0 = m0 * pick(1, 3) * w;
    cfg.batch.global = g0;
    cfg.batch.adapt = BatchAdapt::kGoodput;
    cfg.batch.adapt_max = pick(0, 1) ? 0 : g0 + pick(0, 20 * g0);
    cfg.batch.adapt_min_steps = pick(1, 16);
    cfg.batch.last_batch = pick(0, 1) ? LastBatch::kDrop : LastBatch::kPad;
    cfg.train.epochs = 1;
    const int64_t n = g0 * pick(1, 200) + pick(0, g0 - 1);
    // What is reachable, by brute force: some G in (G0, ceiling] with G / W a multiple
    // of q and at least the minimum (m = G / W, a = 1 is then a split).
    const int64_t cap = std::min(cfg.batch.adapt_max > 0 ? cfg.batch.adapt_max : 16 * g0,
                                 n / cfg.batch.adapt_min_steps);
    bool reachable = false;
    for (int64_t g = g0 + 1; g <= cap && !reachable; ++g) {
      reachable = g % w == 0 && (g / w) % q == 0 && g / w >= min_m;
    }
    AdaptSpace s;
    try {
      // makePlan checks the range too (the same ConfigError).
      s = adaptSpace(cfg, makePlan(cfg, w, n, has_bn, m0), has_bn);
    } catch (const ConfigError& e) {
      EXPECT_FALSE(reachable) << e.what();
      ++unreachable;
      continue;
    }
    ASSERT_TRUE(reachable) << "W " << w << " G0 " << g0 << " cap " << cap;
    ++spaces;
    // Measured per-GPU batches: the search's ladder and some it would not offer.
    for (int64_t m = 1; m <= 8 * m0; m *= 2) {
      s.throughput.push_back({m, 100.0 * m / (m + 16.0) * static_cast<double>(pick(90, 110))});
    }
    s.throughput.push_back({m0, 90.0 * static_cast<double>(m0)});  // the current split's
    s.throughput.push_back({m0 + 1, 1e6});  // not a multiple of q (unless q is 1)
    s.fixed_step_s = pick(0, 1) ? 0.0 : 0.001 * static_cast<double>(pick(0, 50));
    const double b = static_cast<double>(pick(1, 100000));
    const auto check = [&](const AdaptSplit& x, const std::string& what) {
      EXPECT_EQ(x.global, x.per_gpu * x.accum * w) << what;
      EXPECT_GE(x.accum, 1) << what;
      EXPECT_GE(x.per_gpu, min_m) << what;
      EXPECT_EQ(x.per_gpu % q, 0) << what;
      EXPECT_GE(x.global, g0) << what;
      EXPECT_LE(x.global, cfg.batch.adapt_max > 0 ? cfg.batch.adapt_max : 16 * g0) << what;
      EXPECT_GE(n / x.global, cfg.batch.adapt_min_steps) << what;
    };
    const auto cands = adaptCandidates(s, b);
    for (const auto& c : cands) check(c.split, "candidate");
    const AdaptSplit current{g0, m0, g0 / (m0 * w)};
    const auto d = decideGlobalBatch(s, current, b);
    if (d.change) {
      ++decisions;
      check(d.chosen, "decision");
      EXPECT_GT(d.chosen_goodput, d.current_goodput * (1 + kAdaptMargin));
    } else {
      EXPECT_EQ(d.chosen, current);
    }
  }
  // The generator covers every branch.
  EXPECT_GT(spaces, 50);
  EXPECT_GT(decisions, 10);
  EXPECT_GT(unreachable, 10);
}

TEST(Adapt, LrAtProgressIsLrAtOnWholeSteps) {
  for (const char* yaml : {"optim: {warmup_steps: 7, schedule: cosine, min_lr: 0.001}\n",
                           "optim: {warmup_steps: 3, schedule: step, milestones: [2, 4]}\n",
                           "optim: {schedule: constant}\n"}) {
    const auto p = makePlan(parseConfig(std::string(yaml) + "batch: {global: 64}\n", "t.yaml"), 2,
                            2000, false);
    for (int64_t step = 0; step <= p.total_steps + 3; ++step) {
      EXPECT_DOUBLE_EQ(p.lrAtProgress(static_cast<double>(step)), p.lrAt(step)) << yaml << step;
    }
    // Between whole steps of the warmup the rate never passes the peak.
    for (double x = 0; x < p.warmup_steps + 1.0; x += 0.25) EXPECT_LE(p.lrAtProgress(x), p.lr);
  }
}

TEST(Adapt, AdaScaleScheduleEndsWhenTheProgressReachesThePlannedSteps) {
  const auto p = cosinePlan155();
  ASSERT_EQ(p.total_steps, 155);
  // An adaptive run: G0 for 20 steps, then 128, then 256 (B = 300).
  const double b = 300;
  std::vector<AdaptSegment> history{{0, 64, 1.0}};
  double progress = 0;
  int64_t step = 0, g = 64;
  double last_lr = -1;
  while (progress < static_cast<double>(p.total_steps)) {
    if (step == 20) g = 128, history.push_back({step, g, adascaleGain(128, 64, b)});
    if (step == 50) g = 256, history.push_back({step, g, adascaleGain(256, 64, b)});
    last_lr = adaptLr(p, OptimName::kSgd, AdaptGain::kAdascale, progress, g, b);
    EXPECT_GT(last_lr, 0.001 * adascaleGain(static_cast<double>(g), 64, b) - 1e-12);
    progress += history.back().gain;
    ++step;
    EXPECT_NEAR(adaptProgress(history, step), progress, 1e-9);
  }
  // 20 steps at gain 1, 30 at r(128) = 2 x 364 / 428 = 1.7009, then r(256) = 4 x 364 / 556
  // = 2.6187: 20 + 51.03 = 71.03 after step 50, then ceil(83.97 / 2.6187) = 33 more.
  EXPECT_EQ(step, 83);
  EXPECT_NEAR(adaptProgress(history, 50), 20 + 30 * 2.0 * 364 / 428, 1e-9);
  // The cosine reaches min_lr exactly at the planned progress, not before.
  EXPECT_DOUBLE_EQ(p.lrAtProgress(static_cast<double>(p.total_steps)), 0.001);
  EXPECT_GT(p.lrAtProgress(static_cast<double>(p.total_steps) - 0.5), 0.001);
  EXPECT_GT(last_lr, 0.001);
  // AdamW: the square-root rule on the same clock: G = 256 -> x sqrt(4) = 2.
  EXPECT_DOUBLE_EQ(adaptLr(p, OptimName::kAdamw, AdaptGain::kAdascale, 60.5, 256, b),
                   2.0 * p.lrAtProgress(60.5));
  // B unknown: gain 1, the plan's rate.
  EXPECT_DOUBLE_EQ(adaptLr(p, OptimName::kLars, AdaptGain::kAdascale, 60.5, 256, -1),
                   p.lrAtProgress(60.5));
}

TEST(Adapt, LinearGainCountsSamplesAndScalesTheLrLinearly) {
  // batch.adapt_gain: linear: a step at G is worth G / G0 steps at G0 whatever B,
  // against AdaScale's r = 4 x 364 / 556 = 2.6187 at G = 256, G0 = 64, B = 300.
  EXPECT_DOUBLE_EQ(stepGain(AdaptGain::kLinear, 256, 64, 300), 4.0);
  EXPECT_DOUBLE_EQ(stepGain(AdaptGain::kLinear, 256, 64, -1), 4.0);
  EXPECT_DOUBLE_EQ(stepGain(AdaptGain::kLinear, 64, 64, 300), 1.0);
  EXPECT_NEAR(stepGain(AdaptGain::kAdascale, 256, 64, 300), 4.0 * 364 / 556, 1e-12);
  EXPECT_DOUBLE_EQ(stepGain(AdaptGain::kAdascale, 256, 64, -1), 1.0);
  const auto p = cosinePlan155();
  ASSERT_EQ(p.total_steps, 155);
  EXPECT_DOUBLE_EQ(adaptLr(p, OptimName::kSgd, AdaptGain::kLinear, 60.5, 256, 300),
                   4.0 * p.lrAtProgress(60.5));
  EXPECT_DOUBLE_EQ(adaptLr(p, OptimName::kLars, AdaptGain::kLinear, 60.5, 128, 300),
                   2.0 * p.lrAtProgress(60.5));
  // AdamW keeps its square-root rule.
  EXPECT_DOUBLE_EQ(adaptLr(p, OptimName::kAdamw, AdaptGain::kLinear, 60.5, 256, 300),
                   2.0 * p.lrAtProgress(60.5));
  // The budget is the plan's samples: 20 steps at G0, then G = 256 (4 G0 steps a
  // step): 135 G0 steps left take ceil(135 / 4) = 34 steps, 155 x 64 samples in all
  // (less than one step of 256 past it).
  std::vector<AdaptSegment> history{{0, 64, 1.0}, {20, 256, stepGain(AdaptGain::kLinear, 256, 64, 300)}};
  int64_t step = 0;
  while (adaptProgress(history, step) < static_cast<double>(p.total_steps)) ++step;
  EXPECT_EQ(step, 54);
  const int64_t samples = 20 * 64 + (step - 20) * 256;
  EXPECT_GE(samples, p.total_steps * 64);
  EXPECT_LT(samples - 256, p.total_steps * 64);
}

TEST(Adapt, ProgressHistoryMustStartAtZeroInOrder) {
  EXPECT_DOUBLE_EQ(adaptProgress({}, 12), 12);
  EXPECT_DOUBLE_EQ(adaptProgress({{0, 64, 1.0}, {10, 128, 1.5}}, 14), 10 + 4 * 1.5);
  EXPECT_DOUBLE_EQ(adaptProgress({{0, 64, 1.0}, {10, 128, 1.5}}, 6), 6);
  EXPECT_THROW(adaptProgress({{3, 64, 1.0}}, 5), batchdist::Error);
  EXPECT_THROW(adaptProgress({{0, 64, 1.0}, {10, 128, 1.5}, {10, 256, 2.0}}, 20), batchdist::Error);
}

// Note [batch-size warmup]: G doubles as B_simple reaches the next G0 x 2^k.
TEST(AdaptWarmup, DoublesWhenBReachesTwiceG) {
  const auto s = warmupSpace();
  const AdaptSplit g0{16, 8, 1};
  auto d = decideWarmupBatch(s, g0, 31.9);
  EXPECT_FALSE(d.change);
  EXPECT_EQ(d.chosen, g0);
  EXPECT_TRUE(contains(d.why, "global batch stays 16 (8 x 1 x 2): B_simple 31.9 < 32 = G0 x 2^1, "
                              "the next doubling")) << d.why;
  d = decideWarmupBatch(s, g0, 32);
  ASSERT_TRUE(d.change);
  EXPECT_EQ(d.chosen, (AdaptSplit{32, 16, 1}));
  EXPECT_TRUE(contains(d.why, "global batch 16 (8 x 1 x 2) -> 32 (16 x 1 x 2): B_simple 32 >= 32 = "
                              "G0 x 2^1 (batch-size warmup); its fastest modelled split, ")) << d.why;
  // The split is goodput's fastest modelled one for that G (adaptCandidates).
  int found = 0;
  for (const auto& c : adaptCandidates(s, 32)) {
    if (c.split.global != 32) continue;
    EXPECT_EQ(c.split, d.chosen);
    ++found;
  }
  EXPECT_EQ(found, 1);
  // From 32 the next doubling is 64: B = 63.9 keeps it, 64 doubles it.
  EXPECT_FALSE(decideWarmupBatch(s, d.chosen, 63.9).change);
  EXPECT_EQ(decideWarmupBatch(s, d.chosen, 64).chosen, (AdaptSplit{64, 32, 1}));
}

TEST(AdaptWarmup, JumpsSeveralDoublingsWhenBIsFarAbove) {
  const auto s = warmupSpace();
  auto d = decideWarmupBatch(s, {16, 8, 1}, 300);
  EXPECT_EQ(d.chosen, (AdaptSplit{256, 128, 1}));
  EXPECT_TRUE(contains(d.why, "-> 256 (128 x 1 x 2): B_simple 300 >= 256 = G0 x 2^4")) << d.why;
  // Past the ceiling (1024 = G0 x 2^6) B buys nothing more.
  d = decideWarmupBatch(s, {32, 16, 1}, 1e6);
  EXPECT_EQ(d.chosen, (AdaptSplit{1024, 512, 1}));
  d = decideWarmupBatch(s, d.chosen, 1e7);
  EXPECT_FALSE(d.change);
  EXPECT_TRUE(contains(d.why, "no doubling of G0 = 16 above it within the ceiling 1024")) << d.why;
}

TEST(AdaptWarmup, NeverShrinksWhenBFalls) {
  const auto s = warmupSpace();
  const AdaptSplit at256{256, 128, 1};
  for (const double b : {511.0, 255.0, 100.0, 17.0, 16.0, 1.0, 0.01}) {
    const auto d = decideWarmupBatch(s, at256, b);
    EXPECT_FALSE(d.change) << b;
    EXPECT_EQ(d.chosen, at256) << b;
  }
  EXPECT_TRUE(contains(decideWarmupBatch(s, at256, 100).why,
                       "global batch stays 256 (128 x 1 x 2): B_simple 100 < 512 = G0 x 2^5, the "
                       "next doubling"));
}

TEST(AdaptWarmup, StaysWhileBIsUnknown) {
  const auto s = warmupSpace();
  const AdaptSplit g0{16, 8, 1};
  for (const double b : {-1.0, 0.0, std::nan(""), std::numeric_limits<double>::infinity()}) {
    const auto d = decideAdaptive(s, g0, b);  // space.mode: warmup
    EXPECT_FALSE(d.change) << b;
    EXPECT_EQ(d.chosen, g0) << b;
    EXPECT_TRUE(contains(d.why, "the gradient noise scale is not known yet")) << d.why;
  }
}

TEST(AdaptWarmup, TheCeilingAndTheDataBoundTheDoublings) {
  AdaptSpace s;
  ASSERT_EQ(spaceErrorOf("batch: {global: 16, adapt: warmup, adapt_max: 100}\n"
                         "model: {batchnorm: false}\n", 2, 100000, &s),
            "<no error>");
  EXPECT_EQ(s.mode, BatchAdapt::kWarmup);
  EXPECT_EQ(s.ceiling, 100);
  s.throughput = {{8, 1000.0}};  // G0's per-GPU batch alone measured
  const AdaptSplit g0{16, 8, 1};
  // 128 = G0 x 2^3 is past adapt_max 100: 64, by accumulation of the measured 8.
  auto d = decideAdaptive(s, g0, 1e6);
  EXPECT_EQ(d.chosen, (AdaptSplit{64, 8, 4}));
  EXPECT_FALSE(decideAdaptive(s, d.chosen, 1e6).change);
  // The data: 1000 samples leave 8 steps an epoch up to 125 (batch.adapt_min_steps 8).
  ASSERT_EQ(spaceErrorOf("batch: {global: 16, adapt: warmup}\nmodel: {batchnorm: false}\n", 2, 1000, &s),
            "<no error>");
  EXPECT_EQ(s.ceiling, 125);
  EXPECT_EQ(decideAdaptive(s, g0, 1e6).chosen.global, 64);
}

TEST(AdaptWarmup, OnlyValidSplitsAndTheSplitInForceWhenNothingIsMeasured) {
  // W = 2, G0 = 48 (24 x 1 x 2), per-GPU batches multiples of 8.
  AdaptSpace s;
  s.mode = BatchAdapt::kWarmup;
  s.world_size = 2;
  s.g0 = 48;
  s.adapt_max = s.ceiling = 768;
  s.dataset_size = 100000;
  s.multiple_of = 8;
  s.throughput = {{8, 1000.0}, {12, 1e6}, {48, 9000.0}};  // 12: not a multiple of 8, never used
  // An out-of-memory back-off left 12 x 2 x 2, not a valid split: with B below G, G is
  // kept on a valid split; with B past 192 = G0 x 2^2, the doubling.
  const AdaptSplit backed{48, 12, 2};
  ASSERT_FALSE(isAdaptSplit(s, backed));
  auto d = decideWarmupBatch(s, backed, 30);
  EXPECT_EQ(d.chosen, (AdaptSplit{48, 8, 3}));
  EXPECT_TRUE(contains(d.why, "the current split is outside the valid splits of [48, 768]")) << d.why;
  EXPECT_EQ(decideWarmupBatch(s, backed, 200).chosen, (AdaptSplit{192, 48, 2}));
  // No samples/s figures: the per-GPU batch in force with more accumulation (it is
  // known to fit) ...
  s.throughput.clear();
  d = decideWarmupBatch(s, {48, 24, 1}, 100);
  EXPECT_EQ(d.chosen, (AdaptSplit{96, 24, 2}));
  EXPECT_TRUE(contains(d.why, "no samples/s figure for its per-GPU batches")) << d.why;
  // ... and where that is not valid, the largest valid per-GPU batch below it (a
  // larger one is not known to fit); with none in force (a resume), the largest.
  EXPECT_EQ(decideWarmupBatch(s, backed, 100).chosen, (AdaptSplit{96, 8, 6}));
  EXPECT_EQ(warmupSplit(s, 96, backed).value_or(AdaptSplit{}), (AdaptSplit{96, 8, 6}));
  EXPECT_EQ(warmupSplit(s, 96, {96, 0, 0}).value_or(AdaptSplit{}), (AdaptSplit{96, 48, 1}));
  EXPECT_FALSE(warmupSplit(s, 97, backed).has_value());  // not a multiple of W
  EXPECT_FALSE(warmupSplit(s, 96, {48, 6, 4}).has_value());  // no multiple of 8 <= 6
}

// Random spaces and noisy, mostly rising B: every decision is the largest G0 x 2^k
// at or above G within B and the ceiling, on a valid split (the fastest modelled),
// the same when asked twice.
TEST(AdaptWarmup, RandomWalksOfBOnlyEverTakeTheLargestDoublingWithinB) {
  std::mt19937_64 gen(7);
  const auto pick = [&](int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(gen);
  };
  std::uniform_real_distribution<double> wobble(-1.0, 1.5);
  int changes = 0, jumps = 0;
  for (int trial = 0; trial < 200; ++trial) {
    AdaptSpace s;
    s.mode = BatchAdapt::kWarmup;
    s.world_size = pick(1, 8);
    const int64_t q = std::vector<int64_t>{1, 2, 4, 8}[pick(0, 3)];
    s.multiple_of = q;
    s.min_per_gpu = pick(1, 4);
    const int64_t m0 = q * ((s.min_per_gpu + q - 1) / q) * pick(1, 3);
    s.g0 = m0 * pick(1, 3) * s.world_size;
    s.adapt_max = s.ceiling = s.g0 * pick(1, 40);
    s.dataset_size = s.ceiling * 8;
    for (int64_t m = q; m <= 16 * m0; m *= 2) {
      if (pick(0, 3) > 0) s.throughput.push_back({m, static_cast<double>(m * pick(50, 150)) / (m + 8.0)});
    }
    s.fixed_step_s = pick(0, 1) ? 0.0 : 0.001 * static_cast<double>(pick(0, 20));
    AdaptSplit cur{s.g0, m0, s.g0 / (m0 * s.world_size)};
    double b = static_cast<double>(pick(1, 4));
    for (int decision = 0; decision < 30; ++decision) {
      b = std::max(0.5, b * std::exp(wobble(gen)));
      const auto d = decideWarmupBatch(s, cur, b);
      EXPECT_EQ(decideWarmupBatch(s, cur, b).why, d.why);
      int64_t want = cur.global;  // by brute force
      for (int64_t g = s.g0; g <= s.ceiling && static_cast<double>(g) <= b; g *= 2) {
        want = std::max(want, g);
      }
      ASSERT_EQ(d.chosen.global, want) << d.why;
      EXPECT_EQ(d.change, want != cur.global);
      EXPECT_TRUE(isAdaptSplit(s, d.chosen)) << d.why;
      if (d.change) {
        ++changes;
        jumps += d.chosen.global > 2 * cur.global ? 1 : 0;
        const int64_t r = d.chosen.global / s.g0;
        EXPECT_TRUE(d.chosen.global % s.g0 == 0 && (r & (r - 1)) == 0) << d.why;
        EXPECT_LE(static_cast<double>(d.chosen.global), b);
        bool measured = false;
        for (const auto& c : adaptCandidates(s, b)) {
          if (c.split.global != want) continue;
          EXPECT_EQ(c.split, d.chosen) << d.why;
          measured = true;
        }
        if (!measured) {
          EXPECT_EQ(d.chosen.per_gpu, cur.per_gpu) << d.why;  // no figure: the m in force
        }
      }
      cur = d.chosen;
    }
  }
  EXPECT_GT(changes, 100);
  EXPECT_GT(jumps, 20);
}

TEST(AdaptWarmup, TokenRunsGiveTheGlobalBatchInTokensToo) {
  auto s = warmupSpace();
  // Note [tokens per sample]: samples that are not tokens print as before.
  EXPECT_EQ(splitText({32, 16, 1}, 2), "32 (16 x 1 x 2)");
  EXPECT_FALSE(contains(decideWarmupBatch(s, {16, 8, 1}, 40).why, "tokens"));
  s.tokens_per_sample = 64;
  const auto d = decideWarmupBatch(s, {16, 8, 1}, 40);
  EXPECT_TRUE(contains(d.why, "global batch 16 (8 x 1 x 2; 1024 tokens) -> 32 (16 x 1 x 2; 2048 "
                              "tokens)")) << d.why;
  s.mode = BatchAdapt::kGoodput;
  const auto g = decideAdaptive(s, {16, 8, 1}, 40);
  EXPECT_TRUE(contains(g.why, "16 (8 x 1 x 2; 1024 tokens)")) << g.why;
}

// Note [adaptive checkpoint]: a resume on another world size.
TEST(AdaptWarmup, AResumeOnAnotherWorldKeepsGOrTakesTheLargestDoublingBelowIt) {
  AdaptSpace s;  // 3 ranks, G0 = 24 (8 x 1 x 3)
  s.mode = BatchAdapt::kWarmup;
  s.world_size = 3;
  s.g0 = 24;
  s.adapt_max = s.ceiling = 768;
  s.dataset_size = 100000;
  s.throughput = {{8, 1000.0}, {16, 1800.0}};
  const auto resumed = [&](int64_t g, double b) { return resumeSplit(s, g, b).value_or(AdaptSplit{}); };
  EXPECT_EQ(resumed(96, 100), (AdaptSplit{96, 16, 2}));  // splits: kept, on its fastest split
  EXPECT_EQ(resumed(72, 100), (AdaptSplit{72, 8, 3}));   // kept, though not a doubling
  EXPECT_EQ(resumed(64, 1e6), (AdaptSplit{48, 16, 1}));  // 64 does not split over 3: 48 = G0 x 2
  // goodput: G kept where measured, else the best candidate for B.
  s.mode = BatchAdapt::kGoodput;
  EXPECT_EQ(resumed(96, 100), (AdaptSplit{96, 16, 2}));
  const auto cands = adaptCandidates(s, 100);
  const auto best = std::max_element(cands.begin(), cands.end(), [](const auto& a, const auto& b) {
    return a.goodput < b.goodput;
  });
  ASSERT_NE(best, cands.end());
  EXPECT_EQ(resumed(64, 100), best->split);
}

TEST(AdaptConfig, ReadsTheKeysAndDefaults) {
  auto cfg = parseConfig("batch: {global: 256}\n", "t.yaml");
  EXPECT_EQ(cfg.batch.adapt, BatchAdapt::kOff);
  EXPECT_EQ(cfg.batch.adapt_max, 0);
  EXPECT_EQ(cfg.batch.adapt_every_steps, 100);
  EXPECT_EQ(cfg.batch.adapt_min_steps, 8);
  EXPECT_FALSE(cfg.batch.adapt_in_warmup);
  EXPECT_EQ(cfg.batch.adapt_gain, AdaptGain::kAdascale);
  EXPECT_EQ(cfg.resolved["batch"]["adapt"], "off");
  EXPECT_EQ(cfg.resolved["batch"]["adapt_gain"], "adascale");
  cfg = parseConfig("batch: {global: 256, adapt: goodput, adapt_max: 2048, adapt_every_steps: 50, "
                    "adapt_min_steps: 4, adapt_in_warmup: true, adapt_gain: linear}\n", "t.yaml");
  EXPECT_EQ(cfg.batch.adapt, BatchAdapt::kGoodput);
  EXPECT_EQ(cfg.batch.adapt_max, 2048);
  EXPECT_EQ(cfg.batch.adapt_every_steps, 50);
  EXPECT_EQ(cfg.batch.adapt_min_steps, 4);
  EXPECT_TRUE(cfg.batch.adapt_in_warmup);
  EXPECT_EQ(cfg.batch.adapt_gain, AdaptGain::kLinear);
  // G0 derivable from a numeric per_gpu is enough.
  EXPECT_NO_THROW(parseConfig("batch: {per_gpu: 32, adapt: goodput}\n", "t.yaml"));
  cfg = parseConfig("batch: {global: 256, adapt: warmup}\n", "t.yaml");
  EXPECT_EQ(cfg.batch.adapt, BatchAdapt::kWarmup);
  EXPECT_EQ(cfg.resolved["batch"]["adapt"], "warmup");
}

TEST(AdaptConfig, ErrorsNameTheKeyTheValueAndTheFix) {
  auto msg = configError("batch: {global: auto, adapt: goodput}\n");
  EXPECT_TRUE(contains(msg, "test.yaml: batch.adapt: goodput starts from batch.global")) << msg;
  EXPECT_TRUE(contains(msg, "batch.global is auto; set batch.global")) << msg;
  msg = configError("batch: {per_gpu: auto, adapt: goodput}\n");
  EXPECT_TRUE(contains(msg, "batch.global is not given")) << msg;
  msg = configError("batch: {global: 256, adapt: goodput, adapt_max: 128}\n");
  EXPECT_TRUE(contains(msg, "test.yaml: batch.adapt_max: 128 is not above batch.global (256)")) << msg;
  EXPECT_TRUE(contains(msg, "0 means 16 x batch.global = 4096")) << msg;
  msg = configError("batch: {global: 256, adapt: goodput, last_batch: keep}\n"
                      "model: {batchnorm: false}\n");
  EXPECT_TRUE(contains(msg, "batch.last_batch: keep cannot be used with batch.adapt: goodput")) << msg;
  EXPECT_TRUE(contains(msg, "use drop or pad")) << msg;
  msg = configError("batch: {global: 256, adapt: goodput}\ntrain: {noise_scale: false}\n");
  EXPECT_TRUE(contains(msg, "train.noise_scale: false, but batch.adapt: goodput")) << msg;
  msg = configError("batch: {global: 256, adapt: godput}\n");
  EXPECT_TRUE(contains(msg, "did you mean 'goodput'")) << msg;
  msg = configError("batch: {global: 256, adapt: goodput, adapt_gain: sqrt}\n");
  EXPECT_TRUE(contains(msg, "batch.adapt_gain")) << msg;
  EXPECT_TRUE(contains(msg, "'sqrt' is not one of adascale | linear")) << msg;
  msg = configError("batch: {global: 256, adapt_every_steps: 0}\n");
  EXPECT_TRUE(contains(msg, "batch.adapt_every_steps: must be >= 1, got 0")) << msg;
  // adapt off: the adapt keys are read, nothing is required.
  EXPECT_EQ(configError("batch: {global: auto, adapt_max: 16}\n"), "<no error>");
}

// Note [batch-size warmup]: warmup starts from G0 and re-cuts the epoch as goodput
// does, so it has goodput's checks, each naming the mode in force.
TEST(AdaptConfig, WarmupHasGoodputsChecksNamingItsMode) {
  // (A value not in the set: tests/config_test.cc, OutOfRangeValuesAreRefused.)
  auto msg = configError("batch: {global: auto, adapt: warmup}\n");
  EXPECT_TRUE(contains(msg, "test.yaml: batch.adapt: warmup starts from batch.global")) << msg;
  msg = configError("batch: {global: 256, adapt: warmup, adapt_max: 128}\n");
  EXPECT_TRUE(contains(msg, "batch.adapt_max: 128 is not above batch.global (256)")) << msg;
  msg = configError("batch: {global: 256, adapt: warmup, last_batch: keep}\nmodel: {batchnorm: false}\n");
  EXPECT_TRUE(contains(msg, "batch.last_batch: keep cannot be used with batch.adapt: warmup")) << msg;
  msg = configError("batch: {global: 256, adapt: warmup}\ntrain: {noise_scale: false}\n");
  EXPECT_TRUE(contains(msg, "train.noise_scale: false, but batch.adapt: warmup")) << msg;
  msg = spaceErrorOf("batch: {global: 256, per_gpu: 32, adapt: warmup, adapt_max: 300}\n"
                     "model: {batchnorm: false}\n", 8, 100000);
  EXPECT_TRUE(contains(msg, "batch.adapt: warmup has nothing to adapt: no global batch in (256, 300]"))
      << msg;
}

TEST(AdaptConfig, UnreachableCeilingsNameTheNearestSplit) {
  // W = 8, per_gpu fixed at 32: G = 32 x a x 8, so after 256 comes 512.
  auto msg = spaceErrorOf("batch: {global: 256, per_gpu: 32, adapt: goodput, adapt_max: 300}\n"
                          "model: {batchnorm: false}\n", 8, 100000);
  EXPECT_TRUE(contains(msg, "no global batch in (256, 300]")) << msg;
  EXPECT_TRUE(contains(msg, "the nearest above G0=256 is 512 (64 per rank)")) << msg;
  EXPECT_TRUE(contains(msg, "raise batch.adapt_max to at least 512")) << msg;
  // The data caps the ceiling: 3000 samples / 8 steps = 375 < 512.
  msg = spaceErrorOf("batch: {global: 256, per_gpu: 32, adapt: goodput}\nmodel: {batchnorm: false}\n",
                     8, 3000);
  EXPECT_TRUE(contains(msg, "3000 training samples cap it at 375 for batch.adapt_min_steps=8; "
                            "lower that to 5 to reach 512")) << msg;
  // G0 itself leaves fewer than 8 steps an epoch: 2000 / 256 = 7.
  msg = spaceErrorOf("batch: {global: 256, adapt: goodput}\nmodel: {batchnorm: false}\n", 8, 2000);
  EXPECT_TRUE(contains(msg, "G0=256 already leaves 7 step(s) an epoch")) << msg;
  EXPECT_TRUE(contains(msg, "lower batch.adapt_min_steps to 7")) << msg;
  // Reachable, but adapt_max beyond the data: a warning naming what is used.
  AdaptSpace s;
  EXPECT_EQ(spaceErrorOf("batch: {global: 256, adapt: goodput}\nmodel: {batchnorm: false}\n", 8,
                         10000, &s),
            "<no error>");
  EXPECT_EQ(s.adapt_max, 4096);
  EXPECT_EQ(s.ceiling, 1250);
  ASSERT_EQ(s.warnings.size(), 1u);
  EXPECT_TRUE(contains(s.warnings[0], "batch.adapt_max=4096 is more than the 10000 training samples "
                                      "allow with batch.adapt_min_steps=8 steps an epoch; the global "
                                      "batch stays at or below 10000 / 8 = 1250")) << s.warnings[0];
}

TEST(AdaptConfig, ThePlanChecksTheAdaptiveRange) {
  // makePlan runs adaptSpace(): its errors and warnings reach `batchdist plan`.
  const auto cfg = parseConfig("batch: {global: 256, adapt: goodput}\nmodel: {batchnorm: false}\n",
                               "test.yaml");
  const auto p = makePlan(cfg, 8, 10000, false);
  ASSERT_GE(p.warnings.size(), 1u);
  EXPECT_TRUE(contains(p.warnings.back(), "the global batch stays at or below 10000 / 8 = 1250"))
      << p.warnings.back();
  EXPECT_THROW(makePlan(cfg, 8, 2000, false), ConfigError);  // 2000 / 256 = 7 steps < 8
  // adapt off: no check, no warning about it.
  const auto off = makePlan(parseConfig("batch: {global: 256}\n", "test.yaml"), 8, 2000, false);
  for (const auto& w : off.warnings) EXPECT_FALSE(contains(w, "adapt")) << w;
}

// Note [adaptive cut]: G changes at step boundaries mid-epoch; the epoch's samples
// are still taken in permutation order, each once, every micro-batch exactly m.
TEST(AdaptiveCut, EverySampleOnceInOrderAcrossChangesOfG) {
  for (const auto policy : {LastBatch::kDrop, LastBatch::kPad}) {
    auto cfg = parseConfig("batch: {global: 64}\nmodel: {batchnorm: false}\n", "t.yaml");
    cfg.batch.last_batch = policy;
    const int64_t n = 1000, w = 2;
    const Plan p0 = makePlan(cfg, w, n, false);
    Sharder sharder(p0, 7);
    sharder.setEpoch(3);
    const auto perm = sharder.permutation();
    // Steps 0..4 at 64 (32 x 1 x 2), 5..6 at 176 (88 x 1 x 2), then 96 (24 x 2 x 2).
    const std::vector<std::pair<int64_t, std::array<int64_t, 3>>> changes = {
        {5, {176, 88, 1}}, {7, {96, 24, 2}}};
    std::vector<int64_t> seen_real, seen_pad;
    Plan plan = p0;
    int64_t steps = sharder.stepsInEpoch();
    EXPECT_EQ(steps, p0.steps_per_epoch);
    std::size_t next = 0;
    for (int64_t s = 0; s < steps; ++s) {
      if (next < changes.size() && changes[next].first == s) {
        const auto [g, m, a] = changes[next].second;
        const int64_t pos = sharder.position(s);
        EXPECT_EQ(pos, s == 5 ? 5 * 64 : 5 * 64 + 2 * 176);
        plan = withGlobal(plan, g, m, a);
        sharder = sharder.withPlan(plan);
        sharder.setCut(s, pos);
        // Past every loader index the epoch used before (those are < pos).
        EXPECT_EQ(sharder.jobIndex(s), pos);
        steps = sharder.stepsInEpoch();
        ++next;
      }
      int64_t real = 0;
      for (int64_t r = 0; r < w; ++r) {
        for (int64_t k = 0; k < plan.accum; ++k) {
          const auto mb = sharder.micro(s, k, r);
          ASSERT_EQ(static_cast<int64_t>(mb.indices.size()), plan.per_gpu) << "step " << s;
          for (std::size_t i = 0; i < mb.indices.size(); ++i) {
            (mb.weights[i] > 0 ? seen_real : seen_pad).push_back(mb.indices[i]);
            real += mb.weights[i] > 0 ? 1 : 0;
          }
        }
      }
      EXPECT_EQ(real, sharder.realSamples(s)) << "step " << s;
    }
    // 5 x 64 + 2 x 176 = 672; 328 left: drop takes three steps of 96 (40 dropped),
    // pad four (the last padded with 56).
    const int64_t tail = n - 672;
    EXPECT_EQ(steps, policy == LastBatch::kDrop ? 10 : 11);
    const int64_t used = policy == LastBatch::kDrop ? 672 + 3 * 96 : n;
    ASSERT_EQ(static_cast<int64_t>(seen_real.size()), used);
    EXPECT_TRUE(std::equal(seen_real.begin(), seen_real.end(), perm.begin()));
    EXPECT_EQ(static_cast<int64_t>(seen_pad.size()), policy == LastBatch::kDrop ? 0 : 4 * 96 - tail);
  }
}

TEST(AdaptiveCut, WithGlobalPlansTheStepsOfTheNewBatch) {
  auto cfg = parseConfig("batch: {global: 64, last_batch: pad}\nmodel: {batchnorm: false}\n", "t.yaml");
  const Plan p0 = makePlan(cfg, 2, 1438, false);
  const Plan p = withGlobal(p0, 176, 44, 2);
  EXPECT_EQ(p.steps_per_epoch, 9);  // 1438 / 176 = 8.2: the last padded
  EXPECT_EQ(p.samples_padded, 9 * 176 - 1438);
  EXPECT_EQ(p.lr, p0.lr);            // the lr and the run's length stay the plan at G0's
  EXPECT_EQ(p.total_steps, p0.total_steps);
  EXPECT_THROW(withGlobal(p0, 176, 40, 2), batchdist::Error);  // 40 x 2 x 2 != 176
}

// Note [adaptive checkpoint]: the record's entries are keyed (format 4) and read
// back the same; a format 2/3 record's positional arrays read to the same values.
TEST(AdaptRecord, KeyedEntriesRoundTripAndPositionalOnesStillRead) {
  namespace ar = batchdist::worker::adapt_record;
  const std::vector<ThroughputPoint> tp{{8, 1200.5, 30.0}, {16, 2100.0, 0.0},
                                        {32, std::nan(""), 1.0}};  // not finite: left out
  const std::vector<AdaptSegment> seg{{0, 64, 1.0}, {40, 128, 1.7}};
  const std::vector<BatchChange> hist{{0, 64, 32, 1, 1.0, -1, 1.0, "start at G0"},
                                      {40, 128, 32, 2, 1.7, 210.5, 0.81, "goodput +12 %"}};
  const NoiseScaleEstimator::State noise{12, 0.5, 3.25, 0.9, 4, 0.125, 1.5};
  const auto tpj = ar::throughputJson(tp);
  ASSERT_EQ(tpj.size(), 2u);
  EXPECT_EQ(tpj[0].at("per_gpu"), 8);
  const auto tp2 = ar::throughputFrom(tpj);
  EXPECT_EQ(tp2[1].per_gpu, 16);
  EXPECT_DOUBLE_EQ(tp2[0].uncertainty, 30.0);
  const auto seg2 = ar::segmentsFrom(ar::segmentsJson(seg));
  ASSERT_EQ(seg2.size(), 2u);
  EXPECT_EQ(seg2[1].begin_step, 40);
  EXPECT_DOUBLE_EQ(seg2[1].gain, 1.7);
  const auto hist2 = ar::historyFrom(ar::historyJson(hist));
  ASSERT_EQ(hist2.size(), 2u);
  EXPECT_EQ(hist2[1].why, "goodput +12 %");
  EXPECT_DOUBLE_EQ(hist2[1].efficiency, 0.81);
  const auto n2 = ar::noiseFrom(ar::noiseJson(noise));
  EXPECT_EQ(n2.steps, 12);
  EXPECT_DOUBLE_EQ(n2.window_tr, 1.5);
  // The positional forms of formats 2 and 3 (throughput with two or three values).
  const auto old = nlohmann::ordered_json::parse(R"({
    "throughput": [[8, 1200.5, 30.0], [16, 2100.0]],
    "segments": [[0, 64, 1.0], [40, 128, 1.7]],
    "history": [[40, 128, 32, 2, 1.7, 210.5, 0.81, "goodput +12 %"]],
    "noise": [12, 0.5, 3.25, 0.9, 4, 0.125, 1.5]})");
  const auto otp = ar::throughputFrom(old["throughput"]);
  EXPECT_EQ(otp[1].per_gpu, 16);
  EXPECT_DOUBLE_EQ(otp[1].uncertainty, 0.0);
  EXPECT_EQ(ar::segmentsFrom(old["segments"])[1].global, 128);
  EXPECT_EQ(ar::historyFrom(old["history"])[0].accum, 2);
  EXPECT_DOUBLE_EQ(ar::noiseFrom(old["noise"]).ema_tr, 3.25);
  // A damaged entry throws (restoreAdaptive names the record as damaged).
  EXPECT_THROW(ar::segmentsFrom(nlohmann::ordered_json::parse(R"([{"begin_step": 0}])")),
               nlohmann::json::exception);
}
