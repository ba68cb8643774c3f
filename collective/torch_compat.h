#pragma once
// Note [torch compat]: the only place that knows which LibTorch it is built against.
// Debian 12 ships LibTorch 1.13 (c10d backends derive from c10d::ProcessGroup);
// LibTorch 2.x splits ProcessGroup into a front and per-device c10d::Backend
// objects, and ProcessGroupGloo/ProcessGroupNCCL derive from Backend. Both expose
// the same collective calls (allreduce/broadcast/allgather/barrier returning
// c10::intrusive_ptr<c10d::Work>), so everything else talks to `compat::Backend`.
// This header is the c10d half; common/device_compat.h (included below) is the
// device half. CI compiles both against 1.13.1 (Debian) and 2.14.1 (pip, CUDA 13.0,
// tests/cuda_leg.sh); the guards for the releases in between (2.4: generic autocast
// setters, NCCL shutdown) are not compiled anywhere.

#include <torch/version.h>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#if defined(BATCHDIST_WITH_NCCL)
#include <nccl.h>
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

// The device half (CUDA memory, streams, autocast, GPU discovery).
#include "common/device_compat.h"

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
/// An NCCL backend. Its communicators are created lazily, by the first collective,
/// on the device of that collective's tensors (the current CUDA device).
inline BackendPtr makeNccl(const StorePtr& store, int rank, int size,
                           std::chrono::milliseconds timeout) {
  auto opts = c10d::ProcessGroupNCCL::Options::create();
  opts->timeout = timeout;
  return c10::make_intrusive<c10d::ProcessGroupNCCL>(store, rank, size, opts);
}
#endif

/// c10d's flat collectives (Note [flat collectives]): reduce-scatter of `input`
/// (W x n elements) into `output` (n), and all-gather of `input` (n) into `output`
/// (W x n). 1.13 calls them _reduce_scatter_base / _allgather_base; 2.14 (and 2.15)
/// call them reduce_scatter_single / all_gather_single and keep the old names on
/// c10d::Backend as forwarding aliases. The releases in between (not compiled
/// anywhere; which of them renamed the calls is not checked) take the old names,
/// which every one of them has. Only NCCL's are called: Gloo's are missing (1.13)
/// or emulations themselves (2.x).
inline WorkPtr reduceScatterFlat(Backend& backend, at::Tensor& output, at::Tensor& input,
                                 const c10d::ReduceScatterOptions& opts) {
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 14)
  return backend.reduce_scatter_single(output, input, opts);
#else
  return backend._reduce_scatter_base(output, input, opts);
#endif
}

inline WorkPtr allgatherFlat(Backend& backend, at::Tensor& output, at::Tensor& input,
                             const c10d::AllgatherOptions& opts) {
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 14)
  return backend.all_gather_single(output, input, opts);
#else
  return backend._allgather_base(output, input, opts);
#endif
}

/// Ends a backend's work before it is destroyed. LibTorch >= 2.4's NCCL backend
/// warns ("process group has NOT been destroyed") and shuts itself down in its
/// destructor when nobody did; the explicit call is the normal exit. No-op for
/// Gloo and for older releases.
inline void shutdownBackend(const BackendPtr& backend) {
#if defined(BATCHDIST_WITH_NCCL) && \
    (TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4))
  if (auto* nccl = dynamic_cast<c10d::ProcessGroupNCCL*>(backend.get())) nccl->shutdown();
#else
  (void)backend;
#endif
}

/// The NCCL library this process loaded, e.g. "2.30.7"; "" without NCCL.
inline std::string ncclVersion() {
#if defined(BATCHDIST_WITH_NCCL)
  int v = 0;
  if (ncclGetVersion(&v) != ncclSuccess) return "unknown";
  // NCCL >= 2.9 encodes major*10000 + minor*100 + patch, older major*1000 + minor*100 + patch.
  const int major = v >= 20900 ? v / 10000 : v / 1000;
  const int minor = v >= 20900 ? (v % 10000) / 100 : (v % 1000) / 100;
  return std::to_string(major) + "." + std::to_string(minor) + "." + std::to_string(v % 100);
#else
  return "";
#endif
}

/// What this binary was built against, for `batchdist --version`:
/// "torch 2.14.1, CUDA 13.0, NCCL 2.30.7" or "torch 1.13.1, CPU build".
inline std::string buildDescription() {
  std::string out = "torch " + torchVersion();
  if (!kCudaBuild) return out + ", CPU build";
  out += ", CUDA " + cudaRuntimeVersion();
#if defined(BATCHDIST_WITH_NCCL)
  out += ", NCCL " + ncclVersion();
#else
  out += ", no NCCL";
#endif
  return out;
}

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

}  // namespace batchdist::compat
