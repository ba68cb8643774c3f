// Note [lever search]: the batch search weighs dist.shard and model.recompute with
// the per-GPU batch: the memory model, its predictions, what it times and prunes,
// the choice, and how the result travels (search.json, the cache, the table).

#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "simulated_measurer.h"
#include "tests/config_errors.h"
#include "tests/scratch_dir.h"
#include "tests/thread_ranks.h"
#include "worker/search/cache.h"
#include "worker/search/levers.h"
#include "worker/search/output.h"
#include "worker/search/search.h"

using namespace batchdist;
using namespace batchdist::worker;
using batchdist::testsupport::SimulatedMeasurer;

namespace {

const Levers kPlain{Shard::kNone, Recompute::kOff};
const Levers kShard{Shard::kOptimizer, Recompute::kOff};
const Levers kRecompute{Shard::kNone, Recompute::kOn};
const Levers kBoth{Shard::kOptimizer, Recompute::kOn};
const Levers kGrads{Shard::kGradients, Recompute::kOff};
const Levers kGradsBoth{Shard::kGradients, Recompute::kOn};
const Levers kParams{Shard::kParameters, Recompute::kOff};

std::vector<SearchResult> searchOnRanks(const Config& cfg, std::vector<SimulatedMeasurer>& measurers) {
  std::vector<SearchResult> results(measurers.size());
  batchdist::testsupport::runRanks(static_cast<int>(measurers.size()), [&](collective::Communicator& comm) {
    BatchSearch search(cfg, comm, measurers[comm.rank()], 1 << 20, false);
    results[comm.rank()] = search.run(nullptr);
  });
  return results;
}

const LeverOutcome& outcome(const SearchResult& r, const Levers& l) {
  for (const auto& o : r.levers) {
    if (o.levers == l) return o;
  }
  throw std::runtime_error("no outcome for " + leversText(l));
}

/// Peak = 100 + fixed + 4 MB a sample (1 under recompute) against a `budget_mb`
/// budget (0: none); fixed = parameters 10 + gradients 10 + state 20 (10 sharded
/// over 2 ranks; gradients 5 too under dist.shard: gradients); samples/s
/// 1000 m / (m + `half`), recompute 20 % slower, sharding `shard_cost` (twice that
/// under gradients).
SimulatedMeasurer leverMeasurer(double budget_mb, double half = 32, double shard_cost = 0.02) {
  SimulatedMeasurer m(1 << 30, 1000, half, 100, 4, budget_mb);
  m.withLevers(10, 20, 2, 0.25, 0.2, shard_cost);
  return m;
}
SimulatedMeasurer memoryBound() { return leverMeasurer(400); }

const char* kAutoLevers =
    "batch: {per_gpu: auto}\n"
    "dist: {shard: auto}\n"
    "model: {recompute: auto}\n"
    "search: {min: 8, max: 256, multiple_of: 8, tolerance: 0.05, rounds: 2}\n";

}  // namespace

TEST(LeverSearch, WhereMemoryBoundsThePlainWalkTheModelPredictsWhatEachLeverFits) {
  const auto cfg = parseConfig(kAutoLevers, "t.yaml");
  std::vector<SimulatedMeasurer> m{memoryBound(), memoryBound()};
  const auto res = searchOnRanks(cfg, m);
  const auto& r = res[0];
  const std::string table = searchTable(r);
  // Plain: 140 + 4 m <= 400 -> 64 (a multiple of 8); sharded: 130 + 4 m -> 64 too,
  // gradients as well 125 + 4 m -> 64; recompute: 140 + m -> 260, capped by
  // search.max at 256; with either sharding: 256.
  ASSERT_EQ(r.levers.size(), 6u) << table;
  EXPECT_EQ(outcome(r, kPlain).predicted_max, 64) << table;
  EXPECT_EQ(outcome(r, kPlain).measured_max, 64) << table;
  EXPECT_EQ(outcome(r, kShard).predicted_max, 64) << table;
  EXPECT_EQ(outcome(r, kRecompute).predicted_max, 256) << table;
  EXPECT_EQ(outcome(r, kRecompute).measured_max, 256) << table;
  EXPECT_EQ(outcome(r, kBoth).predicted_max, 256) << table;
  EXPECT_EQ(outcome(r, kBoth).measured_max, 256) << table;
  EXPECT_EQ(outcome(r, kGrads).predicted_max, 64) << table;
  EXPECT_EQ(outcome(r, kGradsBoth).predicted_max, 256) << table;
  EXPECT_EQ(outcome(r, kGradsBoth).measured_max, 256) << table;
  // The fixed parts from the formulas, the rest fitted exactly (a straight line here).
  EXPECT_DOUBLE_EQ(outcome(r, kPlain).fixed_mb, 40);
  EXPECT_DOUBLE_EQ(outcome(r, kShard).fixed_mb, 30);
  EXPECT_DOUBLE_EQ(outcome(r, kGrads).fixed_mb, 25);
  EXPECT_NEAR(outcome(r, kPlain).per_sample_mb, 4, 1e-9);
  EXPECT_NEAR(outcome(r, kRecompute).per_sample_mb, 1, 1e-9);
  EXPECT_NEAR(outcome(r, kRecompute).intercept_mb, 100, 1e-9);
  // Sharding fits no larger batch: timed once at the walk's pick (the same batch in less memory).
  EXPECT_NE(outcome(r, kShard).verdict.find("timed at the walk's pick, per-GPU 64"), std::string::npos)
      << outcome(r, kShard).verdict;
  // Recompute at 256 (711 samples/s) beats plain's best, 64 (667), by more than the
  // tolerance; sharded as well it is 2 % (optimizer) or 4 % (gradients) slower,
  // within the tolerance, and of those the gradients' peak is the smallest.
  EXPECT_EQ(r.chosen, 256) << table;
  EXPECT_EQ(r.chosen_levers, kGradsBoth) << table;
  EXPECT_NE(r.why.find("under shard gradients + recompute"), std::string::npos) << r.why;
  // Every rank walked the same sizes under the same levers, and agreed.
  ASSERT_EQ(m[0].seen.size(), m[1].seen.size());
  for (std::size_t i = 0; i < m[0].seen.size(); ++i) {
    EXPECT_EQ(m[0].seen[i].first, m[1].seen[i].first);
    EXPECT_EQ(m[0].seen[i].second, m[1].seen[i].second);
  }
  EXPECT_EQ(res[1].chosen, r.chosen);
  EXPECT_EQ(res[1].chosen_levers, r.chosen_levers);
  // Note [interleaved comparison]: the rounds (the measurements after each
  // candidate's first) group the contenders by levers and reverse every other
  // round, so the levers change (a rebuilt model) once per group boundary only.
  ASSERT_GE(r.rounds, 2) << table;
  std::vector<std::pair<int64_t, Levers>> rounds(m[0].seen.begin() + static_cast<std::ptrdiff_t>(r.candidates.size()),
                                                  m[0].seen.end());
  std::vector<Levers> groups;
  int changes = 0;
  for (std::size_t i = 0; i < rounds.size(); ++i) {
    if (std::find(groups.begin(), groups.end(), rounds[i].second) == groups.end()) groups.push_back(rounds[i].second);
    if (i > 0 && !(rounds[i].second == rounds[i - 1].second)) ++changes;
  }
  ASSERT_GE(groups.size(), 2u) << table;
  EXPECT_EQ(changes, r.rounds * static_cast<int>(groups.size() - 1)) << table;
  // Recompute's two probes: the walk's largest fitting size, 64, and the smallest
  // that failed above it, 72 (the boundary tried 96, 80, 72).
  int probes = 0;
  for (const auto& c : r.candidates) {
    if (c.levers == kRecompute && (c.per_gpu == 64 || c.per_gpu == 72)) ++probes;
  }
  EXPECT_EQ(probes, 2) << table;
  EXPECT_NE(table.find("memory model"), std::string::npos) << table;
  EXPECT_NE(table.find("<- chosen"), std::string::npos) << table;
}

TEST(LeverSearch, ShardingOnTopOfRecomputeThatFitsNoMoreIsTimedOnlyWhereRecomputeContends) {
  // Note [lever search], 3: recompute alone fits 256, search.max; its shardings are
  // predicted to fit no more (their twin's size) and could only give that batch in
  // less memory.
  const auto cfg = parseConfig(kAutoLevers, "t.yaml");
  {
    // Recompute 20 % slower: at 256 it is the best (711 samples/s against plain's
    // 667 at 64), so both shardings are timed there.
    std::vector<SimulatedMeasurer> m{memoryBound(), memoryBound()};
    const auto r = searchOnRanks(cfg, m)[0];
    for (const auto& l : {kBoth, kGradsBoth}) {
      EXPECT_NE(outcome(r, l).verdict.find("no larger than recompute's 256; timed at 256"),
                std::string::npos)
          << outcome(r, l).verdict;
      EXPECT_EQ(outcome(r, l).measured_max, 256);
    }
  }
  // Recompute 50 % slower: 444 samples/s at 256, 67 % of plain's 667, out of the
  // rounds' reach (1 - 2 x 0.05 - 0.15 = 75 %): both pruned, never measured.
  std::vector<SimulatedMeasurer> m;
  for (int i = 0; i < 2; ++i) m.push_back(leverMeasurer(400).withLevers(10, 20, 2, 0.25, 0.5, 0.02));
  const auto r = searchOnRanks(cfg, m)[0];
  const std::string table = searchTable(r);
  EXPECT_EQ(outcome(r, kRecompute).measured_max, 256) << table;
  for (const auto& l : {kBoth, kGradsBoth}) {
    const auto& v = outcome(r, l).verdict;
    EXPECT_EQ(v.rfind("pruned: predicted to fit up to per-GPU 256", 0), 0u) << v;
    EXPECT_NE(v.find("no larger than recompute's 256, which runs at 67 % of the best"),
              std::string::npos)
        << v;
    EXPECT_EQ(outcome(r, l).measured_max, 0);
    EXPECT_FALSE(outcome(r, l).timed);
    EXPECT_EQ(std::count_if(m[0].seen.begin(), m[0].seen.end(),
                            [&](const auto& s) { return s.second == l; }),
              0)
        << leversText(l);
  }
  EXPECT_EQ(r.chosen_levers.recompute, Recompute::kOff) << table;
}

TEST(LeverSearch, WithoutAMemoryBoundRecomputeIsPrunedUnmeasured) {
  // No budget, no out-of-memory: the walk stops on its plateau. Recompute could
  // only cost time; the sharded optimizer is timed once at the walk's pick.
  const auto cfg = parseConfig(kAutoLevers, "t.yaml");
  std::vector<SimulatedMeasurer> m{leverMeasurer(0, 4, 0.0), leverMeasurer(0, 4, 0.0)};
  const auto res = searchOnRanks(cfg, m);
  const auto& r = res[0];
  for (const auto& [size, levers] : m[0].seen) {
    EXPECT_EQ(levers.recompute, Recompute::kOff) << size;
  }
  EXPECT_NE(outcome(r, kRecompute).verdict.find("pruned: memory did not bound the walk"),
            std::string::npos)
      << outcome(r, kRecompute).verdict;
  EXPECT_NE(outcome(r, kBoth).verdict.find("recompute would only cost time"), std::string::npos)
      << outcome(r, kBoth).verdict;
  EXPECT_TRUE(outcome(r, kShard).timed);
  EXPECT_TRUE(outcome(r, kGrads).timed);
  int sharded = 0, grads = 0;
  for (const auto& c : r.candidates) {
    sharded += c.levers == kShard ? 1 : 0;
    grads += c.levers == kGrads ? 1 : 0;
  }
  EXPECT_EQ(sharded, 1) << searchTable(r);
  EXPECT_EQ(grads, 1) << searchTable(r);
  // As fast (no cost) at the same size and smaller: the sharding that saves most is chosen.
  EXPECT_EQ(r.chosen_levers, kGrads) << searchTable(r);
}

TEST(LeverSearch, APredictionThatIsTooHighIsConfirmedDownwards) {
  // A rank whose memory grows faster above 240 under recompute (the model's line
  // is fitted at 64 and 72): 256 and 248 run out of memory, 240 fits.
  struct Kinked : SimulatedMeasurer {
    Kinked() : SimulatedMeasurer(memoryBound()) {}
    Measurement measure(int64_t per_gpu, int64_t accum, const Levers& levers, const TimingRule& rule,
                        int64_t extra) override {
      auto m = SimulatedMeasurer::measure(per_gpu, accum, levers, rule, extra);
      if (levers.recompute == Recompute::kOn && per_gpu > 240) {
        m.fail = FailKind::kOutOfMemory;
        m.samples_per_s = 0;
      }
      return m;
    }
  };
  auto cfg = parseConfig(kAutoLevers, "t.yaml");
  std::vector<SearchResult> results(2);
  std::vector<Kinked> m(2);
  batchdist::testsupport::runRanks(2, [&](collective::Communicator& comm) {
    BatchSearch search(cfg, comm, m[comm.rank()], 1 << 20, false);
    results[comm.rank()] = search.run(nullptr);
  });
  const auto& o = outcome(results[0], kRecompute);
  EXPECT_EQ(o.predicted_max, 256);
  EXPECT_EQ(o.measured_max, 240) << o.verdict;
  EXPECT_NE(o.verdict.find("out of memory at 256, 248"), std::string::npos) << o.verdict;
}

TEST(LeverSearch, OneRankAndAModelWithoutBlocksSayWhatAutoCannotWeigh) {
  const auto one = leverSpace({Shard::kAuto, Recompute::kAuto}, 1, "");
  EXPECT_EQ(one.combinations.size(), 2u);  // plain, recompute
  ASSERT_EQ(one.notes.size(), 1u);
  EXPECT_NE(one.notes[0].find("dist.shard: auto: one rank"), std::string::npos) << one.notes[0];
  const auto cnn = leverSpace({Shard::kAuto, Recompute::kAuto}, 4, "no blocks here");
  EXPECT_EQ(cnn.combinations.size(), 3u);  // plain, optimizer, gradients
  ASSERT_EQ(cnn.notes.size(), 2u);
  EXPECT_EQ(cnn.notes[0], "dist.shard: auto: the model has no parameter units: parameters not weighed");
  EXPECT_EQ(cnn.notes[1], "model.recompute: auto: no blocks here: off");
  const auto fixed = leverSpace({Shard::kOptimizer, Recompute::kAuto}, 4, "");
  ASSERT_EQ(fixed.combinations.size(), 2u);
  EXPECT_EQ(fixed.base, kShard);  // a lever that is not auto stays as configured
  EXPECT_EQ(fixed.combinations[1], kBoth);
  EXPECT_FALSE(leverSpace({Shard::kNone, Recompute::kOff}, 4, "").weighed());
}

TEST(LeverSearch, TheMemoryModelsPiecesByThemselves) {
  const MemoryParts sharded{10, 10, 5};  // state 5 of 20 over 4 ranks
  EXPECT_DOUBLE_EQ(fixedMbUnder(sharded, Shard::kOptimizer, Shard::kNone, 4), 40);
  EXPECT_DOUBLE_EQ(fixedMbUnder(sharded, Shard::kOptimizer, Shard::kOptimizer, 4), 25);
  EXPECT_DOUBLE_EQ(fixedMbUnder({10, 10, 20}, Shard::kNone, Shard::kOptimizer, 4), 25);
  // Gradients sharded too: 10 + 10/4 + 20/4, from either measurement and back.
  EXPECT_DOUBLE_EQ(fixedMbUnder({10, 10, 20}, Shard::kNone, Shard::kGradients, 4), 17.5);
  EXPECT_DOUBLE_EQ(fixedMbUnder(sharded, Shard::kOptimizer, Shard::kGradients, 4), 17.5);
  EXPECT_DOUBLE_EQ(fixedMbUnder({10, 2.5, 5}, Shard::kGradients, Shard::kNone, 4), 40);
  EXPECT_DOUBLE_EQ(fixedMbUnder({10, 2.5, 5}, Shard::kGradients, Shard::kOptimizer, 4), 25);
  // The fit takes the two largest sizes with a peak, an over-budget one included,
  // an out-of-memory (no peak) not.
  auto at = [](int64_t m, double peak, const std::string& reason = "") {
    Candidate c;
    c.per_gpu = m;
    c.peak_mb = peak;
    c.failed = !reason.empty();
    c.reason = reason;
    c.parts = {10, 10, 20};
    return c;
  };
  const std::vector<Candidate> cs{at(8, 172), at(16, 204), at(32, 268, "over memory budget on rank 0"),
                                  at(64, 999, "out of memory on rank 1")};
  const auto fit = fitRest(cs, Recompute::kOff);
  ASSERT_TRUE(fit.valid);
  EXPECT_NEAR(fit.per_sample_mb, 4, 1e-9);
  EXPECT_NEAR(fit.intercept_mb, 100, 1e-9);
  EXPECT_FALSE(fitRest(cs, Recompute::kOn).valid);
  // Two sizes over the budget above the largest fit (a resident set that jumps
  // past the boundary, as on 4 ranks oversubscribing 2 cores: 16 at 322 MB, 24 at
  // 485, 48 at 543): the line runs across the boundary, 16 to 24, not 24 to 48
  // (which put 403 MB under m = 0 and predicted that nothing fits).
  const std::vector<Candidate> jump{at(8, 280), at(16, 322), at(24, 485, "over memory budget on rank 2"),
                                    at(48, 543, "over memory budget on rank 0")};
  const auto across = fitRest(jump, Recompute::kOff);
  ASSERT_TRUE(across.valid);
  EXPECT_NEAR(across.per_sample_mb, (485.0 - 322) / 8, 1e-9);
  EXPECT_EQ(predictLargest(across, 40, 407, 8, 48, [](int64_t m) { return m % 8 == 0; }), 16);
  const auto any = [](int64_t) { return true; };
  const auto eights = [](int64_t m) { return m % 8 == 0; };
  EXPECT_EQ(predictLargest(fit, 40, 400, 1, 1000, any), 65);
  EXPECT_EQ(predictLargest(fit, 40, 400, 1, 1000, eights), 64);
  EXPECT_EQ(predictLargest(fit, 40, 400, 1, 50, any), 50);
  EXPECT_EQ(predictLargest(fit, 40, 130, 1, 1000, any), 0);  // the fixed parts alone overflow
  EXPECT_EQ(predictLargest(fit, 40, 0, 1, 1000, any), 0);    // no budget: no prediction
}

TEST(LeverSearch, TheLeversTravelThroughSearchJsonTheCacheAndTrainingOoms) {
  const auto cfg = parseConfig(kAutoLevers, "t.yaml");
  std::vector<SimulatedMeasurer> m{memoryBound(), memoryBound()};
  const auto r = searchOnRanks(cfg, m)[0];
  const auto back = searchFromJson(nlohmann::json::parse(searchJson(r).dump()));
  EXPECT_EQ(back.chosen_levers, r.chosen_levers);
  ASSERT_EQ(back.levers.size(), r.levers.size());
  for (std::size_t i = 0; i < r.levers.size(); ++i) {
    EXPECT_EQ(back.levers[i].levers, r.levers[i].levers);
    EXPECT_EQ(back.levers[i].predicted_max, r.levers[i].predicted_max);
    EXPECT_EQ(back.levers[i].verdict, r.levers[i].verdict);
  }
  ASSERT_EQ(back.candidates.size(), r.candidates.size());
  for (std::size_t i = 0; i < r.candidates.size(); ++i) {
    EXPECT_EQ(back.candidates[i].levers, r.candidates[i].levers);
    EXPECT_DOUBLE_EQ(back.candidates[i].parts.optimizer_state_mb, r.candidates[i].parts.optimizer_state_mb);
  }
  // Exactly one candidate is chosen in search.json, though several ran at 256.
  int chosen = 0;
  const auto doc = searchJson(r);
  for (const auto& c : doc["candidates"]) chosen += c["chosen"].get<bool>() ? 1 : 0;
  EXPECT_EQ(chosen, 1);
  // Training under shard optimizer + recompute ran out of memory at 256: 256 under
  // those levers and under the ones that save less is out; the choice falls back.
  const batchdist::testsupport::ScratchDir dir("lever_cache");  // Note [scratch dirs]
  const auto path = (dir.path() / "search_cache.json").string();
  writeSearchCache(path, "k", r);
  markSearchCacheOom(path, "k", {{256, 1, 3, 0, 410}});
  const auto found = readSearchCache(path, "k");
  ASSERT_TRUE(found.result.has_value()) << found.problem;
  EXPECT_LT(found.result->chosen, 256) << found.note;
  for (const auto& c : found.result->candidates) {
    if (c.per_gpu == 256) {
      EXPECT_TRUE(c.failed) << leversText(c.levers);
    }
  }
}

TEST(LeverSearch, AutoNeedsTheSearchAndNamesItsValues) {
  using batchdist::testsupport::configError;
  const auto fixed = configError("batch: {per_gpu: 16}\ndist: {shard: auto}\n");
  EXPECT_NE(fixed.find("dist.shard"), std::string::npos) << fixed;
  EXPECT_NE(fixed.find("auto is chosen by the batch search, and batch.per_gpu is fixed (16)"),
            std::string::npos)
      << fixed;
  EXPECT_NE(fixed.find("none, optimizer, gradients or parameters"), std::string::npos) << fixed;
  const auto recompute = configError("batch: {per_gpu: 16}\nmodel: {recompute: auto}\n");
  EXPECT_NE(recompute.find("model.recompute"), std::string::npos) << recompute;
  EXPECT_NE(recompute.find("off or on"), std::string::npos) << recompute;
  const auto bad = configError("batch: {per_gpu: auto}\nmodel: {recompute: sometimes}\n");
  EXPECT_NE(bad.find("auto"), std::string::npos) << bad;
  // A model with no blocks takes auto (the search weighs off only), not on.
  EXPECT_EQ(configError("batch: {per_gpu: auto}\nmodel: {name: cnn, recompute: auto}\n"), "<no error>");
  EXPECT_NE(configError("model: {name: cnn, recompute: on}\n").find("not supported"), std::string::npos);
  EXPECT_EQ(configError("batch: {per_gpu: auto}\ndist: {shard: auto}\nmodel: {recompute: auto}\n"),
            "<no error>");
}

TEST(LeverSearch, WhenNothingFitsPlainTheLeversAreTriedAtTheSmallestSize) {
  // A 160 MB budget: plain needs 172 MB at per-GPU 8, optimizer 162, gradients 157;
  // recompute 148, with the optimizer sharded 138, with the gradients 133.
  const auto cfg = parseConfig(kAutoLevers, "t.yaml");
  std::vector<SimulatedMeasurer> m{leverMeasurer(160), leverMeasurer(160)};
  const auto res = searchOnRanks(cfg, m);
  const auto& r = res[0];
  EXPECT_EQ(outcome(r, kPlain).verdict, "the walk's levers: no size fit");
  EXPECT_NE(outcome(r, kShard).verdict.find("does not fit the smallest size, 8, either"), std::string::npos)
      << outcome(r, kShard).verdict;
  EXPECT_NE(outcome(r, kRecompute).verdict.find("fits the smallest size, 8"), std::string::npos)
      << outcome(r, kRecompute).verdict;
  EXPECT_NE(outcome(r, kGrads).verdict.find("fits the smallest size, 8"), std::string::npos)
      << outcome(r, kGrads).verdict;
  // Gradients sharded alone costs 4 %, recompute 20 %: the fastest that fits.
  EXPECT_EQ(r.chosen, 8) << searchTable(r);
  EXPECT_EQ(r.chosen_levers, kGrads) << searchTable(r);
}

// Note [lever search] with dist.shard: parameters (Note [parameter units]): a
// model whose state dwarfs its activations (parameters and gradients 100 MB each,
// state 200, working units 10, 4 ranks, peak 100 + fixed + 4 MB a sample, budget
// 600): plain fits 24, optimizer 56, gradients 80 (fixed 175), parameters 96
// (fixed 25 + 10 + 25 + 50 = 110). With samples/s still growing with the batch
// (half at 256) parameters' 96 is 12 % faster than gradients' 80 and is chosen;
// it ran once at the walk's 24 before its confirmation (Note [collective replay]).
TEST(LeverSearch, ParametersIsWeighedWhereItFitsALargerBatchThanEveryOtherSharding) {
  const auto cfg = parseConfig("batch: {per_gpu: auto}\ndist: {shard: auto}\n"
                               "search: {min: 8, max: 256, multiple_of: 8, tolerance: 0.05, rounds: 2}\n",
                               "t.yaml");
  const auto heavy = [](double budget) {
    SimulatedMeasurer m(1 << 30, 1000, 256, 100, 4, budget);
    m.withLevers(100, 200, 4, 1, 0, 0.02).withParameterUnits(10);
    return m;
  };
  std::vector<SimulatedMeasurer> m(4, heavy(600));
  const auto res = searchOnRanks(cfg, m);
  const auto& r = res[0];
  const std::string table = searchTable(r);
  ASSERT_EQ(r.levers.size(), 4u) << table;
  EXPECT_DOUBLE_EQ(outcome(r, kParams).fixed_mb, 110) << table;
  EXPECT_EQ(outcome(r, kGrads).measured_max, 80) << table;
  EXPECT_EQ(outcome(r, kParams).predicted_max, 96) << table;
  EXPECT_EQ(outcome(r, kParams).measured_max, 96) << table;
  EXPECT_EQ(r.chosen, 96) << table;
  EXPECT_EQ(r.chosen_levers, kParams) << table;
  const auto first = std::find_if(m[0].seen.begin(), m[0].seen.end(),
                                  [](const auto& s) { return s.second == kParams; });
  ASSERT_NE(first, m[0].seen.end());
  EXPECT_EQ(first->first, 24) << "the walk's fit first, then the confirmation";

  // Twice the budget: gradients fits 256 (search.max) as parameters would: pruned unmeasured.
  std::vector<SimulatedMeasurer> roomy(4, heavy(1400));
  const auto wide = searchOnRanks(cfg, roomy)[0];
  EXPECT_NE(outcome(wide, kParams).verdict.find("pruned: "), std::string::npos)
      << outcome(wide, kParams).verdict;
  EXPECT_NE(outcome(wide, kParams).verdict.find("parameters would only cost time"), std::string::npos)
      << outcome(wide, kParams).verdict;
  for (const auto& [size, levers] : roomy[0].seen) EXPECT_NE(levers, kParams) << size;
  EXPECT_NE(wide.chosen_levers, kParams);
}

TEST(LeverSearch, ParametersInTheSpaceAndTheMemoryModel) {
  const auto space = leverSpace({Shard::kAuto, Recompute::kOff}, 4, "", "");
  ASSERT_EQ(space.combinations.size(), 4u);
  EXPECT_EQ(space.combinations.back(), kParams) << "weighed after gradients";
  const auto lars = leverSpace({Shard::kAuto, Recompute::kOff}, 4, "", "optim.name: lars reads ...");
  EXPECT_EQ(lars.combinations.size(), 3u);
  ASSERT_EQ(lars.notes.size(), 1u);
  EXPECT_EQ(lars.notes[0], "dist.shard: auto: optim.name: lars reads ...: parameters not weighed");
  // 100 / 4 + 8 whole units + 100 / 4 + 200 / 4, from an unsharded measurement.
  EXPECT_DOUBLE_EQ(fixedMbUnder({100, 100, 200}, Shard::kNone, Shard::kParameters, 4, 8), 108);
  EXPECT_DOUBLE_EQ(fixedMbUnder({100, 25, 50}, Shard::kGradients, Shard::kParameters, 4, 8), 108);
  EXPECT_DOUBLE_EQ(fixedMbUnder({33, 25, 50}, Shard::kParameters, Shard::kParameters, 4, 8), 108)
      << "measured under parameters: as measured";
  EXPECT_DOUBLE_EQ(fixedMbUnder({33, 25, 50}, Shard::kParameters, Shard::kNone, 4, 8), 400);
}

// Note [lever search]: a model that fits under no lever is refused with the
// figures: the levers tried, the closest candidate's peak and parts against the
// budget (gradients + recompute at per-GPU 8: 100 + 10 + 5 + 10 + 8 = 133 MB of
// 120), and what could still help.
TEST(LeverSearch, AModelThatFitsUnderNoLeverIsRefusedWithTheFigures) {
  const auto cfg = parseConfig(kAutoLevers, "t.yaml");
  std::vector<SimulatedMeasurer> m{leverMeasurer(120), leverMeasurer(120)};
  try {
    searchOnRanks(cfg, m);
    FAIL() << "expected the search to refuse";
  } catch (const Error& e) {
    const std::string what = e.what();
    for (const char* want : {"batch search: no per-GPU batch fits under plain, shard optimizer, "
                             "shard gradients, recompute, shard optimizer + recompute, shard "
                             "gradients + recompute; ",
                             "the closest, per-GPU 8 under shard gradients + recompute, peaked at "
                             "133 MB against a budget of 120 MB (parameters 10 MB, gradients 5 MB, "
                             "optimizer state 10 MB, activations and the rest 108 MB)",
                             "dist.shard: parameters (gpt, mlp)"}) {
      EXPECT_NE(what.find(want), std::string::npos) << want << "\n" << what;
    }
  }
}
