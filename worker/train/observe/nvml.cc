#include "worker/train/observe/nvml.h"

#include <dlfcn.h>

#include <cctype>
#include <sstream>

#include "common/error.h"

namespace batchdist::worker {
namespace {

constexpr int kTemperatureGpu = 0;  // NVML_TEMPERATURE_GPU
constexpr int kClockSm = 1;         // NVML_CLOCK_SM
// nvmlClocksEventReason* (nvml.h).
constexpr uint64_t kSwPowerCap = 0x4, kHwSlowdown = 0x8, kSwThermal = 0x20, kHwThermal = 0x40,
                   kHwPowerBrake = 0x80;

bool allDigits(const std::string& s) {
  if (s.empty()) return false;
  for (char c : s) {
    if (!std::isdigit(static_cast<unsigned char>(c))) return false;
  }
  return true;
}

std::string trimmed(const std::string& s) {
  const auto b = s.find_first_not_of(" \t");
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(" \t") - b + 1);
}

}  // namespace

NvmlTarget nvmlTarget(int cuda_index, const std::string& visible) {
  NvmlTarget t;
  if (trimmed(visible).empty()) {
    t.index = cuda_index;
    return t;
  }
  std::vector<std::string> list;
  std::stringstream in(visible);
  for (std::string item; std::getline(in, item, ',');) list.push_back(trimmed(item));
  if (cuda_index < 0 || cuda_index >= static_cast<int>(list.size())) {
    t.error = strCat("CUDA device ", cuda_index, " is not in CUDA_VISIBLE_DEVICES=", visible);
    return t;
  }
  const std::string& item = list[static_cast<std::size_t>(cuda_index)];
  if (allDigits(item)) {
    t.index = std::stoi(item);
  } else {
    t.uuid = item;  // "GPU-..." (MIG-... instances have no NVML device of their own here)
  }
  return t;
}

void setThrottle(uint64_t reasons, GpuReading* r) {
  r->power_throttled = (reasons & (kSwPowerCap | kHwPowerBrake | kHwSlowdown)) != 0;
  r->thermal_throttled = (reasons & (kSwThermal | kHwThermal | kHwSlowdown)) != 0;
}

// The entry points, and the two structs they fill (nvmlUtilization_t, nvmlMemory_t),
// members of Api rather than of an anonymous namespace: Api is declared in the
// header, so its fields may not use a type of this file's alone (Note [unity build]).
struct Nvml::Api {
  struct NvmlUtilization {
    unsigned int gpu;
    unsigned int memory;
  };
  struct NvmlMemory {
    unsigned long long total;
    unsigned long long free;
    unsigned long long used;
  };
  int (*util)(void*, NvmlUtilization*) = nullptr;
  int (*memory)(void*, NvmlMemory*) = nullptr;
  int (*power)(void*, unsigned int*) = nullptr;
  int (*power_limit)(void*, unsigned int*) = nullptr;
  int (*temperature)(void*, int, unsigned int*) = nullptr;
  int (*clock)(void*, int, unsigned int*) = nullptr;
  int (*reasons)(void*, unsigned long long*) = nullptr;
  const char* (*error_string)(int) = nullptr;
};

void* Nvml::symbol(const char* name, const char* metric) {
  void* s = dlsym(lib_, name);
  if (!s && metric) missing_.push_back(strCat(metric, " (no ", name, ")"));
  return s;
}

Nvml::Nvml(const std::string& library, int cuda_index, const std::string& visible)
    : api_(std::make_unique<Api>()) {
  lib_ = dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!lib_) {
    const char* why = dlerror();
    error_ = strCat("cannot load ", library, why ? strCat(": ", why) : std::string());
    return;
  }
  auto init = reinterpret_cast<int (*)()>(symbol("nvmlInit_v2", nullptr));
  api_->error_string = reinterpret_cast<const char* (*)(int)>(symbol("nvmlErrorString", nullptr));
  if (!init) {
    error_ = strCat(library, " has no nvmlInit_v2");
    return;
  }
  if (const int rc = init(); rc != 0) {
    error_ = strCat("nvmlInit_v2: ", errorText(rc));
    return;
  }
  initialized_ = true;
  if (!openDevice(nvmlTarget(cuda_index, visible))) return;
  resolveMetrics();
}

bool Nvml::openDevice(const NvmlTarget& target) {
  if (!target.error.empty()) {
    error_ = target.error;
    return false;
  }
  void* dev = nullptr;
  int rc = -1;
  const char* how = target.index >= 0 ? "nvmlDeviceGetHandleByIndex_v2" : "nvmlDeviceGetHandleByUUID";
  if (target.index >= 0) {
    if (auto f = reinterpret_cast<int (*)(unsigned int, void**)>(symbol(how, nullptr))) {
      rc = f(static_cast<unsigned int>(target.index), &dev);
    }
  } else if (auto f = reinterpret_cast<int (*)(const char*, void**)>(symbol(how, nullptr))) {
    rc = f(target.uuid.c_str(), &dev);
  }
  if (rc != 0 || !dev) {
    error_ = strCat(how, "(", target.index >= 0 ? std::to_string(target.index) : target.uuid, "): ",
                    rc == -1 ? std::string("no such entry point") : errorText(rc));
    return false;
  }
  device_ = dev;
  return true;
}

void Nvml::resolveMetrics() {
  api_->util = reinterpret_cast<decltype(api_->util)>(
      symbol("nvmlDeviceGetUtilizationRates", "utilization"));
  api_->memory = reinterpret_cast<decltype(api_->memory)>(
      symbol("nvmlDeviceGetMemoryInfo", "memory used"));
  api_->power = reinterpret_cast<decltype(api_->power)>(symbol("nvmlDeviceGetPowerUsage", "power"));
  api_->power_limit = reinterpret_cast<decltype(api_->power_limit)>(
      symbol("nvmlDeviceGetEnforcedPowerLimit", "power limit"));
  api_->temperature = reinterpret_cast<decltype(api_->temperature)>(
      symbol("nvmlDeviceGetTemperature", "temperature"));
  api_->clock = reinterpret_cast<decltype(api_->clock)>(symbol("nvmlDeviceGetClockInfo", "SM clock"));
  // Renamed in NVML 12; either serves.
  api_->reasons = reinterpret_cast<decltype(api_->reasons)>(
      dlsym(lib_, "nvmlDeviceGetCurrentClocksEventReasons"));
  if (!api_->reasons) {
    api_->reasons = reinterpret_cast<decltype(api_->reasons)>(
        symbol("nvmlDeviceGetCurrentClocksThrottleReasons", "throttle reasons"));
  }
}

Nvml::~Nvml() {
  if (lib_) {
    if (initialized_) {
      if (auto shutdown = reinterpret_cast<int (*)()>(dlsym(lib_, "nvmlShutdown"))) shutdown();
    }
    dlclose(lib_);
  }
}

std::string Nvml::errorText(int rc) const {
  const char* text = api_->error_string ? api_->error_string(rc) : nullptr;
  return text ? strCat(text, " (", rc, ")") : strCat("error ", rc);
}

bool Nvml::ok(int rc, const char* metric) {
  if (rc == 0) return true;
  for (auto& f : failures_) {
    if (f.metric == metric) {
      ++f.count;
      return false;
    }
  }
  failures_.push_back({metric, 1, errorText(rc)});
  new_failures_.push_back(failures_.back());
  return false;
}

std::vector<Nvml::Failure> Nvml::takeNewFailures() {
  std::vector<Failure> out;
  out.swap(new_failures_);
  return out;
}

GpuReading Nvml::read() {
  GpuReading r;
  if (!device_) return r;
  constexpr double kMb = 1024.0 * 1024.0;
  if (Api::NvmlUtilization u{}; api_->util && ok(api_->util(device_, &u), "utilization")) {
    r.util_pct = u.gpu;
    r.memory_util_pct = u.memory;
  }
  if (Api::NvmlMemory m{}; api_->memory && ok(api_->memory(device_, &m), "memory used")) {
    r.memory_used_mb = static_cast<double>(m.used) / kMb;
    r.memory_total_mb = static_cast<double>(m.total) / kMb;
  }
  unsigned int v = 0;
  if (api_->power && ok(api_->power(device_, &v), "power")) r.power_w = v / 1000.0;
  if (api_->power_limit && ok(api_->power_limit(device_, &v), "power limit")) {
    r.power_limit_w = v / 1000.0;
  }
  if (api_->temperature && ok(api_->temperature(device_, kTemperatureGpu, &v), "temperature")) {
    r.temperature_c = v;
  }
  if (api_->clock && ok(api_->clock(device_, kClockSm, &v), "SM clock")) r.sm_clock_mhz = v;
  if (unsigned long long bits = 0; api_->reasons && ok(api_->reasons(device_, &bits), "throttle reasons")) {
    setThrottle(bits, &r);
  }
  return r;
}

}  // namespace batchdist::worker
