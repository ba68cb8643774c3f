#include "worker/train/step/memory.h"

#include <c10/util/Exception.h>
#include <malloc.h>

#include <cstdlib>
#include <fstream>
#include <new>
#include <string>

#include "common/device_compat.h"

namespace batchdist::worker {

bool isOutOfMemory(const std::exception& e) {
  if (dynamic_cast<const c10::OutOfMemoryError*>(&e) != nullptr) return true;
  if (dynamic_cast<const std::bad_alloc*>(&e) != nullptr) return true;
  const std::string what = e.what();
  for (const char* needle : {"out of memory", "CUDNN_STATUS_NOT_SUPPORTED", "CUBLAS_STATUS_ALLOC_FAILED",
                             "CUDNN_STATUS_ALLOC_FAILED", "can't allocate memory"}) {
    if (what.find(needle) != std::string::npos) return true;
  }
  return false;
}

void configureHostAllocator() {
  mallopt(M_MMAP_MAX, 0);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
}

void resetPeakRss() {
  // Give freed heap back first, so the new peak is not masked by (or charged
  // for) what an earlier candidate left behind.
  malloc_trim(0);
  // Linux >= 4.0: writing 5 to clear_refs resets VmHWM to the current RSS.
  std::ofstream("/proc/self/clear_refs") << "5";
}

double peakRssMb() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmHWM:", 0) == 0) return std::atof(line.c_str() + 6) / 1024.0;
  }
  return 0;
}

double peakMemoryMb(const at::Device& device) {
  return device.is_cuda() ? compat::cudaPeakAllocatedBytes(device.index()) / (1 << 20) : peakRssMb();
}

void resetPeakMemory(const at::Device& device) {
  if (device.is_cuda()) {
    compat::cudaResetPeak(device.index());
  } else {
    resetPeakRss();
  }
}

}  // namespace batchdist::worker
