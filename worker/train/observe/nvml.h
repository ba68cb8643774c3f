#pragma once
// GPU metrics from NVML, loaded at run time (Note [nvml metrics]).

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace batchdist::worker {

// Note [nvml metrics]
// ~~~~~~~~~~~~~~~~~~~
// NVML is an optional extra, never a build or run dependency: the library is
// dlopen'ed at run time, from BATCHDIST_NVML_LIBRARY when set (a path: the tests'
// stub, or a driver's library outside the loader's path), else libnvidia-ml.so.1.
// Each metric's entry point is looked up on its own, so a driver without one
// (an older NVML, a stub) loses that metric only; a read that fails (the device
// is lost, the metric is not supported) counts against that metric, and the
// first failure of each is said (SystemSampler, once per rank); the run goes on.
//
// The device: NVML numbers every GPU of the host, CUDA only the ones in
// CUDA_VISIBLE_DEVICES, in its order. So CUDA index i is NVML index list[i] when
// the list holds indices, or the device with UUID list[i] when it holds UUIDs
// ("GPU-..."); without the variable, index i itself (nvmlTarget).
//
// The throttle reasons (nvmlDeviceGetCurrentClocksEventReasons, called
// ...ThrottleReasons before NVML 12) that count: software power cap and
// hardware power brake (power), software and hardware thermal slowdown
// (thermal), hardware slowdown (both: NVML does not say which). An idle GPU's
// lowered clocks, application clocks and sync boost are not throttling.

/// Where CUDA device `cuda_index` is in NVML's numbering, under the
/// CUDA_VISIBLE_DEVICES value `visible` (unset: ""). index < 0: by `uuid`;
/// `error` set when the list has no entry `cuda_index`.
struct NvmlTarget {
  int index = -1;
  std::string uuid;
  std::string error;
};
NvmlTarget nvmlTarget(int cuda_index, const std::string& visible);

/// One reading; a field < 0 was not read.
struct GpuReading {
  double util_pct = -1;         ///< the GPU busy share of NVML's last sample period
  double memory_util_pct = -1;  ///< the memory controller's busy share
  double memory_used_mb = -1;
  double memory_total_mb = -1;
  double power_w = -1;
  double power_limit_w = -1;    ///< the enforced limit
  double temperature_c = -1;
  double sm_clock_mhz = -1;
  int power_throttled = -1;     ///< 1: a power reason holds the clocks down, 0: none
  int thermal_throttled = -1;   ///< 1: a thermal reason does
};

/// NVML's throttle-reason bits as the two flags above (Note [nvml metrics]).
void setThrottle(uint64_t reasons, GpuReading* r);

class Nvml {
 public:
  /// Loads `library` and opens CUDA device `cuda_index` under CUDA_VISIBLE_DEVICES
  /// `visible`. Never throws: see available() and error().
  Nvml(const std::string& library, int cuda_index, const std::string& visible);
  ~Nvml();
  Nvml(const Nvml&) = delete;
  Nvml& operator=(const Nvml&) = delete;

  bool available() const { return device_ != nullptr; }
  /// Why no device is open ("" when one is).
  const std::string& error() const { return error_; }
  /// The metrics this library has no entry point for: "power (no nvmlDeviceGetPowerUsage)".
  const std::vector<std::string>& missing() const { return missing_; }
  /// Reads every metric it has an entry point for; failures are counted.
  GpuReading read();

  /// A metric's failed reads: its name, how many, and the first one's error.
  struct Failure {
    std::string metric;
    int64_t count = 0;
    std::string first;
  };
  const std::vector<Failure>& failures() const { return failures_; }
  /// Failures recorded since the last call (the sampler says each metric's first).
  std::vector<Failure> takeNewFailures();

 private:
  struct Api;
  bool openDevice(const NvmlTarget& target);
  void resolveMetrics();
  void* symbol(const char* name, const char* metric);
  bool ok(int rc, const char* metric);
  std::string errorText(int rc) const;

  void* lib_ = nullptr;
  void* device_ = nullptr;
  bool initialized_ = false;
  std::unique_ptr<Api> api_;
  std::string error_;
  std::vector<std::string> missing_;
  std::vector<Failure> failures_;
  std::vector<Failure> new_failures_;
};

}  // namespace batchdist::worker
