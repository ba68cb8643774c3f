#include "worker/train/observe/system_sampler.h"

#include <chrono>
#include <cmath>
#include <iostream>
#include <limits>

#include "common/error.h"
#include "worker/common/console.h"
#include "worker/common/util.h"

namespace batchdist::worker {
namespace {

constexpr double kNone = std::numeric_limits<double>::quiet_NaN();

double orNone(double v) { return v < 0 ? kNone : v; }

void setGpu(const GpuReading& g, std::array<double, kSystemMetrics>* s) {
  const auto set = [&](SystemMetric m, double v) { (*s)[static_cast<std::size_t>(m)] = orNone(v); };
  set(SystemMetric::kGpuUtil, g.util_pct);
  set(SystemMetric::kGpuMemoryUtil, g.memory_util_pct);
  set(SystemMetric::kGpuMemoryUsedMb, g.memory_used_mb);
  set(SystemMetric::kGpuMemoryTotalMb, g.memory_total_mb);
  set(SystemMetric::kGpuPowerW, g.power_w);
  set(SystemMetric::kGpuPowerLimitW, g.power_limit_w);
  set(SystemMetric::kGpuTemperatureC, g.temperature_c);
  set(SystemMetric::kGpuSmClockMhz, g.sm_clock_mhz);
  set(SystemMetric::kGpuPowerThrottled, g.power_throttled);
  set(SystemMetric::kGpuThermalThrottled, g.thermal_throttled);
}

}  // namespace

SystemSampler::SystemSampler(SystemSamplerOptions options) : opts_(std::move(options)) {
  if (opts_.nvml_library) {
    nvml_ = std::make_unique<Nvml>(*opts_.nvml_library, opts_.cuda_index, opts_.visible_devices);
    if (!nvml_->available()) {
      warn(strCat("no GPU metrics: ", nvml_->error()));
    } else if (!nvml_->missing().empty()) {
      warn(strCat("NVML cannot read ", joined(nvml_->missing()), "; the other GPU metrics are sampled"));
    }
  }
  thread_ = std::thread([this] { loop(); });
}

SystemSampler::~SystemSampler() { stop(); }

void SystemSampler::stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void SystemSampler::loop() {
  const auto period = std::chrono::duration<double>(opts_.interval_s);
  std::unique_lock<std::mutex> lock(mu_);
  while (!stopping_) {
    lock.unlock();
    sampleOnce();
    lock.lock();
    wake_.wait_for(lock, period, [this] { return stopping_; });
  }
}

void SystemSampler::sampleOnce() {
  std::array<double, kSystemMetrics> s;
  s.fill(kNone);
  const auto at = [&](SystemMetric m) -> double& { return s[static_cast<std::size_t>(m)]; };
  if (nvml_ && nvml_->available()) {
    setGpu(nvml_->read(), &s);
    sayFailures();
  }
  const double wall = monotonicSeconds();
  const double process = processCpuSeconds();
  const auto host = hostCpuTimes();
  const double loader = opts_.loader_busy_seconds ? opts_.loader_busy_seconds() : -1;
  const bool primed = last_wall_ >= 0;
  const double dt = wall - last_wall_;
  if (primed && dt > 0 && process >= 0 && last_process_ >= 0) {
    at(SystemMetric::kCpuProcessPct) = 100 * std::max(0.0, process - last_process_) / dt;
  }
  if (primed && host && last_host_ && host->total > last_host_->total) {
    at(SystemMetric::kCpuHostPct) =
        100 * std::max(0.0, host->busy - last_host_->busy) / (host->total - last_host_->total);
  }
  // A loader reset (its figures taken) shows as less than before: no sample.
  if (primed && dt > 0 && opts_.loader_threads > 0 && loader >= last_loader_ && last_loader_ >= 0) {
    at(SystemMetric::kLoaderBusy) =
        std::min(1.0, (loader - last_loader_) / (dt * static_cast<double>(opts_.loader_threads)));
  }
  last_wall_ = wall, last_process_ = process, last_loader_ = loader, last_host_ = host;
  // The first sample has GPU readings only; without any, it is no sample.
  bool any = false;
  for (double v : s) any = any || !std::isnan(v);
  if (!any) return;
  std::lock_guard<std::mutex> lock(mu_);
  if (paused_) return;  // the CPU deltas above still restart from this sample
  interval_.add(s);
  run_.add(s);
}

void SystemSampler::sayFailures() {
  for (const auto& f : nvml_->takeNewFailures()) {
    warn(strCat("could not read the GPU's ", f.metric, " (", f.first,
                "); it is left out while it fails, the run goes on"));
  }
}

void SystemSampler::warn(const std::string& what) const {
  const std::string line = strCat("rank ", opts_.rank, ": system metrics: warning: ", what);
  if (opts_.warn) {
    opts_.warn(line);
  } else {
    std::cerr << line + "\n" << std::flush;
  }
}

SystemSummary SystemSampler::take() {
  std::lock_guard<std::mutex> lock(mu_);
  const SystemSummary s = interval_.summary();
  interval_ = SystemAccumulator{};
  return s;
}

void SystemSampler::pause() {
  std::lock_guard<std::mutex> lock(mu_);
  paused_ = true;
}

void SystemSampler::resume() {
  std::lock_guard<std::mutex> lock(mu_);
  paused_ = false;
}

SystemSummary SystemSampler::run() const {
  std::lock_guard<std::mutex> lock(mu_);
  return run_.summary();
}

std::vector<std::string> SystemSampler::unread() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::string> out;
  if (!nvml_) return out;
  if (!nvml_->available()) return {strCat("GPU: ", nvml_->error())};
  for (const auto& m : nvml_->missing()) out.push_back(strCat("GPU ", m));
  for (const auto& f : nvml_->failures()) {
    out.push_back(strCat("GPU ", f.metric, ": ", f.count, " failed read(s), the first: ", f.first));
  }
  return out;
}

}  // namespace batchdist::worker
