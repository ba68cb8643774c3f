// A stand-in for libnvidia-ml.so.1 (Note [nvml metrics]) with fixed readings, for
// tests on machines without a GPU. Built twice: complete, and with
// -DNVML_STUB_PARTIAL, which leaves out the power, power-limit and
// throttle-reason entry points (an older or cut-down NVML).
//
// Environment, read at each call:
//   BATCHDIST_NVML_STUB_FAIL     comma-separated calls that fail with
//                                NVML_ERROR_UNKNOWN (999): init, device,
//                                utilization, memory, power, limit, temperature,
//                                clock, reasons
//   BATCHDIST_NVML_STUB_REASONS  the throttle-reason bits to report (default 0)
//
// Readings: GPU 42 %, memory controller 17 %, 20 of 80 GiB used, 350 W of a
// 700 W limit, 71 C, SM clock 1755 MHz.
#include <cstdlib>
#include <cstring>

extern "C" {

constexpr int kStubError = 999;

static int failing(const char* call) {
  const char* list = std::getenv("BATCHDIST_NVML_STUB_FAIL");
  if (!list) return 0;
  std::size_t n = std::strlen(call);
  for (const char* p = list; *p;) {
    const char* end = std::strchr(p, ',');
    std::size_t len = end ? static_cast<std::size_t>(end - p) : std::strlen(p);
    if (len == n && std::strncmp(p, call, n) == 0) return 1;
    if (!end) break;
    p = end + 1;
  }
  return 0;
}

struct Utilization {
  unsigned int gpu, memory;
};
struct Memory {
  unsigned long long total, free, used;
};

static int device_token;

int nvmlInit_v2(void) { return failing("init") ? kStubError : 0; }
int nvmlShutdown(void) { return 0; }
const char* nvmlErrorString(int rc) { return rc == kStubError ? "Unknown Error" : "stub error"; }

int nvmlDeviceGetHandleByIndex_v2(unsigned int index, void** device) {
  if (failing("device") || index > 7) return kStubError;
  *device = &device_token;
  return 0;
}

int nvmlDeviceGetHandleByUUID(const char* uuid, void** device) {
  if (failing("device") || std::strncmp(uuid, "GPU-", 4) != 0) return kStubError;
  *device = &device_token;
  return 0;
}

int nvmlDeviceGetUtilizationRates(void* device, Utilization* u) {
  (void)device;
  if (failing("utilization")) return kStubError;
  u->gpu = 42;
  u->memory = 17;
  return 0;
}

int nvmlDeviceGetMemoryInfo(void* device, Memory* m) {
  (void)device;
  if (failing("memory")) return kStubError;
  m->total = 80ull << 30;
  m->used = 20ull << 30;
  m->free = m->total - m->used;
  return 0;
}

int nvmlDeviceGetTemperature(void* device, int sensor, unsigned int* c) {
  (void)device;
  if (failing("temperature") || sensor != 0) return kStubError;
  *c = 71;
  return 0;
}

int nvmlDeviceGetClockInfo(void* device, int type, unsigned int* mhz) {
  (void)device;
  if (failing("clock") || type != 1) return kStubError;
  *mhz = 1755;
  return 0;
}

#ifndef NVML_STUB_PARTIAL
int nvmlDeviceGetPowerUsage(void* device, unsigned int* mw) {
  (void)device;
  if (failing("power")) return kStubError;
  *mw = 350000;
  return 0;
}

int nvmlDeviceGetEnforcedPowerLimit(void* device, unsigned int* mw) {
  (void)device;
  if (failing("limit")) return kStubError;
  *mw = 700000;
  return 0;
}

int nvmlDeviceGetCurrentClocksEventReasons(void* device, unsigned long long* reasons) {
  (void)device;
  if (failing("reasons")) return kStubError;
  const char* bits = std::getenv("BATCHDIST_NVML_STUB_REASONS");
  *reasons = bits ? std::strtoull(bits, nullptr, 0) : 0;
  return 0;
}
#endif

}  // extern "C"
