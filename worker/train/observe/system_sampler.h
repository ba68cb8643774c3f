#pragma once
// Samples Note [system metrics] on a thread of its own while a rank trains.

#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "worker/train/observe/host_cpu.h"
#include "worker/train/observe/nvml.h"
#include "worker/train/observe/system_metrics.h"

namespace batchdist::worker {

struct SystemSamplerOptions {
  double interval_s = 0.5;     ///< report.sample_s (> 0)
  int rank = 0;                ///< in its warnings
  /// NVML (Note [nvml metrics]): read when set; the library, the CUDA index and
  /// CUDA_VISIBLE_DEVICES.
  std::optional<std::string> nvml_library;
  int cuda_index = 0;
  std::string visible_devices;
  /// The loader threads' busy seconds so far (cumulative), and how many threads;
  /// none: the training thread loads (no loader_busy).
  std::function<double()> loader_busy_seconds;
  int64_t loader_threads = 0;
  /// Where a warning goes (a line, without newline); default: stderr.
  std::function<void(const std::string&)> warn;
};

class SystemSampler {
 public:
  /// Starts sampling at once (the first sample only primes the CPU deltas).
  explicit SystemSampler(SystemSamplerOptions options);
  ~SystemSampler();
  SystemSampler(const SystemSampler&) = delete;
  SystemSampler& operator=(const SystemSampler&) = delete;

  /// The summary of the samples since the last call (an interval's).
  SystemSummary take();
  /// From pause() to resume() the samples count in no summary (Note [system
  /// metrics]: an evaluation or a checkpoint's snapshot is not a training step).
  void pause();
  void resume();
  /// Stops the thread; the run's summary and what was not read stay readable.
  void stop();
  /// All samples so far.
  SystemSummary run() const;
  /// After stop(): what could not be read, and why: "GPU: ..." when NVML has no device, the
  /// metrics without an entry point, the metrics whose reads failed (how often).
  std::vector<std::string> unread() const;

 private:
  void loop();
  void sampleOnce();
  void sayFailures();
  void warn(const std::string& what) const;

  SystemSamplerOptions opts_;
  std::unique_ptr<Nvml> nvml_;
  double last_wall_ = -1, last_process_ = -1, last_loader_ = -1;
  std::optional<HostCpuTimes> last_host_;

  mutable std::mutex mu_;
  std::condition_variable wake_;
  bool stopping_ = false;
  bool paused_ = false;
  SystemAccumulator interval_, run_;
  std::thread thread_;
};

/// pause() for a scope; nothing without a sampler.
class PausedSampling {
 public:
  explicit PausedSampling(SystemSampler* s) : s_(s) {
    if (s_) s_->pause();
  }
  ~PausedSampling() {
    if (s_) s_->resume();
  }
  PausedSampling(const PausedSampling&) = delete;
  PausedSampling& operator=(const PausedSampling&) = delete;

 private:
  SystemSampler* s_;
};

}  // namespace batchdist::worker
