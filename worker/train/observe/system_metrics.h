#pragma once
// The system metrics a rank samples while it trains (Note [system metrics]).

#include <array>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace batchdist::worker {

// Note [system metrics]
// ~~~~~~~~~~~~~~~~~~~~~
// What `nvidia-smi dmon` and top show, per rank, sampled by a thread of its own
// every report.sample_s seconds (SystemSampler; never in the step): the GPU's
// from NVML (Note [nvml metrics]) and the CPU's from the kernel:
//   cpu_process_pct  this process's CPU time over the wall time between two
//                    samples, in % of one core (as top: 250 is 2.5 cores)
//   cpu_host_pct     the host's busy share of all its cores (/proc/stat: all but
//                    idle and iowait), in %
//   loader_busy      the data loader threads' busy share, 0..1: the seconds they
//                    spent making batches (Loader::busySeconds) over threads x
//                    wall time (no value when the training thread loads)
// A metrics interval's summary (Note [streamed metrics]: the points of
// metrics.jsonl) is each metric's mean over the interval's samples, or its
// maximum for the ones marked so below (memory used and its total, temperature,
// the power limit); the throttle flags' mean is the share of samples throttled.
// A metric never read has no value (NaN here; no key in metrics.jsonl and
// report.json, no TensorBoard point). The run's summary is the same over all
// its samples. Samples taken while the training thread evaluates or snapshots a
// checkpoint count in neither (SystemSampler::pause): the figures, and the
// diagnosis that reads them, are the training steps' (a background checkpoint
// write that runs beside the steps counts, as it costs them). Every rank keeps its own series (one summary per metrics interval,
// at the same steps on every rank); rank 0 gathers them at the end (report.json
// "system", report.html), each thinned to at most kSystemSeriesPoints by merging
// neighbours (a long run's ten points an epoch would make report.json and the
// page grow with epochs x ranks).

enum class SystemMetric {
  kGpuUtil,
  kGpuMemoryUtil,
  kGpuMemoryUsedMb,
  kGpuMemoryTotalMb,
  kGpuPowerW,
  kGpuPowerLimitW,
  kGpuTemperatureC,
  kGpuSmClockMhz,
  kGpuPowerThrottled,
  kGpuThermalThrottled,
  kCpuProcessPct,
  kCpuHostPct,
  kLoaderBusy,
  kCount
};
constexpr std::size_t kSystemMetrics = static_cast<std::size_t>(SystemMetric::kCount);

struct SystemMetricInfo {
  const char* key;  ///< metrics.jsonl, report.json; TensorBoard's tag is system/<key>
  bool max;         ///< summarised by its maximum (else its mean)
};
const SystemMetricInfo& systemMetricInfo(SystemMetric m);

/// Each metric's summary over some samples; NaN: never read.
struct SystemSummary {
  int64_t samples = 0;
  std::array<double, kSystemMetrics> value;
  SystemSummary() { value.fill(std::numeric_limits<double>::quiet_NaN()); }
  double get(SystemMetric m) const { return value[static_cast<std::size_t>(m)]; }
  bool has(SystemMetric m) const { return !std::isnan(get(m)); }
  bool any() const;
};

/// Sums samples into a summary.
class SystemAccumulator {
 public:
  /// One sample: NaN for a metric not read this time.
  void add(const std::array<double, kSystemMetrics>& sample);
  SystemSummary summary() const;

 private:
  int64_t samples_ = 0;
  std::array<double, kSystemMetrics> sum_{};
  std::array<double, kSystemMetrics> max_{};
  std::array<int64_t, kSystemMetrics> count_{};
};

/// One metrics interval's summary, at the step that ended it.
struct SystemPoint {
  int64_t step = 0;
  double seconds = 0;  ///< since training started
  SystemSummary summary;
};

/// One rank's metrics over the run (report.json "system").
struct RankSystem {
  int rank = 0;
  std::string host;
  SystemSummary run;
  std::vector<SystemPoint> series;
  std::vector<std::string> unread;  ///< what it could not read, and why
};

/// The most points of a rank's series in the report.
constexpr std::size_t kSystemSeriesPoints = 256;

/// `a` and `b` (adjacent, b later) as one summary: means weighted by samples,
/// maxima kept.
SystemSummary mergedSummary(const SystemSummary& a, const SystemSummary& b);
/// `series` with neighbours merged pairwise (a pair's later step and seconds)
/// until it has at most `max_points`.
std::vector<SystemPoint> thinnedSeries(std::vector<SystemPoint> series, std::size_t max_points);

/// Over ranks: each metric's mean over the ranks that read it (its maximum for
/// the ones summarised so); samples: all ranks'.
SystemSummary acrossRanks(const std::vector<RankSystem>& ranks);
/// Rank 0's closing line, after "system: ": "GPU busy 42 % (memory controller
/// 17 %), ..., CPU: process 99 % of a core, host 100 %, loader threads 3 % busy";
/// "" when nothing was read.
std::string systemText(const SystemSummary& s);

/// The metrics read, as keys of `o` (system_metrics' keys).
void addSystemMetrics(const SystemSummary& s, nlohmann::ordered_json& o);
/// report.json's form of one rank: rank, host, samples, run, unread, series.
nlohmann::ordered_json rankSystemJson(const RankSystem& r);
/// Its inverse (rank 0 reads every rank's, gathered as text).
RankSystem rankSystemFromJson(const nlohmann::json& j);

}  // namespace batchdist::worker
