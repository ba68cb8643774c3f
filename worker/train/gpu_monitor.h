#pragma once
// GPU utilization from NVML, loaded at run time (libnvidia-ml.so.1) when present:
// an optional extra, never a build or run dependency.

#include <string>

namespace batchdist::worker {

class GpuMonitor {
 public:
  /// `index`: the device's NVML index (the CUDA index unless CUDA_VISIBLE_DEVICES
  /// reorders devices).
  explicit GpuMonitor(int index);
  ~GpuMonitor();
  bool available() const { return device_ != nullptr; }
  /// Percent of the last sample period the GPU was busy, or -1.
  double utilization() const;

 private:
  void* lib_ = nullptr;
  void* device_ = nullptr;
  int (*get_util_)(void*, void*) = nullptr;
};

}  // namespace batchdist::worker
