#pragma once
// Note [torch compat]: the only place that knows which LibTorch it is built against.
// Debian 12 ships LibTorch 1.13 (c10d backends derive from c10d::ProcessGroup);
// LibTorch 2.x splits ProcessGroup into a front and per-device c10d::Backend
// objects, and ProcessGroupGloo/ProcessGroupNCCL derive from Backend. Both expose
// the same collective calls (allreduce/broadcast/allgather/barrier returning
// c10::intrusive_ptr<c10d::Work>), so everything else talks to `compat::Backend`.

#include <torch/version.h>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#if defined(BATCHDIST_WITH_NCCL)
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#if defined(BATCHDIST_WITH_CUDA)
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#endif

#include <ATen/autocast_mode.h>

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>

namespace batchdist::compat {

#if TORCH_VERSION_MAJOR >= 2
using Backend = c10d::Backend;
#else
using Backend = c10d::ProcessGroup;
#endif
using BackendPtr = c10::intrusive_ptr<Backend>;
using WorkPtr = c10::intrusive_ptr<c10d::Work>;
using StorePtr = c10::intrusive_ptr<c10d::Store>;

constexpr int kTorchMajor = TORCH_VERSION_MAJOR;
constexpr int kTorchMinor = TORCH_VERSION_MINOR;
inline std::string torchVersion() { return TORCH_VERSION; }

/// A Gloo backend bound to one transport device (interface or host address).
inline BackendPtr makeGloo(const StorePtr& store, int rank, int size,
                           std::chrono::milliseconds timeout,
                           std::shared_ptr<::gloo::transport::Device> device) {
  auto opts = c10d::ProcessGroupGloo::Options::create(timeout);
  opts->devices.push_back(std::move(device));
  opts->threads = 2;
  return c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, size, opts);
}

#if defined(BATCHDIST_WITH_NCCL)
inline BackendPtr makeNccl(const StorePtr& store, int rank, int size,
                           std::chrono::milliseconds timeout) {
  auto opts = c10d::ProcessGroupNCCL::Options::create();
  opts->timeout = timeout;
  return c10::make_intrusive<c10d::ProcessGroupNCCL>(store, rank, size, opts);
}
#endif

/// Opens a TCPStore: the server on rank 0 (port 0 = any free port), a client elsewhere.
inline c10::intrusive_ptr<c10d::TCPStore> makeTcpStore(const std::string& host, uint16_t port,
                                                       bool is_server,
                                                       std::chrono::milliseconds timeout) {
  c10d::TCPStoreOptions opts;
  opts.port = port;
  opts.isServer = is_server;
  opts.waitWorkers = false;  // the other ranks learn the address only after this returns
  opts.timeout = timeout;
  return c10::make_intrusive<c10d::TCPStore>(host, opts);
}

/// Makes CUDA device `index` current for this process (no-op in CPU builds).
inline void setCudaDevice(int index) {
#if defined(BATCHDIST_WITH_CUDA)
  c10::cuda::set_device(static_cast<c10::DeviceIndex>(index));
#else
  (void)index;
#endif
}

// CUDA memory accounting for the batch search (all no-ops / zero in CPU builds).

/// Peak bytes allocated by the caching allocator on `index` since the last reset.
inline double cudaPeakAllocatedBytes(int index) {
#if defined(BATCHDIST_WITH_CUDA)
  // allocated_bytes[0] is StatType::AGGREGATE in 1.13 and 2.x alike (the enum
  // moved namespaces in 2.x, its first value did not).
  const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(index);
  return static_cast<double>(stats.allocated_bytes[0].peak);
#else
  (void)index;
  return 0;
#endif
}

inline void cudaResetPeak(int index) {
#if defined(BATCHDIST_WITH_CUDA)
  c10::cuda::CUDACachingAllocator::resetPeakStats(index);
#else
  (void)index;
#endif
}

inline double cudaTotalBytes(int index) {
#if defined(BATCHDIST_WITH_CUDA)
  return static_cast<double>(at::cuda::getDeviceProperties(index)->totalGlobalMem);
#else
  (void)index;
  return 0;
#endif
}

inline std::string cudaDeviceName(int index) {
#if defined(BATCHDIST_WITH_CUDA)
  return at::cuda::getDeviceProperties(index)->name;
#else
  (void)index;
  return "";
#endif
}

/// Returns cached, unused blocks to the driver (after an out-of-memory candidate).
inline void cudaEmptyCache() {
#if defined(BATCHDIST_WITH_CUDA)
  c10::cuda::CUDACachingAllocator::emptyCache();
#endif
}

/// Copies a (pinned) host tensor to `device`. On CUDA the copy is issued with
/// non_blocking on a side stream, the current stream waits for it through an
/// event, and the allocator is told the result is used on the current stream.
inline at::Tensor copyToDeviceAsync(const at::Tensor& host, const at::Device& device) {
#if defined(BATCHDIST_WITH_CUDA)
  if (device.is_cuda()) {
    static thread_local std::optional<c10::cuda::CUDAStream> side;
    if (!side || side->device_index() != device.index()) {
      side = c10::cuda::getStreamFromPool(/*isHighPriority=*/false, device.index());
    }
    auto compute = c10::cuda::getCurrentCUDAStream(device.index());
    at::Tensor out;
    {
      c10::cuda::CUDAStreamGuard guard(*side);
      out = host.to(device, /*non_blocking=*/true);
    }
    at::cuda::CUDAEvent copied;
    copied.record(*side);
    copied.block(compute);
    c10::cuda::CUDACachingAllocator::recordStream(out.storage().data_ptr(), compute);
    return out;
  }
#endif
  return host.to(device);
}

/// Autocast on or off for a device type, with the low-precision dtype.
/// (LibTorch 2.4 made the per-device setters generic.)
inline void setAutocast(at::DeviceType type, bool enabled, at::ScalarType dtype) {
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
  at::autocast::set_autocast_enabled(type, enabled);
  at::autocast::set_autocast_dtype(type, dtype);
#else
  if (type == at::kCUDA) {
    at::autocast::set_enabled(enabled);
    at::autocast::set_autocast_gpu_dtype(dtype);
  } else {
    at::autocast::set_cpu_enabled(enabled);
    at::autocast::set_autocast_cpu_dtype(dtype);
  }
#endif
}

}  // namespace batchdist::compat
