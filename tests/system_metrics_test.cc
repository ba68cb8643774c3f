// Note [system metrics] and Note [nvml metrics]: the NVML reader against the stub
// library (tests/nvml_stub.cc: complete, and without some entry points), the
// sampler thread, the summaries, and Note [system diagnosis]'s rules.

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "worker/common/util.h"
#include "worker/report/diagnose.h"
#include "worker/report/html.h"
#include "worker/search/cache.h"
#include "worker/train/observe/host_cpu.h"
#include "worker/train/observe/nvml.h"
#include "worker/train/step/step_measurer.h"
#include "worker/train/observe/system_sampler.h"

namespace batchdist::worker {
namespace {

/// Sets an environment variable for one test.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) { setenv(name, value, 1); }
  ~ScopedEnv() { unsetenv(name_); }

 private:
  const char* name_;
};

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

TEST(NvmlTarget, MapsCudaIndicesThroughVisibleDevices) {
  EXPECT_EQ(nvmlTarget(1, "").index, 1);
  EXPECT_EQ(nvmlTarget(1, "2, 3").index, 3);
  const auto by_uuid = nvmlTarget(0, "GPU-5d2c,GPU-77aa");
  EXPECT_EQ(by_uuid.index, -1);
  EXPECT_EQ(by_uuid.uuid, "GPU-5d2c");
  EXPECT_EQ(nvmlTarget(2, "0,1").error, "CUDA device 2 is not in CUDA_VISIBLE_DEVICES=0,1");
}

TEST(NvmlThrottle, OnlyPowerAndThermalReasonsCount) {
  GpuReading r;
  setThrottle(0x1 | 0x2 | 0x10, &r);  // idle, application clocks, sync boost
  EXPECT_EQ(r.power_throttled, 0);
  EXPECT_EQ(r.thermal_throttled, 0);
  setThrottle(0x4, &r);  // software power cap
  EXPECT_EQ(r.power_throttled, 1);
  EXPECT_EQ(r.thermal_throttled, 0);
  setThrottle(0x40, &r);  // hardware thermal slowdown
  EXPECT_EQ(r.power_throttled, 0);
  EXPECT_EQ(r.thermal_throttled, 1);
}

TEST(Nvml, ReadsEveryMetricOfTheStub) {
  ScopedEnv reasons("BATCHDIST_NVML_STUB_REASONS", "0x20");
  Nvml nvml(BATCHDIST_NVML_STUB, 3, "");
  ASSERT_TRUE(nvml.available()) << nvml.error();
  EXPECT_TRUE(nvml.missing().empty());
  const GpuReading r = nvml.read();
  EXPECT_EQ(r.util_pct, 42);
  EXPECT_EQ(r.memory_util_pct, 17);
  EXPECT_EQ(r.memory_used_mb, 20 * 1024);
  EXPECT_EQ(r.memory_total_mb, 80 * 1024);
  EXPECT_EQ(r.power_w, 350);
  EXPECT_EQ(r.power_limit_w, 700);
  EXPECT_EQ(r.temperature_c, 71);
  EXPECT_EQ(r.sm_clock_mhz, 1755);
  EXPECT_EQ(r.power_throttled, 0);
  EXPECT_EQ(r.thermal_throttled, 1);
  EXPECT_TRUE(nvml.failures().empty());
}

TEST(Nvml, AReadThatFailsCostsThatMetricOnlyAndIsCounted) {
  ScopedEnv fail("BATCHDIST_NVML_STUB_FAIL", "temperature,power");
  Nvml nvml(BATCHDIST_NVML_STUB, 0, "");
  ASSERT_TRUE(nvml.available()) << nvml.error();
  for (int i = 0; i < 3; ++i) {
    const GpuReading r = nvml.read();
    EXPECT_EQ(r.temperature_c, -1);
    EXPECT_EQ(r.power_w, -1);
    EXPECT_EQ(r.util_pct, 42);
    EXPECT_EQ(r.sm_clock_mhz, 1755);
    EXPECT_EQ(nvml.takeNewFailures().size(), i == 0 ? 2u : 0u);  // each said once
  }
  ASSERT_EQ(nvml.failures().size(), 2u);
  EXPECT_EQ(nvml.failures()[0].metric, "power");
  EXPECT_EQ(nvml.failures()[0].count, 3);
  EXPECT_EQ(nvml.failures()[0].first, "Unknown Error (999)");
  EXPECT_EQ(nvml.failures()[1].metric, "temperature");
}

TEST(Nvml, ALibraryWithoutSomeEntryPointsReadsTheRest) {
  Nvml nvml(BATCHDIST_NVML_STUB_PARTIAL, 0, "");
  ASSERT_TRUE(nvml.available()) << nvml.error();
  EXPECT_EQ(nvml.missing(), (std::vector<std::string>{
                                "power (no nvmlDeviceGetPowerUsage)",
                                "power limit (no nvmlDeviceGetEnforcedPowerLimit)",
                                "throttle reasons (no nvmlDeviceGetCurrentClocksThrottleReasons)"}));
  const GpuReading r = nvml.read();
  EXPECT_EQ(r.power_w, -1);
  EXPECT_EQ(r.power_throttled, -1);
  EXPECT_EQ(r.util_pct, 42);
  EXPECT_EQ(r.temperature_c, 71);
}

TEST(Nvml, NoDeviceNoLibraryAndAFailedInitAreSaid) {
  {
    ScopedEnv fail("BATCHDIST_NVML_STUB_FAIL", "device");
    Nvml nvml(BATCHDIST_NVML_STUB, 0, "");
    EXPECT_FALSE(nvml.available());
    EXPECT_EQ(nvml.error(), "nvmlDeviceGetHandleByIndex_v2(0): Unknown Error (999)");
    EXPECT_EQ(nvml.read().util_pct, -1);
  }
  {
    ScopedEnv fail("BATCHDIST_NVML_STUB_FAIL", "init");
    Nvml nvml(BATCHDIST_NVML_STUB, 0, "");
    EXPECT_EQ(nvml.error(), "nvmlInit_v2: Unknown Error (999)");
  }
  Nvml by_uuid(BATCHDIST_NVML_STUB, 1, "GPU-1,MIG-2");
  EXPECT_EQ(by_uuid.error(), "nvmlDeviceGetHandleByUUID(MIG-2): Unknown Error (999)");
  Nvml none("/nonexistent/libnvidia-ml.so.1", 0, "");
  EXPECT_FALSE(none.available());
  EXPECT_TRUE(contains(none.error(), "cannot load /nonexistent/libnvidia-ml.so.1: ")) << none.error();
}

TEST(HostCpu, ProcStatsFirstLineGivesBusyAndTotal) {
  const auto t = parseProcStat("cpu  100 5 50 800 40 3 2 0 7 0\ncpu0 1 2 3 4\n");
  ASSERT_TRUE(t);
  EXPECT_EQ(t->total, 1000);  // the first eight fields: guest is in user already
  EXPECT_EQ(t->busy, 160);    // all but idle and iowait
  EXPECT_FALSE(parseProcStat("intr 1 2 3"));
  EXPECT_FALSE(parseProcStat("cpu 1 2"));
  EXPECT_TRUE(hostCpuTimes());
  EXPECT_GE(processCpuSeconds(), 0);
}

TEST(SystemAccumulator, MeansMaximaAndMetricsNeverRead) {
  SystemAccumulator acc;
  std::array<double, kSystemMetrics> s;
  s.fill(std::nan(""));
  s[static_cast<std::size_t>(SystemMetric::kGpuUtil)] = 40;
  s[static_cast<std::size_t>(SystemMetric::kGpuTemperatureC)] = 60;
  s[static_cast<std::size_t>(SystemMetric::kGpuPowerThrottled)] = 1;
  acc.add(s);
  s[static_cast<std::size_t>(SystemMetric::kGpuUtil)] = 80;
  s[static_cast<std::size_t>(SystemMetric::kGpuTemperatureC)] = 75;
  s[static_cast<std::size_t>(SystemMetric::kGpuPowerThrottled)] = 0;
  acc.add(s);
  const SystemSummary sum = acc.summary();
  EXPECT_EQ(sum.samples, 2);
  EXPECT_EQ(sum.get(SystemMetric::kGpuUtil), 60);          // mean
  EXPECT_EQ(sum.get(SystemMetric::kGpuTemperatureC), 75);  // maximum
  EXPECT_EQ(sum.get(SystemMetric::kGpuPowerThrottled), 0.5);  // share of samples
  EXPECT_FALSE(sum.has(SystemMetric::kCpuHostPct));
  // report.json's form, and back (rank 0 reads every rank's so).
  RankSystem r{3, "node7", sum, {{10, 1.5, sum}}, {"GPU power: 2 failed read(s)"}};
  const auto j = rankSystemJson(r);
  EXPECT_FALSE(j["run"].contains("cpu_host_pct"));
  EXPECT_EQ(j["series"][0]["gpu_util_pct"], 60);
  const RankSystem back = rankSystemFromJson(nlohmann::json::parse(j.dump()));
  EXPECT_EQ(back.rank, 3);
  EXPECT_EQ(back.host, "node7");
  EXPECT_EQ(back.series.at(0).step, 10);
  EXPECT_EQ(back.run.get(SystemMetric::kGpuTemperatureC), 75);
  EXPECT_FALSE(back.run.has(SystemMetric::kCpuHostPct));
  EXPECT_EQ(back.unread, r.unread);
}

TEST(SystemSeries, ALongSeriesIsThinnedKeepingMeansAndMaxima) {
  std::vector<SystemPoint> series;
  for (int64_t k = 1; k <= 1000; ++k) {
    SystemSummary s;
    s.samples = 1 + k % 2;  // 2, 1, 2, 1, ...: the weights
    s.value[static_cast<std::size_t>(SystemMetric::kGpuUtil)] = k % 2 ? 30 : 60;
    s.value[static_cast<std::size_t>(SystemMetric::kGpuTemperatureC)] = k == 777 ? 90 : 50;
    series.push_back({k * 10, k * 0.5, s});
  }
  const auto thin = thinnedSeries(series, 256);
  ASSERT_EQ(thin.size(), 250u);  // 1000 -> 500 -> 250
  EXPECT_EQ(thin.back().step, 10000);
  EXPECT_EQ(thin.front().step, 40);
  EXPECT_EQ(thin.front().summary.samples, 6);
  // Weighted: (30 x 2 + 60 x 1) / 3 per pair.
  EXPECT_DOUBLE_EQ(thin.front().summary.get(SystemMetric::kGpuUtil), 40);
  double hottest = 0;
  for (const auto& p : thin) hottest = std::max(hottest, p.summary.get(SystemMetric::kGpuTemperatureC));
  EXPECT_EQ(hottest, 90);
  EXPECT_FALSE(thin.front().summary.has(SystemMetric::kCpuHostPct));
  EXPECT_EQ(thinnedSeries(series, 2000).size(), 1000u);  // short enough: as it was
}

/// Runs a sampler every 10 ms until it has `n` samples (or 10 s pass).
SystemSummary sampleUntil(SystemSampler& s, int64_t n) {
  const double until = monotonicSeconds() + 10;
  while (s.run().samples < n && monotonicSeconds() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return s.take();
}

TEST(SystemSampler, SamplesTheGpuTheProcessAndTheLoaderOnItsThread) {
  ScopedEnv reasons("BATCHDIST_NVML_STUB_REASONS", "0x4");
  std::vector<std::string> warnings;
  SystemSamplerOptions o;
  o.interval_s = 0.01;
  o.nvml_library = BATCHDIST_NVML_STUB;
  o.warn = [&](const std::string& w) { warnings.push_back(w); };
  const double t0 = monotonicSeconds();
  o.loader_threads = 2;  // busy half their time: 2 threads x 0.5
  o.loader_busy_seconds = [t0] { return monotonicSeconds() - t0; };
  SystemSampler sampler(o);
  const SystemSummary s = sampleUntil(sampler, 5);
  sampler.stop();
  EXPECT_GE(s.samples, 5);
  EXPECT_EQ(s.get(SystemMetric::kGpuUtil), 42);
  EXPECT_EQ(s.get(SystemMetric::kGpuPowerThrottled), 1);
  EXPECT_EQ(s.get(SystemMetric::kGpuThermalThrottled), 0);
  EXPECT_TRUE(s.has(SystemMetric::kCpuProcessPct));
  EXPECT_TRUE(s.has(SystemMetric::kCpuHostPct));
  EXPECT_NEAR(s.get(SystemMetric::kLoaderBusy), 0.5, 0.2);
  EXPECT_EQ(sampler.take().samples, 0);  // taken: the next interval starts empty
  EXPECT_GE(sampler.run().samples, s.samples);
  EXPECT_TRUE(warnings.empty()) << warnings.front();
  EXPECT_TRUE(sampler.unread().empty());
}

// Note [system metrics]: an evaluation or a checkpoint's snapshot is not a step.
TEST(SystemSampler, PausedSamplesCountInNoSummary) {
  std::atomic<int64_t> reads{0};  // the loader callback runs at every sample, paused or not
  SystemSamplerOptions o;
  o.interval_s = 0.01;
  o.loader_threads = 1;
  o.loader_busy_seconds = [&reads] { return static_cast<double>(++reads) * 1e-6; };
  SystemSampler sampler(o);
  const auto samplesWhile = [&](int64_t more) {
    const int64_t until = reads + more;
    const double deadline = monotonicSeconds() + 10;
    while (reads < until && monotonicSeconds() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return reads >= until;
  };
  ASSERT_TRUE(samplesWhile(3));
  int64_t before = 0;
  {
    const PausedSampling aside(&sampler);
    before = sampler.run().samples;
    sampler.take();
    ASSERT_TRUE(samplesWhile(4)) << "the sampler's thread did not sample in 10 s";
    EXPECT_EQ(sampler.take().samples, 0);
    EXPECT_EQ(sampler.run().samples, before);
  }
  ASSERT_TRUE(samplesWhile(4));
  sampler.stop();
  EXPECT_GE(sampler.take().samples, 3);
  EXPECT_GE(sampler.run().samples, before + 3);
  PausedSampling none(nullptr);  // no sampler (report.sample_s: 0): nothing to pause
}

TEST(SystemSampler, SaysOnceWhatItCannotReadAndGoesOn) {
  ScopedEnv fail("BATCHDIST_NVML_STUB_FAIL", "temperature");
  std::vector<std::string> warnings;
  SystemSamplerOptions o;
  o.interval_s = 0.01;
  o.rank = 5;
  o.nvml_library = BATCHDIST_NVML_STUB_PARTIAL;
  o.warn = [&](const std::string& w) { warnings.push_back(w); };
  SystemSampler sampler(o);
  const SystemSummary s = sampleUntil(sampler, 4);
  sampler.stop();
  EXPECT_EQ(s.get(SystemMetric::kGpuUtil), 42);
  EXPECT_FALSE(s.has(SystemMetric::kGpuTemperatureC));
  EXPECT_FALSE(s.has(SystemMetric::kGpuPowerW));
  ASSERT_EQ(warnings.size(), 2u);
  EXPECT_EQ(warnings[0],
            "rank 5: system metrics: warning: NVML cannot read power (no nvmlDeviceGetPowerUsage), "
            "power limit (no nvmlDeviceGetEnforcedPowerLimit), throttle reasons (no "
            "nvmlDeviceGetCurrentClocksThrottleReasons); the other GPU metrics are sampled");
  EXPECT_EQ(warnings[1],
            "rank 5: system metrics: warning: could not read the GPU's temperature (Unknown "
            "Error (999)); it is left out while it fails, the run goes on");
  const auto unread = sampler.unread();
  ASSERT_EQ(unread.size(), 4u);
  EXPECT_EQ(unread[0], "GPU power (no nvmlDeviceGetPowerUsage)");
  EXPECT_TRUE(contains(unread[3], "GPU temperature: ")) << unread[3];
  EXPECT_TRUE(contains(unread[3], " failed read(s), the first: Unknown Error (999)")) << unread[3];
}

TEST(SystemSampler, WithoutADeviceTheCpuIsStillSampled) {
  std::vector<std::string> warnings;
  SystemSamplerOptions o;
  o.interval_s = 0.01;
  o.nvml_library = "/nonexistent/libnvidia-ml.so.1";
  o.warn = [&](const std::string& w) { warnings.push_back(w); };
  SystemSampler sampler(o);
  const SystemSummary s = sampleUntil(sampler, 3);
  sampler.stop();
  EXPECT_FALSE(s.has(SystemMetric::kGpuUtil));
  EXPECT_TRUE(s.has(SystemMetric::kCpuProcessPct));
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_TRUE(contains(warnings[0], "rank 0: system metrics: warning: no GPU metrics: cannot load "
                                    "/nonexistent/libnvidia-ml.so.1"))
      << warnings[0];
  ASSERT_EQ(sampler.unread().size(), 1u);
  EXPECT_TRUE(contains(sampler.unread()[0], "GPU: cannot load")) << sampler.unread()[0];
}

// Note [system diagnosis]: each rule with the numbers it rests on.
RankSystem rankWith(int rank, std::vector<std::pair<SystemMetric, double>> values) {
  RankSystem x;
  x.rank = rank;
  x.host = "node" + std::to_string(rank);
  x.run.samples = 10;
  for (const auto& [m, v] : values) x.run.value[static_cast<std::size_t>(m)] = v;
  return x;
}

std::string finding(const std::vector<std::string>& all, const std::string& head) {
  for (const auto& s : all) {
    if (s.rfind(head, 0) == 0) return s;
  }
  return "";
}

TrainResult timedResult(double data, double comm, double compute) {
  TrainResult r;
  r.time.data_wait = data;
  r.time.comm = comm;
  r.time.compute = compute;
  return r;
}

TEST(SystemDiagnosis, ThrottlingNamesTheRankAndItsFigures) {
  Config cfg;
  auto r = timedResult(0, 0, 10);
  r.system = {rankWith(0, {{SystemMetric::kGpuPowerThrottled, 0.02}}),
              rankWith(1, {{SystemMetric::kGpuPowerThrottled, 0.4},
                           {SystemMetric::kGpuThermalThrottled, 0},
                           {SystemMetric::kGpuPowerW, 698},
                           {SystemMetric::kGpuPowerLimitW, 700},
                           {SystemMetric::kGpuTemperatureC, 83},
                           {SystemMetric::kGpuSmClockMhz, 1410}})};
  const auto f = finding(diagnose(cfg, r, true, "H200"), "throttling:");
  EXPECT_EQ(f, "throttling: rank 1 on node1 power-capped in 40 % of samples (698 W of 700 W), "
               "thermally in 0 % (up to 83 C), SM clock 1410 MHz; the GPU ran below its clocks: "
               "check its cooling and power limit (nvidia-smi -q -d PERFORMANCE)");
  // Many ranks: the three throttled most, and a count.
  for (int k = 2; k < 7; ++k) {
    r.system.push_back(rankWith(k, {{SystemMetric::kGpuThermalThrottled, 0.1 * k}}));
  }
  const auto many = finding(diagnose(cfg, r, true, "H200"), "throttling:");
  EXPECT_TRUE(contains(many, "throttling: rank 6 on node6 power-capped in 0 % of samples (? of ?), "
                             "thermally in 60 % (up to ?), SM clock ?; rank 5 on node5 "))
      << many;
  // 40 % both: the lower rank first.
  EXPECT_TRUE(contains(many, "; rank 1 on node1 power-capped in 40 %")) << many;
  EXPECT_TRUE(contains(many, "; and 3 more rank(s); the GPU ran below")) << many;
  r.system.resize(2);
  r.system[1].run.value[static_cast<std::size_t>(SystemMetric::kGpuPowerThrottled)] = 0.05;
  EXPECT_EQ(finding(diagnose(cfg, r, true, "H200"), "throttling:"), "");  // 5 %: not above
}

TEST(SystemDiagnosis, AnIdleGpuIsInputCommunicationOrLaunchBound) {
  Config cfg;
  auto r = timedResult(0.5, 0.5, 9);  // data 5 %, comm 5 %
  r.system = {rankWith(0, {{SystemMetric::kGpuUtil, 90}}),
              rankWith(1, {{SystemMetric::kGpuUtil, 35}, {SystemMetric::kCpuProcessPct, 99}})};
  auto f = finding(diagnose(cfg, r, true, "H200"), "utilization:");
  EXPECT_TRUE(contains(f, "utilization: the GPU was busy 35 % of the time (NVML, rank 1 on node1); "
                          "launch- or code-bound: the step waits neither for data (5 %) nor for "
                          "communication (5 %); the process used 99 % of a core: a thread "
                          "launching kernels"))
      << f;
  r = timedResult(3, 0.5, 6.5);  // data 30 %
  r.system = {rankWith(0, {{SystemMetric::kGpuUtil, 35}})};
  f = finding(diagnose(cfg, r, true, "H200"), "utilization:");
  EXPECT_TRUE(contains(f, "35 % of the time (NVML, rank 0 on node0); input-bound")) << f;
  r = timedResult(0.5, 4, 5.5);  // comm 40 %
  r.system = {rankWith(0, {{SystemMetric::kGpuUtil, 35}})};
  EXPECT_TRUE(contains(finding(diagnose(cfg, r, true, "H200"), "utilization:"),
                       "communication-bound"));
  r.system = {rankWith(0, {{SystemMetric::kGpuUtil, 70}})};  // 70 %: not below
  EXPECT_EQ(finding(diagnose(cfg, r, true, "H200"), "utilization:"), "");
}

TEST(SystemDiagnosis, TheLoaderSaysWhetherItIsTheLimit) {
  Config cfg;
  cfg.data.workers = 4;
  auto r = timedResult(3, 0, 7);  // data 30 %
  r.system = {rankWith(0, {{SystemMetric::kLoaderBusy, 0.95}, {SystemMetric::kCpuHostPct, 60}})};
  auto f = finding(diagnose(cfg, r, false, "cpu"), "data:");
  EXPECT_TRUE(contains(f, "; the loader threads were busy 95 % of the time (rank 0 on node0): they "
                          "are the limit; raise data.workers (now 4)"))
      << f;
  r.system[0].run.value[static_cast<std::size_t>(SystemMetric::kCpuHostPct)] = 97;
  f = finding(diagnose(cfg, r, false, "cpu"), "data:");
  EXPECT_TRUE(contains(f, "and the host's CPUs 97 %: the host has no CPU left")) << f;
  r.system[0].run.value[static_cast<std::size_t>(SystemMetric::kLoaderBusy)] = 0.2;
  f = finding(diagnose(cfg, r, false, "cpu"), "data:");
  EXPECT_TRUE(contains(f, "the loader threads were busy only 20 % (rank 0 on node0): not their CPU"))
      << f;
}

TEST(SystemDiagnosis, MemoryHeadroomFromNvmlBelowTheGuidesTarget) {
  Config cfg;
  auto r = timedResult(0, 0, 10);
  r.system = {rankWith(0, {{SystemMetric::kGpuMemoryUsedMb, 40 * 1024},
                           {SystemMetric::kGpuMemoryTotalMb, 80 * 1024}}),
              rankWith(1, {{SystemMetric::kGpuMemoryUsedMb, 60 * 1024},
                           {SystemMetric::kGpuMemoryTotalMb, 80 * 1024}})};
  auto f = finding(diagnose(cfg, r, true, "H200"), "memory:");
  EXPECT_EQ(f, "memory: at most 60.0 GiB of 80.0 GiB in use (75 %, NVML, rank 1 on node1; the "
               "guides fill 80-90 %); a larger batch fits: try batch.per_gpu: auto");
  r.system[1].run.value[static_cast<std::size_t>(SystemMetric::kGpuMemoryUsedMb)] = 66 * 1024;
  EXPECT_EQ(finding(diagnose(cfg, r, true, "H200"), "memory:"), "");  // 82 %
}

}  // namespace
}  // namespace batchdist::worker

namespace batchdist::worker {
namespace {

// report.html: a row of charts per host, a line per rank of that host; what a
// rank could not read is listed.
TEST(SystemHtml, ARowOfChartsPerHostALinePerRank) {
  const auto point = [](int64_t step, double gpu, double cpu) {
    RankSystem x;
    x.series.push_back({step, step * 0.5, SystemSummary{}});
    auto& s = x.series.back().summary;
    s.samples = 2;
    s.value[static_cast<std::size_t>(SystemMetric::kCpuProcessPct)] = cpu;
    if (gpu >= 0) s.value[static_cast<std::size_t>(SystemMetric::kGpuUtil)] = gpu;
    return x;
  };
  nlohmann::ordered_json ranks = nlohmann::ordered_json::array();
  for (int r = 0; r < 3; ++r) {
    RankSystem x = point(10, r == 2 ? -1 : 50 + r, 90);
    x.series.push_back(point(20, r == 2 ? -1 : 60 + r, 95).series.front());
    x.rank = r;
    x.host = r < 2 ? "alpha" : "beta";
    if (r == 2) x.unread = {"GPU: nvmlInit_v2: Driver Not Loaded (9)"};
    ranks.push_back(rankSystemJson(x));
  }
  const nlohmann::ordered_json report{{"system", {{"sample_s", 0.5}, {"ranks", ranks}}}};
  const std::string page = reportHtml(report, nlohmann::ordered_json(), {});
  EXPECT_TRUE(contains(page, "<h3 id=\"system-alpha\">alpha</h3>"));
  EXPECT_TRUE(contains(page, "<h3 id=\"system-beta\">beta</h3>"));
  EXPECT_TRUE(contains(page, "id=\"plot-system-gpu-alpha\""));
  EXPECT_TRUE(contains(page, "id=\"plot-system-cpu-alpha\""));
  EXPECT_TRUE(contains(page, "id=\"plot-system-cpu-beta\""));
  EXPECT_FALSE(contains(page, "id=\"plot-system-gpu-beta\""));  // beta read no GPU
  EXPECT_FALSE(contains(page, "plot-system-power"));             // nobody read power
  EXPECT_TRUE(contains(page, ">rank 0<"));
  EXPECT_TRUE(contains(page, ">rank 1<"));
  EXPECT_FALSE(contains(page, ">host<"));  // no rank read the host's CPU
  EXPECT_TRUE(contains(page, "<li>rank 2 (beta): GPU: nvmlInit_v2: Driver Not Loaded (9)</li>"));
  // A run shorter than report.sample_s took no sample: its host's row was a
  // heading alone; it says so. A host whose ranks read nothing says that.
  RankSystem quick;  // an interval ended before the first sample
  quick.series.push_back({1, 0.2, SystemSummary{}});
  quick.rank = 0;
  quick.host = "gamma";
  RankSystem unread = point(10, -1, -1);
  unread.series.front().summary = SystemSummary{};
  unread.series.front().summary.samples = 2;
  unread.rank = 1;
  unread.host = "delta";
  unread.unread = {"CPU: /proc/stat: No such file or directory"};
  const nlohmann::ordered_json short_run{
      {"system", {{"sample_s", 30}, {"ranks", {rankSystemJson(quick), rankSystemJson(unread)}}}}};
  const std::string short_page = reportHtml(short_run, nlohmann::ordered_json(), {});
  EXPECT_TRUE(contains(short_page, "<h3 id=\"system-gamma\">gamma</h3>\n<p class=\"sub\" id=\"system-none-gamma\">"
                                   "No sample was taken: training ended before the first one (every 30 s, "
                                   "report.sample_s; lower it for a run this short).</p>"))
      << short_page;
  EXPECT_TRUE(contains(short_page, "id=\"system-none-delta\">No metric could be read on this host"));
  EXPECT_FALSE(contains(short_page, "<div class=\"grid\">\n</div>"));
  // Without "system" (report.sample_s 0) the page has no such section.
  EXPECT_FALSE(contains(reportHtml(nlohmann::ordered_json{{"global_batch", 8}}, nlohmann::ordered_json(), {}),
                        "System metrics"));
}

}  // namespace
}  // namespace batchdist::worker

namespace batchdist::worker {
namespace {

// Note [search traces]: each candidate's directory, and the cache key: an
// untraced search keys as before search.profile existed, a traced one apart.
TEST(SearchTraces, CandidateNamesAndTheCacheKey) {
  EXPECT_EQ(searchTraceName(64, 1, Levers{}), "per_gpu_64");
  EXPECT_EQ(searchTraceName(32, 2, Levers{Shard::kOptimizer, Recompute::kOn}),
            "per_gpu_32_accum_2_shard_optimizer_recompute_on");
  SearchCacheInputs in;
  in.world = 2;
  in.device = "cpu";
  const auto off = searchCacheKey(parseConfig("search: {profile: false}", "t.yaml"), in);
  const auto absent = searchCacheKey(parseConfig("model: {name: mlp}", "t.yaml"), in);
  const auto on = searchCacheKey(parseConfig("search: {profile: true}", "t.yaml"), in);
  EXPECT_EQ(off, absent);
  EXPECT_EQ(off.find("profile"), std::string::npos) << off;
  EXPECT_NE(on, off);
}

TEST(SystemConfig, SamplePeriodDefaultAndBounds) {
  EXPECT_EQ(parseConfig("model: {name: mlp}", "t.yaml").report.sample_s, 0.5);
  EXPECT_EQ(parseConfig("report: {sample_s: 0}", "t.yaml").report.sample_s, 0);
  try {
    parseConfig("report: {sample_s: 0.001}", "t.yaml");
    ADD_FAILURE() << "0.001 accepted";
  } catch (const ConfigError& e) {
    EXPECT_EQ(std::string(e.what()),
              "t.yaml: report.sample_s: 0.001 s is too short a sampling period: 0 (off) or at least 0.01");
  }
}

}  // namespace
}  // namespace batchdist::worker
