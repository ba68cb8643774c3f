#include "worker/train/gpu_monitor.h"

#include <dlfcn.h>

namespace batchdist::worker {
namespace {
struct NvmlUtilization {
  unsigned int gpu;
  unsigned int memory;
};
}  // namespace

GpuMonitor::GpuMonitor(int index) {
  lib_ = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!lib_) return;
  auto init = reinterpret_cast<int (*)()>(dlsym(lib_, "nvmlInit_v2"));
  auto handle = reinterpret_cast<int (*)(unsigned int, void**)>(
      dlsym(lib_, "nvmlDeviceGetHandleByIndex_v2"));
  get_util_ = reinterpret_cast<int (*)(void*, void*)>(dlsym(lib_, "nvmlDeviceGetUtilizationRates"));
  if (!init || !handle || !get_util_ || init() != 0) return;
  void* dev = nullptr;
  if (handle(static_cast<unsigned int>(index), &dev) == 0) device_ = dev;
}

GpuMonitor::~GpuMonitor() {
  if (lib_) {
    if (auto shutdown = reinterpret_cast<int (*)()>(dlsym(lib_, "nvmlShutdown"))) shutdown();
    dlclose(lib_);
  }
}

double GpuMonitor::utilization() const {
  if (!device_) return -1;
  NvmlUtilization u{};
  return get_util_(device_, &u) == 0 ? static_cast<double>(u.gpu) : -1;
}

}  // namespace batchdist::worker
