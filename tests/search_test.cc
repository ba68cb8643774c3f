#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cctype>
#include <cmath>
#include <random>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <sstream>
#include <thread>

#include "common/error.h"
#include "collective/process_group.h"
#include "collective/torch_compat.h"
#include "simulated_measurer.h"
#include "tests/scratch_dir.h"
#include "tests/thread_ranks.h"
#include "worker/common/console.h"
#include "worker/common/util.h"
#include "worker/plan/adapt.h"
#include "worker/search/cache.h"
#include "worker/search/output.h"
#include "worker/search/search.h"
#include "worker/train/step/memory.h"

using namespace batchdist;
using namespace batchdist::worker;
using batchdist::testsupport::SimulatedMeasurer;

namespace {

Candidate ok(int64_t m, double sps, double peak = 100) {
  Candidate c;
  c.per_gpu = m;
  c.global = m;
  c.global_sps = c.min_rank_sps = c.max_rank_sps = sps;
  c.peak_mb = peak;
  return c;
}
Candidate bad(int64_t m, const std::string& reason, double peak) {
  Candidate c;
  c.per_gpu = m;
  c.failed = true;
  c.reason = reason;
  c.peak_mb = peak;
  return c;
}

/// Runs a BatchSearch on `world` threads, rank r using measurers[r].
std::vector<SearchResult> searchOnThreads(const Config& cfg,
                                          std::vector<SimulatedMeasurer>& measurers,
                                          int64_t train_size) {
  std::vector<SearchResult> results(measurers.size());
  batchdist::testsupport::runRanks(static_cast<int>(measurers.size()), [&](collective::Communicator& comm) {
    BatchSearch search(cfg, comm, measurers[comm.rank()], train_size, false);
    results[comm.rank()] = search.run(nullptr);
  });
  return results;
}

/// "" if `doc` is well-formed XML as far as a hand-written SVG can go wrong
/// (tags nest, names are names, no raw '<' in text or attributes, every '&'
/// starts an entity); otherwise the first problem and where.
std::string xmlProblem(const std::string& doc) {
  const auto entityAt = [&](std::size_t i) {
    for (const char* e : {"&amp;", "&lt;", "&gt;", "&quot;", "&apos;"}) {
      if (doc.compare(i, std::strlen(e), e) == 0) return true;
    }
    if (doc.compare(i, 2, "&#") != 0) return false;
    const auto semi = doc.find(';', i);
    return semi != std::string::npos && semi > i + 2 && semi < i + 10;
  };
  const auto at = [&](std::size_t i, const std::string& what) {
    return what + " at offset " + std::to_string(i) + ": ..." + doc.substr(i < 20 ? 0 : i - 20, 40) +
           "...";
  };
  std::vector<std::string> open;
  int roots = 0;
  for (std::size_t i = 0; i < doc.size(); ++i) {
    if (doc[i] == '&' && !entityAt(i)) return at(i, "bare '&'");
    if (doc[i] != '<') continue;
    std::size_t j = i + 1;
    char quote = 0;
    for (; j < doc.size() && (quote || doc[j] != '>'); ++j) {
      if (doc[j] == '<') return at(j, "'<' inside a tag");
      if (doc[j] == '&' && !entityAt(j)) return at(j, "bare '&' in an attribute");
      if (quote && doc[j] == quote) {
        quote = 0;
      } else if (!quote && (doc[j] == '"' || doc[j] == '\'')) {
        quote = doc[j];
      }
    }
    if (j == doc.size()) return at(i, "unterminated tag");
    std::string tag = doc.substr(i + 1, j - i - 1);
    i = j;
    if (!tag.empty() && (tag[0] == '?' || tag[0] == '!')) continue;
    const bool closing = !tag.empty() && tag[0] == '/';
    const bool empty = !tag.empty() && tag.back() == '/';
    if (closing) tag.erase(0, 1);
    const std::string name = tag.substr(0, tag.find_first_of(" \t\n/"));
    if (name.empty() || !std::isalpha(static_cast<unsigned char>(name[0]))) {
      return at(i, "bad tag name '" + name + "'");
    }
    if (closing) {
      if (open.empty() || open.back() != name) return at(i, "</" + name + "> closes nothing open");
      open.pop_back();
    } else {
      if (open.empty()) ++roots;
      if (!empty) open.push_back(name);
    }
  }
  if (!open.empty()) return "<" + open.back() + "> is never closed";
  if (roots != 1) return std::to_string(roots) + " root elements";
  return "";
}

}  // namespace

TEST(SearchRule, PlateauPicksTheSmallestNearPeak) {
  const std::vector<Candidate> c{ok(8, 100), ok(16, 180), ok(32, 290), ok(64, 300), ok(128, 302)};
  std::string why;
  EXPECT_EQ(chooseCandidate(c, Objective::kThroughput, 0.05, &why).per_gpu, 32);
  EXPECT_NE(why.find("smallest within 5 %"), std::string::npos) << why;
  EXPECT_EQ(chooseCandidate(c, Objective::kThroughput, 0.0).per_gpu, 128);
  EXPECT_EQ(chooseCandidate(c, Objective::kMaxFit, 0.05).per_gpu, 128);
}

TEST(SearchRule, MonotoneCurvePicksTheBest) {
  const std::vector<Candidate> c{ok(8, 100), ok(16, 200), ok(32, 400), bad(64, "out of memory on rank 0", 900)};
  EXPECT_EQ(chooseCandidate(c, Objective::kThroughput, 0.05).per_gpu, 32);
  EXPECT_EQ(chooseCandidate(c, Objective::kMaxFit, 0.05).per_gpu, 32);
}

TEST(SearchRule, NoisyCurveIgnoresFailuresAndDips) {
  // A dip at 32 and a failure in the middle do not confuse the rule.
  const std::vector<Candidate> c{ok(8, 100), ok(16, 250), ok(32, 180), ok(48, 262),
                                 bad(56, "over memory budget on rank 1", 990), ok(24, 240)};
  EXPECT_EQ(chooseCandidate(c, Objective::kThroughput, 0.05).per_gpu, 16);
  EXPECT_EQ(chooseCandidate(c, Objective::kMaxFit, 0.05).per_gpu, 48);
}

TEST(SearchRule, AllFailNamesTheSmallestSizeAndTheMemorySeen) {
  const std::vector<Candidate> c{bad(16, "out of memory on rank 1", 2048.4),
                                 bad(8, "out of memory on rank 1", 1500.2)};
  try {
    chooseCandidate(c, Objective::kThroughput, 0.05);
    FAIL();
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("the smallest tried, 8, failed: out of memory on rank 1 (peak 1500 MB)"),
              std::string::npos)
        << msg;
  }
}

TEST(Search, DoublesThenBinarySearchesTheBoundaryForMaxFit) {
  auto cfg = parseConfig("search: {min: 8, multiple_of: 8, objective: max_fit}", "t.yaml");
  std::vector<SimulatedMeasurer> m{SimulatedMeasurer(100, 1000, 4), SimulatedMeasurer(100, 1000, 4)};
  const auto res = searchOnThreads(cfg, m, 100000);
  std::vector<int64_t> tried;
  for (const auto& c : res[0].candidates) tried.push_back(c.per_gpu);
  // 8, 16, 32, 64, 128 (fails), then binary search between 64 and 128 in steps of 8.
  ASSERT_GE(tried.size(), 6u);
  EXPECT_EQ((std::vector<int64_t>(tried.begin(), tried.begin() + 5)),
            (std::vector<int64_t>{8, 16, 32, 64, 128}));
  EXPECT_EQ(res[0].chosen, 96);  // largest multiple of 8 <= 100
  EXPECT_EQ(res[1].chosen, 96);
  EXPECT_LE(res[0].timed_steps, 40);
}

TEST(Search, ThroughputObjectiveStopsOnAPlateau) {
  auto cfg = parseConfig("search: {min: 8}", "t.yaml");
  // Saturates early (half = 2): gains < 5 % after ~64, no memory limit at all.
  std::vector<SimulatedMeasurer> m{SimulatedMeasurer(1 << 30, 1000, 2)};
  const auto res = searchOnThreads(cfg, m, 1 << 30);
  EXPECT_LE(res[0].candidates.size(), 6u);
  EXPECT_LE(res[0].chosen, 64);
  for (const auto& c : res[0].candidates) EXPECT_FALSE(c.failed);
}

TEST(Search, FixedGlobalBatchOnlyTriesDivisorsAndDerivesAccumulation) {
  auto cfg = parseConfig("batch: {global: 96}\nsearch: {min: 2, objective: max_fit}", "t.yaml");
  std::vector<SimulatedMeasurer> m{SimulatedMeasurer(20, 1000, 4), SimulatedMeasurer(20, 1000, 4)};
  const auto res = searchOnThreads(cfg, m, 100000);
  for (const auto& c : res[0].candidates) {
    EXPECT_EQ(48 % c.per_gpu, 0) << c.per_gpu;
    EXPECT_EQ(c.global, 96);
    EXPECT_EQ(c.per_gpu * c.accum * 2, 96);
  }
  EXPECT_EQ(res[0].chosen, 16);  // largest divisor of 48 that is <= 20
  EXPECT_EQ(res[0].chosen_accum, 3);
}

// batch.global: auto lets the search pick G as well: not one that leaves an
// epoch fewer than batch.adapt_min_steps steps (a CI run once picked per-GPU 512
// on 2 ranks for 4 096 samples: 4 steps an epoch). The measurer here gets faster
// with every size, so without the bound the search would walk far past it.
TEST(Search, AnAutoGlobalBatchLeavesAdaptMinStepsAnEpoch) {
  const auto searchWith = [](const std::string& batch, int64_t train_size, std::string* console_out) {
    auto cfg = parseConfig("batch: " + batch + "\nsearch: {min: 8, multiple_of: 8}", "t.yaml");
    std::vector<SimulatedMeasurer> m{SimulatedMeasurer(1 << 30, 1e6, 1e4),
                                     SimulatedMeasurer(1 << 30, 1e6, 1e4)};
    std::vector<SearchResult> res(2);
    std::ostringstream out;
    auto* old = std::cout.rdbuf(out.rdbuf());
    batchdist::testsupport::runRanks(2, [&](collective::Communicator& comm) {
      Console console(comm.rank() == 0, ProgressStyle::kLines);
      BatchSearch search(cfg, comm, m[comm.rank()], train_size, false);
      res[comm.rank()] = search.run(&console);
    });
    std::cout.rdbuf(old);
    if (console_out) *console_out = out.str();
    EXPECT_EQ(res[0].chosen, res[1].chosen);
    int64_t largest = 0;
    for (const auto& c : res[0].candidates) largest = std::max(largest, c.per_gpu);
    return std::make_pair(res[0], largest);
  };
  std::string said;
  // 4 096 / 8 steps / 2 ranks: per-GPU 256 at most.
  auto [r8, largest8] = searchWith("{per_gpu: auto, last_batch: drop}", 4096, &said);
  EXPECT_EQ(largest8, 256);
  EXPECT_EQ(r8.chosen, 256);
  EXPECT_GE(4096 / (r8.chosen * 2), 8);
  EXPECT_NE(said.find("per-GPU batch up to 256 (global batch 512): 4096 training samples, 8 steps "
                      "an epoch; batch.adapt_min_steps=8 bounds the global batch the search may choose"),
            std::string::npos)
      << said;
  // Accumulation counts: 4 096 / 8 / (2 ranks x 2) = 128; pad bounds it the same way.
  auto [ra, largest_a] = searchWith("{per_gpu: auto, accum: 2, last_batch: pad}", 4096, nullptr);
  EXPECT_EQ(largest_a, 128);
  // A bound between doublings is tried itself, last (in multiples of 8): 3 000 / 8 /
  // 2 = 187, so 128 and then 184.
  auto [r3, largest3] = searchWith("{per_gpu: auto}", 3000, nullptr);
  EXPECT_EQ(largest3, 184);
  EXPECT_EQ(r3.candidates.back().per_gpu, 184);
  EXPECT_EQ(r3.chosen, 184);
  // A looser bound lets it go further, so the bound above is what stopped it.
  auto [r2, largest2] = searchWith("{per_gpu: auto, adapt_min_steps: 2}", 4096, nullptr);
  EXPECT_EQ(largest2, 1024);
  // Too little data for 8 steps even at the smallest size: the smallest size, said so.
  auto [rt, largest_t] = searchWith("{per_gpu: auto}", 100, &said);
  EXPECT_EQ(rt.chosen, 8);
  EXPECT_EQ(largest_t, 8);
  EXPECT_NE(said.find("100 training samples, 6 steps an epoch even at the smallest size"),
            std::string::npos)
      << said;
  // A fixed global batch is the user's: the bound does not touch its divisors.
  auto [rf, largest_f] = searchWith("{global: 2048, per_gpu: auto}", 4096, &said);
  EXPECT_EQ(largest_f, 1024);
  EXPECT_EQ(said.find("bounds the global batch"), std::string::npos) << said;
}

TEST(Search, TheTighterRankDecidesAndTheSlowestSetsThroughput) {
  auto cfg = parseConfig("search: {min: 8, objective: max_fit}", "t.yaml");
  std::vector<SimulatedMeasurer> m{SimulatedMeasurer(128, 2000, 4), SimulatedMeasurer(63, 1000, 4)};
  const auto res = searchOnThreads(cfg, m, 100000);
  EXPECT_EQ(res[0].chosen, res[1].chosen);
  EXPECT_LE(res[0].chosen, 63);
  for (const auto& c : res[0].candidates) {
    if (c.failed) {
      EXPECT_NE(c.reason.find("on rank 1"), std::string::npos) << c.reason;
      continue;
    }
    EXPECT_NEAR(c.global_sps, 2 * c.min_rank_sps, 1e-9);
    EXPECT_LT(c.min_rank_sps, c.max_rank_sps);
  }
  // Every rank walked exactly the same candidates.
  EXPECT_EQ(m[0].calls, m[1].calls);
}

TEST(Search, MemoryBudgetIsAFailureToo) {
  auto cfg = parseConfig("search: {min: 8, objective: max_fit}", "t.yaml");
  // 100 MB + 4 MB/sample under a 300 MB budget -> at most 50 per GPU.
  std::vector<SimulatedMeasurer> m{SimulatedMeasurer(1 << 30, 1000, 4, 100, 4, 300)};
  const auto res = searchOnThreads(cfg, m, 100000);
  EXPECT_EQ(res[0].chosen, 48);
  EXPECT_DOUBLE_EQ(res[0].memory_budget_mb, 300);
  bool saw_budget = false;
  for (const auto& c : res[0].candidates) {
    if (c.failed) saw_budget |= c.reason.find("over memory budget") != std::string::npos;
  }
  EXPECT_TRUE(saw_budget);
}

TEST(Search, EverythingFailingIsAClearError) {
  auto cfg = parseConfig("search: {min: 8}", "t.yaml");
  std::vector<SimulatedMeasurer> m{SimulatedMeasurer(4, 1000, 4), SimulatedMeasurer(4, 1000, 4)};
  try {
    searchOnThreads(cfg, m, 100000);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("the smallest tried, 8"), std::string::npos) << e.what();
  }
}

TEST(Search, JsonSvgAndTable) {
  SearchResult r;
  r.candidates = {ok(8, 100, 120), ok(16, 190, 140), bad(32, "out of memory on rank 0", 400)};
  r.chosen = 16;
  r.objective = Objective::kThroughput;
  r.memory_budget_mb = 300;
  const auto svg = searchSvg(r);
  EXPECT_NE(svg.find("<svg"), std::string::npos);
  EXPECT_NE(svg.find("chosen: 16"), std::string::npos);
  EXPECT_NE(svg.find("memory budget 300 MB"), std::string::npos);
  const auto table = searchTable(r);
  EXPECT_NE(table.find("<- chosen"), std::string::npos);
  EXPECT_NE(table.find("out of memory on rank 0"), std::string::npos);
  const auto key = "k";
  const batchdist::testsupport::ScratchDir dir("search_cache");  // Note [scratch dirs]
  const auto path = (dir.path() / "search_cache.json").string();
  writeSearchCache(path, key, r);
  const auto back = readSearchCache(path, key).result;
  ASSERT_TRUE(back.has_value());
  EXPECT_TRUE(back->cached);
  EXPECT_EQ(back->chosen, 16);
  EXPECT_EQ(back->candidates.size(), 3u);
  EXPECT_FALSE(readSearchCache(path, "other key").result.has_value());
}

TEST(Search, SvgEscapesDeviceNamesAndReasons) {
  // The device name and failure reasons went into search.svg raw: a '<' or '&'
  // made the file unreadable in a browser.
  SearchResult r;
  r.candidates = {ok(8, 100, 120), bad(16, "error <&>\"' on rank 0", 400)};
  r.chosen = 8;
  r.device = "Accel <&> \"fast\" 'x'";
  EXPECT_EQ(xmlProblem(searchSvg(SearchResult{})), "");
  const auto svg = searchSvg(r);
  EXPECT_EQ(xmlProblem(svg), "") << svg;
  EXPECT_NE(svg.find("Accel &lt;&amp;&gt; &quot;fast&quot; &apos;x&apos;"), std::string::npos) << svg;
  EXPECT_NE(svg.find("<title>error &lt;&amp;&gt;&quot;&apos; on rank 0</title>"), std::string::npos)
      << svg;
  EXPECT_EQ(xmlEscape("a<b>&\"c'"), "a&lt;b&gt;&amp;&quot;c&apos;");
  // The checker itself catches what the old output had.
  EXPECT_NE(xmlProblem("<svg><text>Accel <&> x</text></svg>"), "");
  EXPECT_NE(xmlProblem("<svg><title>a & b</title></svg>"), "");
}

TEST(SearchCache, DamagedEntriesAreAMissNamingTheFile) {
  // A damaged cache used to be trusted (chosen 0 reached the plan, whose error
  // named the config file) or ignored without a word; now readSearchCache says
  // which file is damaged and how, and the run searches again.
  namespace fs = std::filesystem;
  SearchResult good;
  good.candidates = {ok(8, 100), ok(16, 190), bad(32, "out of memory on rank 0", 400)};
  good.chosen = 16;
  const testsupport::ScratchDir scratch("search_cache");  // Note [scratch dirs]
  const auto path = (scratch.path() / "search_cache_damaged.json").string();
  const auto rewrite = [&](const std::function<void(nlohmann::json&)>& damage) {
    writeSearchCache(path, "k", good);
    std::ifstream in(path);
    auto j = nlohmann::json::parse(in);
    damage(j);
    std::ofstream(path) << j.dump(2);
  };
  const auto expectProblem = [&](const std::string& fault) {
    const auto found = readSearchCache(path, "k");
    EXPECT_FALSE(found.result.has_value());
    EXPECT_EQ(found.problem.rfind(path + ": ", 0), 0u) << found.problem;
    EXPECT_NE(found.problem.find(fault), std::string::npos) << found.problem;
  };
  rewrite([](nlohmann::json&) {});
  ASSERT_TRUE(readSearchCache(path, "k").result.has_value());
  EXPECT_EQ(readSearchCache(path, "k").problem, "");
  {
    SCOPED_TRACE("chosen 0");
    rewrite([](nlohmann::json& j) { j["result"]["chosen"] = 0; });
    expectProblem("damaged entry: chosen per-GPU batch 0 is not positive");
  }
  {
    SCOPED_TRACE("chosen -8");
    rewrite([](nlohmann::json& j) { j["result"]["chosen"] = -8; });
    expectProblem("chosen per-GPU batch -8 is not positive");
  }
  {
    SCOPED_TRACE("chosen 10^6");
    rewrite([](nlohmann::json& j) { j["result"]["chosen"] = 1000000; });
    expectProblem("chosen per-GPU batch 1000000 x accum 1 is not among the measured candidates");
  }
  {
    SCOPED_TRACE("chosen: a failed candidate");
    rewrite([](nlohmann::json& j) { j["result"]["chosen"] = 32; });
    expectProblem("is not among the measured candidates that fit");
  }
  {
    SCOPED_TRACE("a field missing");
    rewrite([](nlohmann::json& j) { j["result"].erase("candidates"); });
    expectProblem("damaged");
  }
  {
    SCOPED_TRACE("not JSON");
    std::ofstream(path) << "chosen: 16\n{{{";
    expectProblem("damaged");
  }
  {
    SCOPED_TRACE("JSON, not ours");
    std::ofstream(path) << "[1, 2, 3]";
    expectProblem("not a batchdist search cache");
  }
  // Another setup's entry is an ordinary miss, and so is no file at all.
  rewrite([](nlohmann::json& j) { j["result"]["chosen"] = 0; });
  EXPECT_EQ(readSearchCache(path, "other key").problem, "");
  fs::remove(path);
  const auto none = readSearchCache(path, "k");
  EXPECT_FALSE(none.result.has_value());
  EXPECT_EQ(none.problem, "");
}

TEST(Search, AnErrorOnALowRankIsNotBlamedOnAnOomOnAHigherOne) {
  // Note [search agreement]: kind and rank travel as one number. They used to be
  // reduced with MAX separately: an error on rank 1 and an OOM on rank 3 read
  // "failed on rank 3".
  auto cfg = parseConfig("search: {min: 8, objective: max_fit}", "t.yaml");
  std::vector<SimulatedMeasurer> m(4, SimulatedMeasurer(1 << 20, 1000, 4));
  m[1].failFrom(16, FailKind::kError);
  m[3].failFrom(16, FailKind::kOutOfMemory);
  try {
    searchOnThreads(cfg, m, 100000);
    FAIL() << "the search went on after an error";
  } catch (const TrainingError& e) {
    EXPECT_NE(std::string(e.what()).find("batch search: per-GPU batch 16 failed on rank 1"),
              std::string::npos)
        << e.what();
  }
}

TEST(Search, TheWorstFailureNamesTheLowestRankWithIt) {
  // Out of memory on rank 1 outranks over-budget on rank 3 (and rank 2's OOM).
  auto cfg = parseConfig("search: {min: 8, max: 32, objective: max_fit}", "t.yaml");
  std::vector<SimulatedMeasurer> m(4, SimulatedMeasurer(1 << 20, 1000, 4));
  m[1].failFrom(32, FailKind::kOutOfMemory);
  m[2].failFrom(32, FailKind::kOutOfMemory);
  m[3].failFrom(32, FailKind::kOverBudget);
  const auto res = searchOnThreads(cfg, m, 100000);
  const Candidate* at32 = nullptr;
  for (const auto& c : res[0].candidates) {
    if (c.per_gpu == 32) at32 = &c;
  }
  ASSERT_NE(at32, nullptr);
  EXPECT_TRUE(at32->failed);
  EXPECT_EQ(at32->reason, "out of memory on rank 1");
  EXPECT_EQ(res[0].chosen, 24);  // binary search between 16 and 32
}

TEST(Search, PeakRssResetsAndTracksAllocations) {
  resetPeakRss();
  const double before = peakRssMb();
  {
    auto big = torch::ones({64, 1024, 1024}, torch::kFloat);  // 256 MB, touched
    EXPECT_GT(peakRssMb(), before + 200);
  }
  resetPeakRss();
  EXPECT_LT(peakRssMb(), before + 100);
}

// ---------------------------------------------------------------------------
// Note [adaptive timing] and Note [interleaved comparison].

TEST(SearchTiming, MedianIntervalCoversTheTrueMedianAboutNinetyFivePercentOfTheTime) {
  // Step times: lognormal around 10 ms with 5 % spread, plus 5 % of stalls 3x
  // longer (the scheduler). The interval is for the median; the stalls must not
  // widen it much or move it.
  std::mt19937_64 rng(7);
  std::normal_distribution<double> z(0, 0.05);
  std::uniform_real_distribution<double> u(0, 1);
  const double true_median = 0.010;  // stalls shift the population median a little, see below
  int covered = 0;
  const int trials = 400;
  double mean_rel = 0;
  for (int t = 0; t < trials; ++t) {
    std::vector<double> xs;
    for (int i = 0; i < 100; ++i) {
      const double x = 0.010 * std::exp(z(rng));
      xs.push_back(u(rng) < 0.05 ? 3 * x : x);
    }
    const auto e = medianEstimate(xs);
    EXPECT_EQ(e.n, 100);
    mean_rel += e.relative() / trials;
    // The population median with 5 % stalls is the 0.5/0.95 quantile of the clean part.
    const double pop_median = true_median * std::exp(0.05 * 0.0660);
    covered += std::abs(e.median - pop_median) <= e.half_width;
  }
  EXPECT_GE(covered, static_cast<int>(0.90 * trials)) << covered << " of " << trials;
  EXPECT_LE(covered, static_cast<int>(0.995 * trials)) << "interval far too wide";
  // sigma 5 %, n 100: 1.96 * 1.2533 * 0.05 / 10 = 1.2 %.
  EXPECT_NEAR(mean_rel, 0.0123, 0.003);
}

TEST(SearchTiming, TooFewSamplesHaveNoInterval) {
  const auto e = medianEstimate({1.0, 2.0, 3.0});
  EXPECT_EQ(e.median, 2.0);
  EXPECT_TRUE(std::isinf(e.relative()));
  EXPECT_EQ(medianEstimate({}).median, 0.0);
}

TEST(SearchTiming, RuleWantsMoreUntilPreciseWithinItsBudgets) {
  TimingRule r;
  r.min_steps = 5;
  r.max_steps = 100;
  r.min_time_s = 0.5;
  r.max_time_s = 2;
  r.target = 0.01;
  MedianEstimate precise{1.0, 0.005, 50};
  MedianEstimate vague{1.0, 0.05, 50};
  EXPECT_TRUE(r.wantsMore(3, 1.5, precise)) << "below min_steps";
  EXPECT_TRUE(r.wantsMore(1, 10.0, precise)) << "one slow step shows no spread";
  EXPECT_FALSE(r.wantsMore(2, 10.0, vague)) << "two slow steps past max_time_s are enough";
  EXPECT_FALSE(r.wantsMore(3, 2.1, precise)) << "slow steps: min_steps yields to max_time_s";
  EXPECT_TRUE(r.wantsMore(50, 0.2, precise)) << "below min_time_s";
  EXPECT_FALSE(r.wantsMore(50, 0.6, precise));
  EXPECT_TRUE(r.wantsMore(50, 0.6, vague));
  EXPECT_FALSE(r.wantsMore(50, 2.1, vague)) << "max_time_s ends it, precise or not";
  EXPECT_FALSE(r.wantsMore(100, 0.1, vague)) << "max_steps ends it";
  // Check points: the same on every rank, growing ~x1.5, capped.
  std::vector<int64_t> checks;
  for (int64_t n = 0; n < r.max_steps; n = r.nextCheck(n)) checks.push_back(r.nextCheck(n));
  EXPECT_EQ(checks.front(), 2) << "slow steps are checked after two";
  EXPECT_EQ(checks[1], 5) << "then at min_steps";
  EXPECT_EQ(checks.back(), 100);
  EXPECT_LT(checks.size(), 12u) << "few agreement collectives";
}

TEST(SearchTiming, ConfigKeysAreValidated) {
  EXPECT_THROW(parseConfig("search: {timed_steps: 50, max_steps: 10}", "t.yaml"), ConfigError);
  try {
    parseConfig("search: {min_time_s: 3, max_time_s: 1}", "t.yaml");
    FAIL() << "accepted max_time_s < min_time_s";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("search.max_time_s (1) is below search.min_time_s (3)"),
              std::string::npos) << e.what();
  }
  EXPECT_THROW(parseConfig("search: {min_time_s: -1}", "t.yaml"), ConfigError);
  EXPECT_THROW(parseConfig("search: {rounds: many}", "t.yaml"), ConfigError);
}

namespace {

/// True throughput curve 1000 m / (m + 8) (a plateau from ~64 on), seen through
/// a machine whose speed drifts from call to call: `factor(call)` multiplies it.
class DriftingMeasurer : public Measurer {
 public:
  explicit DriftingMeasurer(std::function<double(int)> factor) : factor_(std::move(factor)) {}
  Measurement measure(int64_t per_gpu, int64_t, const Levers&, const TimingRule&, int64_t) override {
    Measurement m;
    const double truth = 1000.0 * per_gpu / (per_gpu + 8);
    m.samples_per_s = truth * factor_(calls++);
    m.sps_low = 0.99 * m.samples_per_s;
    m.sps_high = 1.01 * m.samples_per_s;
    m.peak_mb = 100;
    m.timed_steps = 10;
    m.step_seconds.assign(10, per_gpu / m.samples_per_s);
    return m;
  }
  double memoryBudgetMb() const override { return 0; }
  std::string deviceName() const override { return "drifting"; }
  int calls = 0;

 private:
  std::function<double(int)> factor_;
};

std::vector<SearchResult> driftSearch(const std::string& yaml, std::function<double(int)> factor) {
  auto cfg = parseConfig(yaml, "t.yaml");
  std::vector<SearchResult> results(2);
  batchdist::testsupport::runRanks(2, [&](collective::Communicator& comm) {
    DriftingMeasurer m(factor);
    BatchSearch search(cfg, comm, m, 1 << 20, false);
    results[comm.rank()] = search.run(nullptr);
  });
  return results;
}

}  // namespace

TEST(SearchInterleaved, PairedRoundsUndoALuckyFirstMeasurement) {
  // The walk measures 8, 16, 32, 64, 128; 32 is measured during a burst of speed
  // (+40 %: 1120 instead of 800), looks best, and ends the walk early (two
  // doublings without gain). Truth, 1000 m/(m+8): 64 gives 889, 128 gives 941;
  // 64 is 5.5 % below 128, so at tolerance 5 % the answer is 128. During the
  // rounds (3 contenders: calls 5-7, 8-10, 11-13) the machine slows by 20 % per
  // round, and a little (0.3 %) within each round.
  const auto factor = [](int call) {
    if (call == 2) return 1.4;  // 32, lucky
    if (call < 5) return 1.0;   // the walk
    return std::pow(0.8, (call - 5) / 3) * (1 - 0.003 * ((call - 5) % 3));
  };
  const std::string yaml = "search: {min: 8, max: 256, tolerance: 0.05, rounds: 3}";
  const auto res = driftSearch(yaml, factor);
  EXPECT_EQ(res[0].chosen, res[1].chosen);
  EXPECT_EQ(res[0].chosen, 128) << searchTable(res[0]);
  EXPECT_EQ(res[0].rounds, 3);
  EXPECT_NE(res[0].rule.find("interleaved"), std::string::npos) << res[0].rule;
  for (const auto& c : res[0].candidates) {
    if (c.per_gpu == 128 || c.per_gpu == 256) {
      EXPECT_EQ(c.round_sps.size(), 3u) << c.per_gpu;
      EXPECT_EQ(c.measurements, 4) << c.per_gpu;
    }
  }
  // Without the rounds the lucky measurement wins: the test can fail.
  const auto blind = driftSearch("search: {min: 8, max: 256, tolerance: 0.05, rounds: 0}", factor);
  EXPECT_EQ(blind[0].chosen, 32) << searchTable(blind[0]);
}

namespace {

/// The truth of DriftingMeasurer, on a machine that runs at 60 % of its speed
/// until the first per-GPU batch above 16 is measured (the G0 sizes' walk and
/// rounds fall into a slow spell; the adapt range and after run at full speed).
class SlowSpellMeasurer : public Measurer {
 public:
  Measurement measure(int64_t per_gpu, int64_t accum, const Levers&, const TimingRule&,
                      int64_t) override {
    if (per_gpu > 16) spell_over = true;
    Measurement m;
    m.samples_per_s = 1000.0 * per_gpu / (per_gpu + 8) * (spell_over ? 1.0 : 0.6);
    m.sps_low = 0.99 * m.samples_per_s;
    m.sps_high = 1.01 * m.samples_per_s;
    m.peak_mb = 100;
    m.timed_steps = 10;
    m.step_seconds.assign(10, static_cast<double>(per_gpu * accum) / m.samples_per_s);
    calls.emplace_back(per_gpu, accum);
    return m;
  }
  double memoryBudgetMb() const override { return 0; }
  std::string deviceName() const override { return "slow spell"; }
  bool spell_over = false;
  std::vector<std::pair<int64_t, int64_t>> calls;
};

}  // namespace

TEST(SearchAdaptRange, PairedRoundsMeasureTheRatioToThePickNotTheDrift) {
  // Note [adapt range], pairing. G0 = 32 on 2 ranks: the walk and the rounds measure 8 x 2
  // and 16 x 1 at 60 % speed; the adapt range (32, 64, 128, 256) runs at full speed. Unpaired,
  // 32 looks 2 x faster than the pick 16 (800 / 400); the truth is 800 / 667 = 1.2.
  const auto search = [](int64_t rounds) {
    auto cfg = parseConfig(strCat("batch: {global: 32, per_gpu: auto, adapt: goodput}\n"
                                  "search: {min: 8, max: 256, tolerance: 0.05, rounds: ",
                                  rounds, "}\n"),
                           "t.yaml");
    std::vector<SearchResult> results(2);
    std::vector<std::vector<std::pair<int64_t, int64_t>>> calls(2);
    batchdist::testsupport::runRanks(2, [&](collective::Communicator& comm) {
      SlowSpellMeasurer m;
      BatchSearch s(cfg, comm, m, 1 << 20, false);
      results[comm.rank()] = s.run(nullptr);
      calls[comm.rank()] = m.calls;
    });
    EXPECT_EQ(calls[0], calls[1]);  // the same measurements, in the same order, on every rank
    return results[0];
  };
  const auto truth = [](double m) { return 1000.0 * m / (m + 8); };
  const auto paired = search(3);
  ASSERT_EQ(paired.chosen, 16) << searchTable(paired);
  const Candidate* pick = nullptr;
  for (const auto& c : paired.candidates) {
    if (c.per_gpu == 16) pick = &c;
  }
  ASSERT_NE(pick, nullptr);
  EXPECT_NEAR(pick->global_sps, 2 * 0.6 * truth(16), 1e-6);  // the pick keeps its own figure
  ASSERT_GE(paired.adapt_range.size(), 3u) << searchTable(paired);
  for (const auto& c : paired.adapt_range) {
    ASSERT_FALSE(c.failed) << c.per_gpu;
    EXPECT_EQ(c.round_sps.size(), 3u) << c.per_gpu;
    EXPECT_NEAR(c.global_sps / pick->global_sps, truth(c.per_gpu) / truth(16), 1e-9) << c.per_gpu;
    // No spread between rounds: the interval is the size's own first one (+-1 %).
    EXPECT_NEAR(relativeUncertainty(c.global_sps, c.sps_low, c.sps_high), 0.01, 1e-9) << c.per_gpu;
  }
  // Without rounds there is no pairing, and the drift is in the ratio: the test can fail.
  const auto blind = search(0);
  ASSERT_FALSE(blind.adapt_range.empty());
  const Candidate* blind_pick = nullptr;
  for (const auto& c : blind.candidates) {
    if (c.per_gpu == blind.chosen && c.accum == blind.chosen_accum) blind_pick = &c;
  }
  ASSERT_NE(blind_pick, nullptr);
  EXPECT_EQ(blind.adapt_range[0].per_gpu, 32);
  EXPECT_TRUE(blind.adapt_range[0].round_sps.empty());
  EXPECT_GT(blind.adapt_range[0].global_sps / blind_pick->global_sps, 1.5 * truth(32) / truth(16));
}

// The adaptive batch's table: paired adapt-range figures are ratios to the pick,
// so the pick's own interval drops out; unpaired, every figure keeps its own.
TEST(SearchAdaptRange, TheThroughputTableTakesThePicksUncertaintyAsZeroOnlyWhenPaired) {
  SearchResult r;
  auto pick = ok(16, 1000);
  pick.sps_low = 900;
  pick.sps_high = 1100;
  pick.accum = 2;
  auto other = ok(8, 800);
  other.sps_low = 780;
  other.sps_high = 820;
  other.accum = 4;
  r.candidates = {other, pick, bad(64, "out of memory on rank 0", 900)};
  r.chosen = 16;
  r.chosen_accum = 2;
  auto larger = ok(32, 1500);
  larger.sps_low = 1400;
  larger.sps_high = 1600;
  r.adapt_range = {larger};
  auto table = adaptThroughput(r);
  ASSERT_EQ(table.size(), 3u);  // the failed size has no figure
  EXPECT_EQ(table[1].per_gpu, 16);
  EXPECT_NEAR(table[1].uncertainty, 0.1, 1e-12);  // not paired: its own interval
  EXPECT_NEAR(table[0].uncertainty, 0.025, 1e-12);
  EXPECT_EQ(table[2].per_gpu, 32);
  EXPECT_NEAR(table[2].uncertainty, 100.0 / 1500, 1e-12);
  r.adapt_range[0].round_sps = {1450, 1500, 1550};
  table = adaptThroughput(r);
  EXPECT_EQ(table[1].uncertainty, 0.0);  // paired: the figures are relative to it
  EXPECT_NEAR(table[0].uncertainty, 0.025, 1e-12);
  EXPECT_NEAR(table[2].uncertainty, 100.0 / 1500, 1e-12);
  EXPECT_DOUBLE_EQ(table[2].samples_per_s, 1500);
}

TEST(SearchInterleaved, RelativeThroughputPairsRoundsOnlyWhenBothHaveThem) {
  Candidate a = ok(16, 900);
  Candidate b = ok(32, 1000);
  EXPECT_NEAR(relativeThroughput(a, b), 0.9, 1e-12);
  a.round_sps = {500, 880, 960};   // drifting rounds
  b.round_sps = {520, 1000, 1000};
  EXPECT_NEAR(relativeThroughput(a, b), 0.96, 1e-12);  // median of 0.9615, 0.88, 0.96
  b.round_sps.pop_back();
  EXPECT_NEAR(relativeThroughput(a, b), 0.9, 1e-12);
}

TEST(SearchInterleaved, OnceRoundsRanOnlyTheCandidatesMeasuredInThemAreChosen) {
  // A lever search's five candidates within reach, of which the 4 fastest first
  // measurements are re-measured: the fifth's single first measurement (133, taken
  // at another time) is not paired with the rounds' medians and does not win.
  Candidate a = ok(8, 124);
  Candidate b = ok(16, 129);
  Candidate late = ok(8, 133);
  late.peak_mb = 50;  // the smallest peak of its size: the rule's pick if it counted
  a.round_sps = {126, 124, 120};
  b.round_sps = {120, 129, 140};
  const std::vector<Candidate> cs{a, b, late};
  EXPECT_TRUE(comparedInRounds(cs, a));
  EXPECT_FALSE(comparedInRounds(cs, late));
  EXPECT_EQ(bestCompared(cs)->global_sps, 129);
  std::string why;
  const auto& pick = chooseCandidate(cs, Objective::kThroughput, 0.05, &why);
  EXPECT_NE(&pick, &cs[2]) << why;
  EXPECT_EQ(pick.per_gpu, 16) << why;  // 8's lowest round ratio, 120 / 140, is out of 5 %
  // Without rounds every candidate that ran is compared: the 133 is the best.
  auto unpaired = cs;
  for (auto& c : unpaired) c.round_sps.clear();
  EXPECT_EQ(bestCompared(unpaired), &unpaired[2]);
  EXPECT_EQ(&chooseCandidate(unpaired, Objective::kThroughput, 0.05), &unpaired[2]);
}

// Note [oom back-off]: a back-off in training marks the cache entry; the next
// run does not take the same batch blindly but chooses again among the cached
// candidates below it, and searches again when none is left.
TEST(Search, TrainingOutOfMemoryMarksTheCacheEntry) {
  SearchResult r;
  r.candidates = {ok(8, 100, 120), ok(16, 190, 140), ok(32, 200, 200)};
  r.adapt_range = {ok(64, 260, 300), ok(128, 300, 420)};  // Note [adapt range]
  r.chosen = 32;
  r.objective = Objective::kMaxFit;
  const batchdist::testsupport::ScratchDir dir("search_cache_oom");  // Note [scratch dirs]
  const auto path = (dir.path() / "search_cache.json").string();
  writeSearchCache(path, "k", r);
  markSearchCacheOom(path, "other key", {{32, 1, 5, 1, 210}});  // another entry: untouched
  EXPECT_EQ(readSearchCache(path, "k").result->chosen, 32);
  EXPECT_TRUE(readSearchCache(path, "k").note.empty());
  markSearchCacheOom(path, "k", {{32, 1, 5, 1, 210}});
  auto found = readSearchCache(path, "k");
  ASSERT_TRUE(found.result.has_value());
  EXPECT_EQ(found.result->chosen, 16);
  EXPECT_NE(found.note.find("per-GPU batch 32 ran out of memory in training at step 5 on rank 1"),
            std::string::npos)
      << found.note;
  EXPECT_NE(found.note.find("taking 16 instead of 32"), std::string::npos) << found.note;
  // The adaptive batch's larger sizes are out too: they are above the one that failed.
  ASSERT_EQ(found.result->adapt_range.size(), 2u);
  for (const auto& c : found.result->adapt_range) {
    EXPECT_TRUE(c.failed) << c.per_gpu;
    EXPECT_NE(c.reason.find("out of memory in training"), std::string::npos) << c.reason;
  }
  markSearchCacheOom(path, "k", {{8, 1, 9, 0, 130}});  // nothing fits any more: search again
  found = readSearchCache(path, "k");
  EXPECT_FALSE(found.result.has_value());
  EXPECT_NE(found.note.find("searching again"), std::string::npos) << found.note;
}

// Note [tokens per sample]: a search over token windows shows tokens/s beside
// samples/s in its table, search.json and cache; a search over other samples
// prints the table as it always did.
TEST(Search, TokenSamplesAddATokensColumnAndLine) {
  SearchResult r;
  r.candidates = {ok(8, 100, 120), ok(16, 190, 140), bad(32, "out of memory on rank 0", 400)};
  r.chosen = 16;
  r.chosen_accum = 1;
  r.world_size = 2;
  const auto plain = searchTable(r);
  EXPECT_EQ(plain.rfind("  per-GPU  accum  global   samples/s   95 % interval          vs best  "
                        "steps   peak MB  result\n",
                        0),
            0u)
      << plain;
  EXPECT_EQ(plain.find("token"), std::string::npos) << plain;
  EXPECT_FALSE(searchJson(r).contains("tokens_per_sample"));
  EXPECT_FALSE(searchJson(r)["candidates"][0].contains("tokens_per_s"));

  r.tokens_per_sample = 64;
  const auto table = searchTable(r);
  const auto header = table.substr(0, table.find('\n'));
  const auto row = table.substr(table.find("\n       16 ") + 1);
  ASSERT_NE(header.find("samples/s     tokens/s   95 % interval"), std::string::npos) << table;
  // 190 samples/s x 64 tokens, right-aligned under its heading.
  ASSERT_NE(row.find(" 12160 "), std::string::npos) << table;
  EXPECT_EQ(row.find(" 12160 ") + 6, header.find("tokens/s") + 8) << table;
  EXPECT_NE(table.find("  tokens: 64 per sample (model.seq_len); the chosen global batch 32 is "
                       "2048 tokens per step\n"),
            std::string::npos)
      << table;
  const auto json = searchJson(r);
  EXPECT_EQ(json.at("tokens_per_sample").get<int64_t>(), 64);
  EXPECT_DOUBLE_EQ(json["candidates"][1].at("tokens_per_s").get<double>(), 190.0 * 64);
  EXPECT_EQ(searchFromJson(nlohmann::json::parse(json.dump())).tokens_per_sample, 64);
}

// Note [tokens per sample]: the why of the choice gives tokens/s beside samples/s
// on token windows, fresh or from the cache (explainChoice: a cached entry written
// before tokens_per_sample was kept reads like a fresh search); on other samples
// it reads as it always did.
TEST(Search, TheWhyOfTheChoiceGivesTokensPerSecondOnTokenSamples) {
  const std::vector<Candidate> c{ok(8, 100), ok(16, 180), ok(32, 290), ok(64, 300), ok(128, 302)};
  std::string why;
  EXPECT_EQ(chooseCandidate(c, Objective::kThroughput, 0.05, &why).per_gpu, 32);
  EXPECT_EQ(why, "the smallest within 5 % of the best throughput (302 samples/s at per-GPU 128): "
                 "290 samples/s, 96.0 % of it");
  EXPECT_EQ(chooseCandidate(c, Objective::kThroughput, 0.05, &why, 64).per_gpu, 32);
  EXPECT_EQ(why, "the smallest within 5 % of the best throughput (302 samples/s, 19328 tokens/s "
                 "at per-GPU 128): 290 samples/s, 18560 tokens/s, 96.0 % of it");
  EXPECT_EQ(chooseCandidate(c, Objective::kThroughput, 0.0, &why, 64).per_gpu, 128);
  EXPECT_EQ(why, "the highest throughput measured (302 samples/s, 19328 tokens/s)");

  // A fresh search over token windows (2 ranks, the global batch fixed).
  const auto cfg = parseConfig("model: {name: gpt, seq_len: 64}\ndata: {name: tokens, path: t.bin}\n"
                               "batch: {global: 32}\nsearch: {min: 2, rounds: 0}",
                               "t.yaml");
  std::vector<SimulatedMeasurer> m{SimulatedMeasurer(1 << 30, 1000, 4),
                                   SimulatedMeasurer(1 << 30, 1000, 4)};
  const auto fresh = searchOnThreads(cfg, m, 100000)[0];
  EXPECT_EQ(fresh.tokens_per_sample, 64);
  const Candidate* pick = nullptr;
  for (const auto& k : fresh.candidates) {
    if (k.per_gpu == fresh.chosen && k.accum == fresh.chosen_accum) pick = &k;
  }
  ASSERT_NE(pick, nullptr);
  const auto rate = formatFixed(pick->global_sps, 0) + " samples/s, " +
                    formatFixed(pick->global_sps * 64, 0) + " tokens/s";
  EXPECT_NE(fresh.why.find(rate), std::string::npos) << fresh.why << " / " << rate;

  // A cached entry from before tokens_per_sample was kept: run.cc sets it and
  // says the why again.
  SearchResult old;
  old.candidates = c;
  old.chosen = 32;
  old.tolerance = 0.05;
  chooseCandidate(old.candidates, old.objective, old.tolerance, &old.why);
  const testsupport::ScratchDir scratch("search_cache_why");  // Note [scratch dirs]
  const auto path = (scratch.path() / "search_cache.json").string();
  writeSearchCache(path, "k", old);
  auto cached = readSearchCache(path, "k").result;
  ASSERT_TRUE(cached.has_value());
  EXPECT_EQ(cached->why.find("tokens"), std::string::npos) << cached->why;
  explainChoice(*cached);  // still no tokens: the words are the same
  EXPECT_EQ(cached->why, old.why);
  cached->tokens_per_sample = 64;
  explainChoice(*cached);
  EXPECT_EQ(cached->why, "the smallest within 5 % of the best throughput (302 samples/s, 19328 "
                         "tokens/s at per-GPU 128): 290 samples/s, 18560 tokens/s, 96.0 % of it");
  EXPECT_NE(searchTable(*cached).find("chosen per-GPU batch 32 x accum 1: the smallest within 5 % "
                                      "of the best throughput (302 samples/s, 19328 tokens/s"),
            std::string::npos)
      << searchTable(*cached);
  // A choice the rule would not make (another cache's rules) keeps its own why.
  cached->chosen = 64;
  cached->why = "kept";
  explainChoice(*cached);
  EXPECT_EQ(cached->why, "kept");
}
