// report.html and metrics.jsonl from typed inputs (the browser test,
// tests/report_html_browser.sh, loads a real run's page in chromium).
#include <gtest/gtest.h>

#include <sstream>

#include "worker/report/diagnose.h"
#include "worker/report/html.h"
#include "worker/report/report.h"

using namespace batchdist::worker;
using Json = nlohmann::ordered_json;

namespace {

int count(const std::string& s, const std::string& what) {
  int n = 0;
  for (auto at = s.find(what); at != std::string::npos; at = s.find(what, at + 1)) ++n;
  return n;
}

TrainResult sampleResult() {
  TrainResult r;
  for (int e = 0; e < 3; ++e) {
    for (int k = 1; k <= 4; ++k) {
      MetricPoint m;
      m.step = e * 4 + k;
      m.epoch = e + 1;
      m.train_loss = 2.0 / m.step;
      m.lr = 0.1;
      m.samples_per_s = 1000 + k;
      m.time.compute = 1;
      m.noise_scale = 10.0 * m.step;
      r.metrics.push_back(m);
    }
    MetricPoint end;
    end.epoch_end = true;
    end.step = (e + 1) * 4;
    end.epoch = e + 1;
    end.eval_loss = 1.0 / (e + 1);
    end.eval_metrics = {{"accuracy", 0.5 + 0.1 * e}};
    end.noise_scale = 30.0 * (e + 1);
    r.metrics.push_back(end);
  }
  r.noise.measured = true;
  r.noise.b_simple = 100;
  r.noise.b_big = 512;
  r.noise.b_small = 128;
  r.history.push_back({0, 1.0, 1.0, {{"accuracy", 0.9}}, 1000, 1, 100});
  r.time.compute = 8;
  r.time.data_wait = 2;
  return r;
}

Json searchDoc(bool intervals) {
  Json s{{"chosen", 32}, {"why", "smallest within 5 %"}, {"objective", "throughput"},
         {"memory_budget_mb", 900}, {"device", "cpu"}, {"world_size", 2}};
  auto cands = Json::array();
  for (int m : {8, 16, 32, 64, 128}) {
    Json c{{"per_gpu_batch", m}, {"samples_per_s", 100.0 * std::min(m, 32)},
           {"peak_memory_mb", 10.0 * m}, {"failed", m == 128},
           {"reason", m == 128 ? "out of memory" : ""}, {"chosen", m == 32}};
    if (intervals && m != 128) {
      c["ci_low"] = 90.0 * std::min(m, 32);
      c["ci_high"] = 110.0 * std::min(m, 32);
    }
    cands.push_back(c);
  }
  s["candidates"] = cands;
  return s;
}

}  // namespace

TEST(ReportHtml, SelfContainedPageWithEveryPlot) {
  const auto r = sampleResult();
  Json report{{"world_size", 4}, {"global_batch", 512}, {"per_gpu_batch", 32},
              {"time_breakdown", {{"compute_s", 8}, {"data_wait_s", 2}, {"comm_s", 0}, {"skew_s", 0}}},
              {"noise_scale", {{"measured", true}, {"b_simple", 100}, {"global_batch", 512}}},
              {"diagnosis", {"noise scale: the global batch 512 is 5.1x ..."}},
              {"plan", {{"per_gpu", 32}, {"global", 512}}}};
  const auto page = reportHtml(report, searchDoc(false), r.metrics);
  for (const char* id : {"plot-search", "plot-loss", "plot-accuracy", "plot-lr", "plot-throughput",
                         "plot-time", "plot-noise", "search-choice", "card-noise", "diagnosis"}) {
    EXPECT_NE(page.find(std::string("id=\"") + id + "\""), std::string::npos) << id;
  }
  // Self-contained: no script, nothing fetched (the only URL is SVG's namespace).
  EXPECT_EQ(page.find("<script"), std::string::npos);
  EXPECT_EQ(page.find(" src="), std::string::npos);
  EXPECT_EQ(page.find(" href="), std::string::npos);
  EXPECT_EQ(count(page, "http"), count(page, "http://www.w3.org/2000/svg"));
  EXPECT_EQ(count(page, "class=\"ci\""), 0);  // no intervals in search.json: plain points
  EXPECT_EQ(count(page, "class=\"sps\""), 4);
  EXPECT_EQ(count(page, "class=\"failed\""), 1);
  EXPECT_NE(page.find("samples are being wasted"), std::string::npos);
  EXPECT_NE(page.find("noise scale: the global batch 512"), std::string::npos);
}

// Note [mfu]: the summary quotes the run's MFU and its peak; the search table
// gives each candidate's from the same FLOPs and peak (searchDoc: world 2).
TEST(ReportHtml, MfuInTheSummaryAndTheSearchTable) {
  const auto r = sampleResult();
  Json report{{"global_batch", 64},     {"samples_per_s", 3200},        {"mfu", 0.4},
              {"flops_per_sample", 1e9}, {"peak_tflops", 4},             {"peak_source", "train.peak_tflops"}};
  const auto page = reportHtml(report, searchDoc(false), r.metrics);
  EXPECT_NE(page.find("3200 samples/s, MFU 40.0 % (peak 4 TFLOP/s a device, train.peak_tflops)."),
            std::string::npos);
  // 32: 3200 samples/s x 1 GFLOP / (2 x 4 TFLOP/s) = 40 %; 8: 10 %; 128 failed: no figures.
  EXPECT_NE(page.find("<td class=\"num\">32</td><td class=\"num\">3200</td><td class=\"num\">40.0 %</td>"
                      "<td class=\"num\">320</td><td>chosen</td>"),
            std::string::npos);
  EXPECT_NE(page.find("<td class=\"num\">8</td><td class=\"num\">800</td><td class=\"num\">10.0 %</td>"),
            std::string::npos);
  EXPECT_NE(page.find("<td class=\"num\">128</td><td class=\"num\"></td><td class=\"num\"></td>"
                      "<td class=\"num\"></td><td>failed: out of memory</td>"),
            std::string::npos);
  // No yardstick: no MFU column and none in the summary.
  const auto plain = reportHtml(Json{{"global_batch", 64}}, searchDoc(false), r.metrics);
  EXPECT_NE(plain.find("id=\"search-table\""), std::string::npos);
  EXPECT_EQ(plain.find("MFU"), std::string::npos);
}

TEST(ReportHtml, SearchIntervalsUnderEitherName) {
  const auto r = sampleResult();
  Json report{{"global_batch", 64}};
  EXPECT_EQ(count(reportHtml(report, searchDoc(true), r.metrics), "class=\"ci\""), 4);
  auto s = searchDoc(false);
  for (auto& c : s["candidates"]) c["samples_per_s_ci"] = {1.0, 2.0};
  EXPECT_EQ(count(reportHtml(report, s, r.metrics), "class=\"ci\""), 4);  // not on the failed one
  // Ends of 0: the search had no interval for it.
  s = searchDoc(false);
  for (auto& c : s["candidates"]) c["ci_low"] = c["ci_high"] = 0.0;
  EXPECT_EQ(count(reportHtml(report, s, r.metrics), "class=\"ci\""), 0);
  // Not searched, not measured: the page still renders and says so.
  Json bare{{"noise_scale", {{"measured", false}, {"why_not", "it needs at least 2 ranks"}}}};
  const auto page = reportHtml(bare, Json(), {});
  EXPECT_NE(page.find("not searched"), std::string::npos);
  EXPECT_NE(page.find("it needs at least 2 ranks"), std::string::npos);
  EXPECT_NE(page.find("no data"), std::string::npos);
}

TEST(ReportHtml, MetricsJsonlOneObjectPerLine) {
  const auto text = metricsJsonl(sampleResult());
  std::istringstream in(text);
  std::string line;
  int steps = 0, epochs = 0;
  while (std::getline(in, line)) {
    const auto j = nlohmann::json::parse(line);
    if (j.at("kind") == "epoch") {
      ++epochs;
      EXPECT_TRUE(j.contains("eval_accuracy"));
    } else {
      ++steps;
      EXPECT_FALSE(j.contains("eval_accuracy"));
    }
    EXPECT_GT(j.at("noise_scale").get<double>(), 0);
    EXPECT_DOUBLE_EQ(j.at("compute_fraction").get<double>(), j.at("kind") == "epoch" ? 0.0 : 1.0);
  }
  EXPECT_EQ(steps, 12);
  EXPECT_EQ(epochs, 3);
}

// Free memory is advice for a fixed batch, and the search's reason for a searched one
// (the H200 run said "try batch.per_gpu: auto" to a run that had searched).
TEST(Diagnose, FreeMemoryAdvisesTheSearchOnlyWhereItDidNotRun) {
  Config cfg;
  auto r = sampleResult();
  r.memory_total_mb = 143155;
  r.peak_memory_mb = 44107;
  auto line = [&] {
    for (const auto& s : diagnose(cfg, r, true, "NVIDIA H200")) {
      if (s.rfind("memory:", 0) == 0) return s;
    }
    return std::string();
  };
  EXPECT_NE(line().find("peak 43.1 GiB of 139.8 GiB (31 %); a larger batch fits: try batch.per_gpu: auto"),
            std::string::npos)
      << line();
  cfg.batch.per_gpu_auto = true;
  EXPECT_NE(line().find("(31 %); the batch search chose it, the smallest within 5 % of the best samples/s"),
            std::string::npos)
      << line();
  EXPECT_EQ(line().find("try batch.per_gpu: auto"), std::string::npos) << line();
  r.peak_memory_mb = 100000;  // over half: nothing to say
  EXPECT_EQ(line(), "");
}

// Note [mfu]: a GPU's MFU under 30 % is a finding that names what to look at
// first; the CPU's yardstick (a measured GEMM) makes none.
TEST(Diagnose, LowMfuOnAGpuNamesTheFirstLever) {
  Config cfg;
  auto r = sampleResult();  // data waits 2 s of 10: the data finding fires
  r.samples_per_s = 1000;
  Yardstick y;
  y.flops_per_sample = 24.5e9;  // ResNet-50 at 224
  y.peak_flops = 989e12;
  y.peak_source = "table: NVIDIA H100 80GB HBM3, bf16 dense";
  y.ranks = 8;
  auto line = [&](bool cuda) {
    for (const auto& s : diagnose(cfg, r, cuda, "NVIDIA H100 80GB HBM3", 0, 0, &y)) {
      if (s.rfind("utilisation: MFU", 0) == 0) return s;
    }
    return std::string();
  };
  // 1000 x 24.5e9 / (8 x 989e12) = 0.31 %
  EXPECT_EQ(line(true), "utilisation: MFU 0.31 % (3.1 TFLOP/s a device of a peak 989, table: "
                        "NVIDIA H100 80GB HBM3, bf16 dense); eager training reaches 30-45 %: the "
                        "step waits for data: see the data finding");
  EXPECT_EQ(line(false), "");  // the CPU's peak is a yardstick, not the hardware's
  r.time.data_wait = 0;
  cfg.train.precision = Precision::kBf16;
  cfg.model.name = ModelName::kResnet50;
  cfg.train.memory_format = MemoryFormat::kContiguous;
  EXPECT_NE(line(true).find("try train.memory_format: channels_last"), std::string::npos) << line(true);
  cfg.train.memory_format = MemoryFormat::kAuto;
  cfg.optim.kernels = StepKernels::kPerTensor;
  EXPECT_NE(line(true).find("try optim.kernels: auto"), std::string::npos) << line(true);
  cfg.optim.kernels = StepKernels::kAuto;
  EXPECT_NE(line(true).find("profile.active: 3"), std::string::npos) << line(true);
  r.samples_per_s = 130000;  // 40 %: nothing to say
  EXPECT_EQ(line(true), "");
  EXPECT_EQ(diagnose(cfg, r, true, "NVIDIA H100 80GB HBM3").size(),
            diagnose(cfg, r, true, "NVIDIA H100 80GB HBM3", 0, 0, &y).size());
}

TEST(Diagnose, GlobalBatchFarAboveTheNoiseScaleIsReportedWithItsNumbers) {
  Config cfg;
  auto r = sampleResult();  // G = 512, last epoch B_simple = 100
  auto found = diagnose(cfg, r, false, "cpu");
  ASSERT_FALSE(found.empty());
  const auto& f = found.back();
  EXPECT_NE(f.find("global batch 512 is 5.1x the gradient noise scale B_simple ~ 100"),
            std::string::npos)
      << f;
  EXPECT_NE(f.find("3.1x the epochs"), std::string::npos) << f;
  r.history.back().noise_scale = 400;  // 1.3x: nothing to say
  for (const auto& s : diagnose(cfg, r, false, "cpu")) EXPECT_EQ(s.find("noise scale"), std::string::npos) << s;
  // A noise scale below 1 is quoted as it is, not rounded to a 0 the ratio divides by.
  r.history.back().noise_scale = 0.43;
  found = diagnose(cfg, r, false, "cpu");
  ASSERT_FALSE(found.empty());
  EXPECT_NE(found.back().find("B_simple ~ 0.43 ("), std::string::npos) << found.back();
  EXPECT_NE(found.back().find("(1 + 512/0.43) / 2 = 595.8x"), std::string::npos) << found.back();
  // ... nor advised as a global batch of 0: at least 1.
  EXPECT_NE(found.back().find("lower batch.global toward 1 (fewer ranks"), std::string::npos)
      << found.back();
  EXPECT_EQ(noiseScaleText(9.96), "10");
  EXPECT_EQ(noiseScaleText(1.26), "1.3");
  EXPECT_EQ(noiseScaleText(123.4), "123");
  r.history.back().noise_scale = 5000;  // far below: a larger batch is cheap
  found = diagnose(cfg, r, false, "cpu");
  ASSERT_FALSE(found.empty());
  EXPECT_NE(found.back().find("well below"), std::string::npos) << found.back();
  // |G|^2 came out <= 0: B_simple is beyond what this batch resolves.
  r.history.back().noise_scale = -1;
  r.noise.b_simple = -1;
  r.noise.grad_sq = -1e-4;
  r.noise.trace = 3;
  found = diagnose(cfg, r, false, "cpu");
  ASSERT_FALSE(found.empty());
  EXPECT_NE(found.back().find("too large to measure at global batch 512"), std::string::npos)
      << found.back();
}

// Note [goodput] (worker/plan/adapt.h): the advice never names a global batch that
// leaves an epoch fewer than batch.adapt_min_steps steps (the quickstart's digits:
// B_simple ~ 1720 for 1438 training samples, at most 1438 / 8 = 179).
TEST(Diagnose, NoiseAdviceRespectsTheTrainingSetSize) {
  Config cfg;  // batch.adapt_min_steps: 8
  auto r = sampleResult();
  r.noise.b_big = 64;
  r.history.back().noise_scale = 1720;  // 64 is well below it
  auto found = diagnose(cfg, r, false, "cpu", 1438);
  ASSERT_FALSE(found.empty());
  EXPECT_NE(found.back().find("toward 179 (B_simple capped by the data: 1438 training samples / 8 "
                              "steps an epoch"),
            std::string::npos)
      << found.back();
  EXPECT_EQ(found.back().find("toward 1720"), std::string::npos) << found.back();
  // The training set size unknown: B_simple itself.
  found = diagnose(cfg, r, false, "cpu");
  EXPECT_NE(found.back().find("toward 1720 (more ranks"), std::string::npos) << found.back();
  // Already at the data's ceiling: no larger batch is advised.
  r.noise.b_big = 256;
  found = diagnose(cfg, r, false, "cpu", 1438);
  EXPECT_NE(found.back().find("the 1438 training samples allow no larger batch with 8 steps"),
            std::string::npos)
      << found.back();
  EXPECT_EQ(found.back().find("toward"), std::string::npos) << found.back();
  // Far above B_simple: lower toward B_simple, or the cap when that is smaller.
  r.noise.b_big = 512;
  r.history.back().noise_scale = 100;
  cfg.batch.adapt_min_steps = 10;
  found = diagnose(cfg, r, false, "cpu", 600);  // 600 / 10 = 60 < 100
  EXPECT_NE(found.back().find("lower batch.global toward 60 (B_simple capped by the data: 600 "
                              "training samples / 10 steps"),
            std::string::npos)
      << found.back();
}

// Note [tokens per sample]: on token windows (the plan's tokens per sample) the
// noise-scale finding gives B_simple and every batch it names in tokens too, and
// names batch.global_tokens when that key gave the batch; without tokens it reads
// exactly as before.
TEST(Diagnose, NoiseFindingsInTokensOnTokenWindows) {
  Config cfg;
  auto r = sampleResult();  // G = 512, last epoch B_simple = 100
  const auto finding = [&](int64_t tokens, int64_t n = 0) {
    const auto found = diagnose(cfg, r, false, "cpu", n, tokens);
    EXPECT_FALSE(found.empty());
    return found.empty() ? std::string() : found.back();
  };
  auto f = finding(64);
  EXPECT_NE(f.find("noise scale: the global batch 512 (32768 tokens) is 5.1x the gradient noise "
                   "scale B_simple ~ 100 (6400 tokens, last epoch); samples are being wasted"),
            std::string::npos)
      << f;
  EXPECT_NE(f.find("lower batch.global toward 100 (6400 tokens) (fewer ranks"), std::string::npos) << f;
  EXPECT_EQ(finding(0).find("token"), std::string::npos) << finding(0);
  EXPECT_NE(finding(0).find("the global batch 512 is 5.1x the gradient noise scale B_simple ~ 100 "
                            "(last epoch); "),
            std::string::npos)
      << finding(0);
  // The batch given in tokens: the advice names that key, in tokens.
  cfg.batch.global_tokens = 32768;
  f = finding(64, 600);  // 600 / 8 = 75 < 100: capped
  EXPECT_NE(f.find("lower batch.global_tokens toward 4800 (global batch 75) (B_simple capped by the "
                   "data: 600 training samples / 8 steps"),
            std::string::npos)
      << f;
  cfg.batch.global_tokens = 0;
  // Well below B_simple; a B_simple of a fraction of a window keeps two digits in tokens.
  r.history.back().noise_scale = 5000;
  f = finding(64);
  EXPECT_NE(f.find("B_simple ~ 5000 (320000 tokens, last epoch); a larger global batch, toward 5000 "
                   "(320000 tokens) (more ranks"),
            std::string::npos)
      << f;
  r.history.back().noise_scale = 0.05;
  f = finding(64);
  EXPECT_NE(f.find("B_simple ~ 0.05 (3.2 tokens, last epoch)"), std::string::npos) << f;
  // Too large to measure: the global batch in tokens, and the data's ceiling.
  r.history.back().noise_scale = -1;
  r.noise.b_simple = -1;
  r.noise.grad_sq = -1e-4;
  r.noise.trace = 3;
  r.noise.b_big = 64;
  f = finding(64, 1438);
  EXPECT_NE(f.find("too large to measure at global batch 64 (4096 tokens) (the smoothed"),
            std::string::npos)
      << f;
  EXPECT_NE(f.find(", up to 179 (11456 tokens) for 1438 training samples at 8 steps an epoch"),
            std::string::npos)
      << f;
  EXPECT_EQ(finding(0, 1438).find("token"), std::string::npos) << finding(0, 1438);
}

TEST(ReportHtml, NoiseCardCapsTheAdviceByTheTrainingSet) {
  const auto r = sampleResult();
  const auto card = [&](const Json& report) {
    const auto page = reportHtml(report, Json(), r.metrics);
    const auto at = page.find("id=\"card-noise\"");
    EXPECT_NE(at, std::string::npos);
    return page.substr(at, page.find("</div>\n</div>", at) - at);
  };
  Json report{{"world_size", 2}, {"global_batch", 64}, {"per_gpu_batch", 32},
              {"noise_scale", {{"measured", true}, {"b_simple", 1720}, {"global_batch", 64}}},
              {"plan", {{"dataset_size", 1438}}}};
  auto c = card(report);
  EXPECT_NE(c.find("<div class=\"big\">~179</div>"), std::string::npos) << c;
  EXPECT_NE(c.find("B_simple ~1720, capped by the data: 1438 training samples / 8 steps"),
            std::string::npos)
      << c;
  report["config"] = {{"batch", {{"adapt_min_steps", 4}}}};  // 1438 / 4 = 359
  EXPECT_NE(card(report).find("<div class=\"big\">~359</div>"), std::string::npos);
  report["plan"]["dataset_size"] = 100000;  // 12500 > 1720: B_simple stands
  c = card(report);
  EXPECT_NE(c.find("<div class=\"big\">~1720</div>"), std::string::npos) << c;
  EXPECT_EQ(c.find("capped"), std::string::npos) << c;
  // Below 10, two digits as the console gives it (noiseScaleText), not ~0.
  report["noise_scale"]["b_simple"] = 0.43;
  c = card(report);
  EXPECT_NE(c.find("<div class=\"big\">~0.43</div>gradient noise scale B_simple; this run's "
                   "global batch 64 is 148.8x it"),
            std::string::npos)
      << c;
  EXPECT_EQ(c.find("token"), std::string::npos) << c;
}

namespace {

/// The `id` chart's svg element, or "" when the page has none.
std::string chart(const std::string& page, const std::string& id) {
  const auto at = page.find("<svg id=\"" + id + "\"");
  if (at == std::string::npos) return "";
  return page.substr(at, page.find("</svg>", at) - at);
}

/// The vertices of the `n`-th polyline (0-based) of an svg element.
std::vector<std::pair<double, double>> polyline(const std::string& svg, int n) {
  size_t at = 0;
  for (int i = 0; i <= n; ++i) {
    at = svg.find("<polyline class=\"series\" points=\"", at);
    if (at == std::string::npos) return {};
    at += std::string("<polyline class=\"series\" points=\"").size();
  }
  std::istringstream in(svg.substr(at, svg.find('"', at) - at));
  std::vector<std::pair<double, double>> out;
  double x, y;
  char comma;
  while (in >> x >> comma >> y) out.emplace_back(x, y);
  return out;
}

/// sampleResult() with G = 64 for steps 1-4, 128 for 5-8 and 256 for 9-12 (the
/// epoch-end points carry their last step's G).
TrainResult adaptiveResult() {
  auto r = sampleResult();
  for (auto& m : r.metrics) m.global_batch = m.step <= 4 ? 64 : m.step <= 8 ? 128 : 256;
  return r;
}

}  // namespace

// batch.adapt: goodput (Note [goodput]): the global batch as a step line, one
// vertical (a pair of vertices) per change, on the log axis of B_simple.
TEST(ReportHtml, AdaptivePlotDrawsTheGlobalBatchAsAStepLine) {
  const auto r = adaptiveResult();
  Json report{{"global_batch", 64}};
  const auto page = reportHtml(report, Json(), r.metrics);
  EXPECT_NE(page.find("<h2>Global batch and noise scale</h2>"), std::string::npos);
  const auto svg = chart(page, "plot-adapt");
  ASSERT_FALSE(svg.empty());
  // Start, a pair per change (at the first point showing the new G), end.
  const auto g = polyline(svg, 0);
  ASSERT_EQ(g.size(), 2u + 2 * 2);
  EXPECT_EQ(g[0].second, g[1].second);  // 64 from step 0 ...
  EXPECT_EQ(g[1].first, g[2].first);    // ... to step 5, up to 128
  EXPECT_LT(g[2].second, g[1].second);  // larger G higher on the page
  EXPECT_EQ(g[2].second, g[3].second);
  EXPECT_EQ(g[3].first, g[4].first);
  EXPECT_EQ(g[4].second, g[5].second);
  EXPECT_LT(g[0].first, g[1].first);
  EXPECT_LT(g[4].first, g[5].first);
  // Log scale: 64 -> 128 -> 256 are equal rises.
  EXPECT_NEAR(g[1].second - g[2].second, g[3].second - g[4].second, 0.11);
  for (const char* label : {"global batch 64 at 0", "global batch 64 at 5", "global batch 128 at 5",
                            "global batch 128 at 9", "global batch 256 at 9",
                            "global batch 256 at 12"}) {
    EXPECT_NE(svg.find(std::string("<title>") + label + "</title>"), std::string::npos) << label;
  }
  EXPECT_EQ(count(svg, "<circle"), 6);
  // The smoothed B_simple: the 12 interval points (the epoch ends are per-epoch values).
  EXPECT_EQ(polyline(svg, 1).size(), 12u);
  EXPECT_NE(svg.find(">B_simple (smoothed)</text>"), std::string::npos);
  EXPECT_NE(svg.find(">100</text>"), std::string::npos);  // a decade tick
  // No history in the report: no table.
  EXPECT_EQ(page.find("id=\"batch-history\""), std::string::npos);
}

// report.json's batch_history places the changes at the steps they apply from,
// and is listed as a table.
TEST(ReportHtml, AdaptiveHistoryTable) {
  const auto r = adaptiveResult();
  Json report{{"global_batch", 64}};
  report["batch_history"] = Json::array(
      {Json{{"step", 0}, {"global_batch", 64}, {"per_gpu_batch", 32}, {"accum", 1},
            {"lr_gain", 1.0}, {"noise_scale", -1}},
       Json{{"step", 4}, {"global_batch", 128}, {"per_gpu_batch", 32}, {"accum", 2},
            {"lr_gain", 1.6}, {"noise_scale", 150.4}},
       Json{{"step", 6}, {"global_batch", 128}, {"per_gpu_batch", 32}, {"accum", 2},
            {"lr_gain", 1.7}, {"noise_scale", 180}},  // a re-decision that kept the split
       Json{{"step", 8}, {"global_batch", 256}, {"per_gpu_batch", 64}, {"accum", 2},
            {"lr_gain", 2.125}, {"noise_scale", 300}}});
  const auto page = reportHtml(report, Json(), r.metrics);
  const auto svg = chart(page, "plot-adapt");
  ASSERT_FALSE(svg.empty());
  EXPECT_EQ(polyline(svg, 0).size(), 6u);
  for (const char* label : {"global batch 64 at 4", "global batch 128 at 4",
                            "global batch 128 at 8", "global batch 256 at 8"}) {
    EXPECT_NE(svg.find(std::string("<title>") + label + "</title>"), std::string::npos) << label;
  }
  const auto at = page.find("<table id=\"batch-history\">");
  ASSERT_NE(at, std::string::npos);
  const auto table = page.substr(at, page.find("</table>", at) - at);
  EXPECT_EQ(count(table, "<tr>"), 4);  // the header and the 3 changes
  EXPECT_EQ(table.find("1.700"), std::string::npos) << table;
  EXPECT_NE(page.find("1 re-decision(s) kept the split"), std::string::npos);
  EXPECT_NE(table.find("<td class=\"num\">4</td><td class=\"num\">128</td><td class=\"num\">32</td>"
                       "<td class=\"num\">2</td><td class=\"num\">1.600</td><td class=\"num\">150</td>"),
            std::string::npos)
      << table;
  EXPECT_NE(table.find("<td class=\"num\">1.000</td><td class=\"num\">unknown</td>"),
            std::string::npos)
      << table;
  // An adaptive run whose G never changed still shows its (flat) line and table.
  report["batch_history"] = Json::array({report["batch_history"][0]});
  const auto flat = reportHtml(report, Json(), sampleResult().metrics);
  EXPECT_EQ(polyline(chart(flat, "plot-adapt"), 0).size(), 2u);
  EXPECT_NE(flat.find("id=\"batch-history\""), std::string::npos);
}

// A run whose global batch never changed gets the page it had before adaptation.
TEST(ReportHtml, ConstantGlobalBatchAddsNothing) {
  auto r = sampleResult();  // global_batch unset (0) everywhere
  Json report{{"global_batch", 64},
              {"noise_scale", {{"measured", true}, {"b_simple", 100}, {"global_batch", 64}}}};
  const auto before = reportHtml(report, Json(), r.metrics);
  for (auto& m : r.metrics) m.global_batch = 64;
  const auto page = reportHtml(report, Json(), r.metrics);
  EXPECT_EQ(page, before);
  EXPECT_EQ(page.find("plot-adapt"), std::string::npos);
  EXPECT_EQ(page.find("Global batch and noise scale"), std::string::npos);
  report["batch_history"] = Json::array();  // empty: nothing either
  EXPECT_EQ(reportHtml(report, Json(), r.metrics), before);
}

// Note [tokens per sample]: a run on token windows reports tokens beside samples
// (report.json, its history, metrics.jsonl, the page's summary); any other run's
// documents have no token key at all.
TEST(ReportHtml, TokenRunsReportTokensBesideSamples) {
  const auto cfg = parseConfig("model: {name: gpt, seq_len: 64}\ndata: {name: tokens, path: t.bin}\n"
                               "batch: {global_tokens: 2070}", "t.yaml");
  const auto plan = makePlan(cfg, 2, 494, false);
  auto result = sampleResult();
  result.samples = 1000;
  result.samples_per_s = 250;
  for (auto& m : result.metrics) {
    m.tokens_per_sample = plan.tokens_per_sample;
    m.global_batch = plan.global;
  }
  RunInfo info;
  info.validation_samples = 54;
  const auto report = runReport(cfg, plan, result, info);
  EXPECT_EQ(report.at("tokens_per_step").get<int64_t>(), 32 * 64);
  EXPECT_EQ(report.at("tokens").get<int64_t>(), 1000 * 64);
  EXPECT_DOUBLE_EQ(report.at("tokens_per_s").get<double>(), 250.0 * 64);
  EXPECT_DOUBLE_EQ(report["history"][0].at("tokens_per_s").get<double>(), 1000.0 * 64);
  EXPECT_EQ(report["plan"].at("global_tokens_asked").get<int64_t>(), 2070);
  EXPECT_EQ(report["config"]["batch"].at("global_tokens").get<int64_t>(), 2070);
  std::istringstream lines(metricsJsonl(result));
  std::string line;
  while (std::getline(lines, line)) {
    const auto j = nlohmann::json::parse(line);
    EXPECT_DOUBLE_EQ(j.at("tokens_per_s").get<double>(), 64 * j.at("samples_per_s").get<double>());
    EXPECT_EQ(j.at("tokens_per_step").get<int64_t>(), 2048);
  }
  // The noise scale (sampleResult: B_simple 100 at global batch 512) in tokens too.
  const auto& noise = report.at("noise_scale");
  EXPECT_DOUBLE_EQ(noise.at("b_simple_tokens").get<double>(), 100.0 * 64);
  EXPECT_EQ(noise.at("global_batch_tokens").get<int64_t>(), 512 * 64);
  auto search = Json{{"chosen", 32}, {"why", "the highest throughput measured"},
                     {"tokens_per_sample", 64}, {"candidates", Json::array()}};
  for (int m : {8, 16, 32}) {
    search["candidates"].push_back({{"per_gpu_batch", m}, {"samples_per_s", 100.0 * m},
                                    {"peak_memory_mb", 10.0 * m}, {"chosen", m == 32}});
  }
  const auto page = reportHtml(Json::parse(report.dump()), search, result.metrics);
  EXPECT_NE(page.find("250 samples/s (16000 tokens/s, 2048 tokens per step)."), std::string::npos);
  // report.html's charts: the rates in tokens/s (sampleResult: ~1000 samples/s, so
  // ~64000 tokens/s: a 60000 tick), the noise card and chart with tokens.
  const auto throughput = chart(page, "plot-throughput");
  EXPECT_NE(throughput.find(">tokens/s (all ranks; samples/s x 64)</text>"), std::string::npos)
      << throughput;
  EXPECT_NE(throughput.find(">tokens/s</text>"), std::string::npos) << throughput;
  EXPECT_NE(throughput.find(">60000</text>"), std::string::npos) << throughput;
  const auto searched = chart(page, "plot-search");
  EXPECT_NE(searched.find(">tokens/s (all ranks)</text>"), std::string::npos) << searched;
  EXPECT_NE(searched.find("<title>per-GPU 32: 3200 samples/s, 204800 tokens/s</title>"),
            std::string::npos)
      << searched;
  EXPECT_NE(searched.find(">200000</text>"), std::string::npos) << searched;  // a tick in tokens/s
  EXPECT_NE(page.find("Blue: tokens/s (samples/s x 64) of all ranks"), std::string::npos);
  // 494 windows / 8 steps an epoch cap the advice at 61 (B_simple is 100).
  EXPECT_NE(page.find("<div class=\"big\">~61</div>3904 tokens; gradient noise scale B_simple ~100 "
                      "(6400 tokens), capped by the data: 494 training samples / 8 steps an epoch "
                      "(batch.adapt_min_steps); this run's global batch 32 (2048 tokens) is 0.32x "
                      "B_simple"),
            std::string::npos);
  EXPECT_NE(chart(page, "plot-noise").find(">global batch 32 (2048 tokens)</text>"),
            std::string::npos);

  const auto other = parseConfig("batch: {global: 32}", "t.yaml");
  const auto plain = runReport(other, makePlan(other, 2, 494, false), sampleResult(), info);
  for (const auto& doc : {plain, plain["plan"], plain["history"][0], plain["noise_scale"]}) {
    for (const auto& [key, value] : doc.items()) EXPECT_EQ(key.find("tokens"), std::string::npos) << key;
  }
  EXPECT_EQ(metricsJsonl(sampleResult()).find("tokens"), std::string::npos);
  search.erase("tokens_per_sample");
  const auto plain_page = reportHtml(Json::parse(plain.dump()), search, sampleResult().metrics);
  EXPECT_EQ(plain_page.find("tokens"), std::string::npos);
  EXPECT_NE(chart(plain_page, "plot-throughput").find(">samples/s (all ranks)</text>"),
            std::string::npos);
  EXPECT_NE(chart(plain_page, "plot-search").find(">samples/s (all ranks)</text>"), std::string::npos);
}

namespace {

/// The page's plan table, <table id="plan"> to </table>.
std::string planTable(const std::string& page) {
  const auto at = page.find("<table id=\"plan\">");
  return at == std::string::npos ? "" : page.substr(at, page.find("</table>", at) - at);
}

}  // namespace

// The plan table printed `ranks` and `warnings` as JSON text
// ([{"rank":0,"samples_per_epoch":48},...] and []): now in words.
TEST(ReportHtml, PlanTableSaysRanksAndWarningsInWords) {
  auto plan = makePlan(parseConfig("batch: {global: 16}", "t.yaml"), 2, 96, false);
  const auto each = plan.rankSamplesPerEpoch(0);
  ASSERT_EQ(plan.rankSamplesPerEpoch(1), each);
  auto table = planTable(reportHtml(Json{{"plan", planJson(plan)}}, Json(), {}));
  ASSERT_FALSE(table.empty());
  EXPECT_EQ(table.find('['), std::string::npos) << table;
  EXPECT_EQ(table.find('{'), std::string::npos) << table;
  EXPECT_NE(table.find("<td>ranks</td><td class=\"num\">ranks 0&ndash;1: " + std::to_string(each) +
                       " samples an epoch each</td>"),
            std::string::npos)
      << table;
  EXPECT_NE(table.find("<td>warnings</td><td class=\"num\">none</td>"), std::string::npos) << table;
  // Ranks that differ get lines of their own; each warning a line, escaped.
  auto j = planJson(plan);
  j["ranks"] = Json::array({{{"rank", 0}, {"samples_per_epoch", 10}}, {{"rank", 1}, {"samples_per_epoch", 10}},
                            {{"rank", 2}, {"samples_per_epoch", 9}}});
  j["warnings"] = {"pad <2> samples", "second"};
  table = planTable(reportHtml(Json{{"plan", j}}, Json(), {}));
  EXPECT_NE(table.find("ranks 0&ndash;1: 10 samples an epoch each<br>rank 2: 9 samples an epoch</td>"),
            std::string::npos)
      << table;
  EXPECT_NE(table.find("<td class=\"num\">pad &lt;2&gt; samples<br>second</td>"), std::string::npos) << table;
}
