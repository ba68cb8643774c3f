#pragma once
// Which device a rank trains on: train.device and dist.backend against the GPUs
// this process sees. Kept apart from main() so that every refusal is unit-tested
// without a GPU (tests/device_test.cc). Used by prepareRun (worker/run.cc)..

#include <c10/core/Device.h>

#include <string>

namespace batchdist::worker {

struct Config;

/// The GPUs one process sees, probed once by probeGpus().
struct GpuInventory {
  bool cuda_build = false;  ///< built against a LibTorch with CUDA
  int count = 0;            ///< CUDA devices visible to this process
  std::string none_reason;  ///< count == 0: why (CPU-only build, no driver, CUDA_VISIBLE_DEVICES)
};

/// Asks the CUDA runtime (never throws, prints nothing; a CPU build sees none).
GpuInventory probeGpus(const std::string& host);

/// Local rank -> device: CUDA ranks bind to GPU = local rank; `auto` takes the
/// GPU when there is one. Throws ConfigError (exit code 2) that says what this
/// host has and what to set when the config asks for a GPU that is not there
/// (train.device: cuda or dist.backend: nccl without a visible GPU or in a
/// CPU-only build), for nccl with train.device: cpu, and when more ranks share
/// the host than it has GPUs. Deterministic: every rank of a host decides alike.
at::Device chooseDevice(const worker::Config& cfg, const GpuInventory& gpus,
                        const std::string& host, int local_rank, int local_size);

}  // namespace batchdist::worker
