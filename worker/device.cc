#include "worker/device.h"

#include <cstdlib>

#include "collective/device_compat.h"
#include "collective/error.h"
#include "collective/process_group.h"
#include "worker/config/config.h"

namespace batchdist::worker {
namespace {

std::string joined(const std::vector<std::string>& v) {
  std::string out;
  for (const auto& s : v) out += (out.empty() ? "" : ", ") + s;
  return out;
}

/// The way out that does not involve the config: another build or another node.
std::string otherwise(const GpuInventory& gpus) {
  return gpus.cuda_build ? "or run on a node with GPUs"
                         : "or build batchdist against a CUDA LibTorch (README: \"LibTorch 2.x / "
                           "CUDA\")";
}

}  // namespace

GpuInventory probeGpus(const std::string& host) {
  GpuInventory g;
  g.cuda_build = compat::kCudaBuild;
  g.count = compat::visibleGpuCount();
  if (g.count == 0) g.none_reason = compat::whyNoGpu(host);
  return g;
}

at::Device chooseDevice(const worker::Config& cfg, const GpuInventory& gpus,
                        const std::string& host, int local_rank, int local_size) {
  const DeviceKind want = cfg.train.device;
  const bool nccl = cfg.dist.backend == DistBackend::kNccl;
  if (want == DeviceKind::kCpu && !nccl) return at::kCPU;
  if (want == DeviceKind::kCpu && gpus.count > 0) {
    throw ConfigError(strCat(cfg.source, ": dist.backend: nccl needs a GPU per rank, but "
                             "train.device: cpu; set dist.backend: gloo (or auto) to train on the "
                             "CPU, or train.device: cuda (or auto)"));
  }
  if (gpus.count == 0) {
    if (want == DeviceKind::kAuto && !nccl) return at::kCPU;
    const std::string asked = want == DeviceKind::kCuda && nccl
                                  ? "train.device: cuda and dist.backend: nccl"
                              : nccl                 ? "dist.backend: nccl"
                                                     : "train.device: cuda";
    const std::string fix = want == DeviceKind::kCuda && nccl
                                ? "Set train.device: cpu and dist.backend: gloo (or leave both at "
                                  "auto) to train on the CPU"
                            : nccl ? "Set dist.backend: gloo (or auto) to train on the CPU"
                                   : "Set train.device: cpu (or auto) to train on the CPU";
    throw ConfigError(strCat(
        cfg.source, ": ", asked, ", but ", gpus.none_reason,
        nccl ? strCat("; this build has backends: auto, ", joined(collective::availableBackends()))
             : std::string(),
        ". ", fix, ", ", otherwise(gpus)));
  }
  if (local_size > gpus.count) {
    const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
    throw ConfigError(strCat(
        "host ", host, " runs ", local_size, " ranks but this rank sees only ", gpus.count,
        " GPU(s)",
        visible != nullptr ? strCat(" (CUDA_VISIBLE_DEVICES='", visible, "')") : std::string(),
        "; start at most one rank per GPU (mpirun -np, or --map-by ppr:", gpus.count,
        ":node across hosts) or set train.device: cpu",
        std::getenv("SLURM_JOB_ID") != nullptr
            ? ". Under Slurm, --gpus-per-task binds every task to its own GPU unless the step "
              "has --gpu-bind=none (the script `batchdist slurm` writes passes it)"
            : ""));
  }
  return at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(local_rank));
}

}  // namespace batchdist::worker
