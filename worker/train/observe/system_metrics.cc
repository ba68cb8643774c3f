#include "worker/train/observe/system_metrics.h"

#include <algorithm>

#include "worker/common/console.h"

namespace batchdist::worker {

const SystemMetricInfo& systemMetricInfo(SystemMetric m) {
  static const std::array<SystemMetricInfo, kSystemMetrics> kInfo{{
      {"gpu_util_pct", false},
      {"gpu_memory_util_pct", false},
      {"gpu_memory_used_mb", true},
      {"gpu_memory_total_mb", true},
      {"gpu_power_w", false},
      {"gpu_power_limit_w", true},
      {"gpu_temperature_c", true},
      {"gpu_sm_clock_mhz", false},
      {"gpu_power_throttled", false},
      {"gpu_thermal_throttled", false},
      {"cpu_process_pct", false},
      {"cpu_host_pct", false},
      {"loader_busy", false},
  }};
  return kInfo[static_cast<std::size_t>(m)];
}

bool SystemSummary::any() const {
  return std::any_of(value.begin(), value.end(), [](double v) { return !std::isnan(v); });
}

void SystemAccumulator::add(const std::array<double, kSystemMetrics>& sample) {
  ++samples_;
  for (std::size_t i = 0; i < kSystemMetrics; ++i) {
    if (std::isnan(sample[i])) continue;
    max_[i] = count_[i] == 0 ? sample[i] : std::max(max_[i], sample[i]);
    sum_[i] += sample[i];
    ++count_[i];
  }
}

SystemSummary SystemAccumulator::summary() const {
  SystemSummary s;
  s.samples = samples_;
  for (std::size_t i = 0; i < kSystemMetrics; ++i) {
    if (count_[i] == 0) continue;
    s.value[i] = systemMetricInfo(static_cast<SystemMetric>(i)).max
                     ? max_[i]
                     : sum_[i] / static_cast<double>(count_[i]);
  }
  return s;
}

SystemSummary mergedSummary(const SystemSummary& a, const SystemSummary& b) {
  SystemSummary out;
  out.samples = a.samples + b.samples;
  for (std::size_t i = 0; i < kSystemMetrics; ++i) {
    const double x = a.value[i], y = b.value[i];
    if (std::isnan(x) || std::isnan(y)) {
      out.value[i] = std::isnan(x) ? y : x;
    } else if (systemMetricInfo(static_cast<SystemMetric>(i)).max) {
      out.value[i] = std::max(x, y);
    } else {
      const double wa = static_cast<double>(std::max<int64_t>(a.samples, 1));
      const double wb = static_cast<double>(std::max<int64_t>(b.samples, 1));
      out.value[i] = (x * wa + y * wb) / (wa + wb);
    }
  }
  return out;
}

std::vector<SystemPoint> thinnedSeries(std::vector<SystemPoint> series, std::size_t max_points) {
  while (series.size() > std::max<std::size_t>(max_points, 1)) {
    std::vector<SystemPoint> half;
    for (std::size_t i = 0; i < series.size(); i += 2) {
      if (i + 1 == series.size()) {
        half.push_back(series[i]);
      } else {
        half.push_back({series[i + 1].step, series[i + 1].seconds,
                        mergedSummary(series[i].summary, series[i + 1].summary)});
      }
    }
    series = std::move(half);
  }
  return series;
}

SystemSummary acrossRanks(const std::vector<RankSystem>& ranks) {
  SystemSummary out;
  for (std::size_t i = 0; i < kSystemMetrics; ++i) {
    const bool max = systemMetricInfo(static_cast<SystemMetric>(i)).max;
    double sum = 0;
    int64_t n = 0;
    for (const auto& r : ranks) {
      const double v = r.run.value[i];
      if (std::isnan(v)) continue;
      sum = max ? (n == 0 ? v : std::max(sum, v)) : sum + v;
      ++n;
    }
    if (n > 0) out.value[i] = max ? sum : sum / static_cast<double>(n);
  }
  for (const auto& r : ranks) out.samples += r.run.samples;
  return out;
}


std::string systemText(const SystemSummary& s) {
  using M = SystemMetric;
  std::vector<std::string> gpu, cpu;
  if (s.has(M::kGpuUtil)) {
    gpu.push_back("busy " + formatFixed(s.get(M::kGpuUtil), 0) + " %" +
                  (s.has(M::kGpuMemoryUtil)
                       ? " (memory controller " + formatFixed(s.get(M::kGpuMemoryUtil), 0) + " %)"
                       : std::string()));
  }
  if (s.has(M::kGpuMemoryUsedMb)) {
    gpu.push_back("memory " + formatFixed(s.get(M::kGpuMemoryUsedMb) / 1024, 1) +
                  (s.has(M::kGpuMemoryTotalMb) ? " of " + formatFixed(s.get(M::kGpuMemoryTotalMb) / 1024, 1)
                                               : std::string()) + " GiB");
  }
  if (s.has(M::kGpuPowerW)) {
    gpu.push_back(formatFixed(s.get(M::kGpuPowerW), 0) +
                  (s.has(M::kGpuPowerLimitW) ? " of " + formatFixed(s.get(M::kGpuPowerLimitW), 0) : std::string()) +
                  " W");
  }
  if (s.has(M::kGpuTemperatureC)) gpu.push_back("up to " + formatFixed(s.get(M::kGpuTemperatureC), 0) + " C");
  if (s.has(M::kGpuSmClockMhz)) gpu.push_back("SM " + formatFixed(s.get(M::kGpuSmClockMhz), 0) + " MHz");
  if (s.has(M::kGpuPowerThrottled) || s.has(M::kGpuThermalThrottled)) {
    gpu.push_back("throttled (power/thermal) " + formatFixed(100 * s.get(M::kGpuPowerThrottled), 0) + "/" +
                  formatFixed(100 * s.get(M::kGpuThermalThrottled), 0) + " % of samples");
  }
  if (s.has(M::kCpuProcessPct)) cpu.push_back("process " + formatFixed(s.get(M::kCpuProcessPct), 0) + " % of a core");
  if (s.has(M::kCpuHostPct)) cpu.push_back("host " + formatFixed(s.get(M::kCpuHostPct), 0) + " %");
  if (s.has(M::kLoaderBusy)) cpu.push_back("loader threads " + formatFixed(100 * s.get(M::kLoaderBusy), 0) + " % busy");
  std::string out;
  if (!gpu.empty()) out = "GPU " + joined(gpu);
  if (!cpu.empty()) out += (out.empty() ? "CPU: " : "; CPU: ") + joined(cpu);
  return out;
}

void addSystemMetrics(const SystemSummary& s, nlohmann::ordered_json& o) {
  for (std::size_t i = 0; i < kSystemMetrics; ++i) {
    if (!std::isnan(s.value[i])) o[systemMetricInfo(static_cast<SystemMetric>(i)).key] = s.value[i];
  }
}

namespace {

nlohmann::ordered_json summaryJson(const SystemSummary& s) {
  nlohmann::ordered_json o{{"samples", s.samples}};
  addSystemMetrics(s, o);
  return o;
}

SystemSummary summaryFromJson(const nlohmann::json& j) {
  SystemSummary s;
  s.samples = j.value("samples", int64_t{0});
  for (std::size_t i = 0; i < kSystemMetrics; ++i) {
    const char* key = systemMetricInfo(static_cast<SystemMetric>(i)).key;
    if (j.contains(key) && j[key].is_number()) s.value[i] = j[key].get<double>();
  }
  return s;
}

}  // namespace

nlohmann::ordered_json rankSystemJson(const RankSystem& r) {
  auto series = nlohmann::ordered_json::array();
  for (const auto& p : r.series) {
    nlohmann::ordered_json o{{"step", p.step}, {"seconds", p.seconds}, {"samples", p.summary.samples}};
    addSystemMetrics(p.summary, o);
    series.push_back(std::move(o));
  }
  return {{"rank", r.rank}, {"host", r.host}, {"run", summaryJson(r.run)},
          {"unread", r.unread}, {"series", std::move(series)}};
}

RankSystem rankSystemFromJson(const nlohmann::json& j) {
  RankSystem r;
  r.rank = j.value("rank", 0);
  r.host = j.value("host", std::string());
  r.run = summaryFromJson(j.value("run", nlohmann::json::object()));
  r.unread = j.value("unread", std::vector<std::string>{});
  for (const auto& p : j.value("series", nlohmann::json::array())) {
    r.series.push_back({p.value("step", int64_t{0}), p.value("seconds", 0.0), summaryFromJson(p)});
  }
  return r;
}

}  // namespace batchdist::worker
