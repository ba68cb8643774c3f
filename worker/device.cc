#include "worker/device.h"

#include <ATen/Context.h>
#include <dlfcn.h>

#include <cstdlib>
#include <filesystem>

#include "common/device_compat.h"
#include "common/error.h"
#include "collective/process_group.h"
#include "worker/common/console.h"
#include "worker/config/config.h"

namespace batchdist::worker {
namespace {

/// The way out that does not involve the config: another build or another node.
std::string otherwise(const GpuInventory& gpus) {
  return gpus.cuda_build ? "or run on a node with GPUs"
                         : "or build batchdist against a CUDA LibTorch (docs/gpu.md)";
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
  // Note [ranks sharing a GPU]: NCCL refuses two ranks on one device, so more ranks
  // than GPUs on a host is an error, unless the backend is named gloo or mpi: then
  // ranks share the GPUs round-robin (a one-GPU node's multi-rank checks). They also
  // share its memory: the search's memory budget is each rank's, not divided.
  const bool may_share =
      cfg.dist.backend == DistBackend::kGloo || cfg.dist.backend == DistBackend::kMpi;
  if (local_size > gpus.count && !may_share) {
    const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
    throw ConfigError(strCat(
        "host ", host, " runs ", local_size, " ranks but this rank sees only ", gpus.count,
        " GPU(s)",
        visible != nullptr ? strCat(" (CUDA_VISIBLE_DEVICES='", visible, "')") : std::string(),
        "; start at most one rank per GPU (mpirun -np, or --map-by ppr:", gpus.count,
        ":node across hosts), set dist.backend: gloo to share the GPUs (slower: no NCCL), "
        "or set train.device: cpu",
        std::getenv("SLURM_JOB_ID") != nullptr
            ? ". Under Slurm, --gpus-per-task binds every task to its own GPU unless the step "
              "has --gpu-bind=none (the script `batchdist slurm` writes passes it)"
            : ""));
  }
  return at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(local_rank % gpus.count));
}

HostBlas describeBlas(const std::string& path, const std::string& openblas_config,
                      int openblas_parallel) {
  HostBlas b;
  b.path = path;
  if (!openblas_config.empty()) {
    // "OpenBLAS 0.3.21 DYNAMIC_ARCH NO_AFFINITY Haswell MAX_THREADS=64": name and version.
    std::string head = openblas_config;
    for (int words = 0, i = 0; i < static_cast<int>(head.size()); ++i) {
      if (head[i] == ' ' && ++words == 2) {
        head.resize(i);
        break;
      }
    }
    const char* how[] = {"serial", "pthreads", "OpenMP"};
    b.name = head + (openblas_parallel >= 0 && openblas_parallel <= 2
                       ? strCat(" (", how[openblas_parallel], ")")
                       : std::string());
    return b;
  }
  if (path.empty()) return b;
  // Debian and Ubuntu install the netlib reference as the alternative .../blas/libblas.so.3.
  const std::filesystem::path p(path);
  b.reference = p.parent_path().filename() == "blas" && p.filename().string().rfind("libblas.so", 0) == 0;
  b.name = b.reference ? "reference BLAS" : p.filename().string();
  return b;
}

HostBlas configureHostBlas(int threads) {
  void* sgemm = dlsym(RTLD_DEFAULT, "sgemm_");
  Dl_info info{};
  std::string path;
  const bool found = sgemm != nullptr && dladdr(sgemm, &info) != 0 && info.dli_fname != nullptr;
  if (found) {
    std::error_code ec;
    const auto real = std::filesystem::canonical(info.dli_fname, ec);
    path = ec ? std::string(info.dli_fname) : real.string();
  }
  using ConfigFn = char* (*)();
  using IntFn = int (*)();
  using SetFn = void (*)(int);
  // OpenBLAS may be loaded (Debian's liblapack.so.3 alternative can be OpenBLAS's)
  // while sgemm_ comes from the reference libblas.so.3: ask only the library that
  // serves sgemm_ and what it depends on (Debian's OpenBLAS libblas.so.3 is a
  // wrapper over libopenblas.so.0).
  void* lib = found ? dlopen(info.dli_fname, RTLD_NOW | RTLD_NOLOAD) : nullptr;
  const auto sym = [lib](const char* name) { return lib != nullptr ? dlsym(lib, name) : nullptr; };
  auto config = reinterpret_cast<ConfigFn>(sym("openblas_get_config"));
  auto parallel = reinterpret_cast<IntFn>(sym("openblas_get_parallel"));
  auto get_threads = reinterpret_cast<IntFn>(sym("openblas_get_num_threads"));
  auto set_threads = reinterpret_cast<SetFn>(sym("openblas_set_num_threads"));
  const int how = config != nullptr && parallel != nullptr ? parallel() : -1;
  HostBlas b = describeBlas(path, config != nullptr && config() != nullptr ? config() : "", how);
  if (how == 1 && get_threads != nullptr && set_threads != nullptr && get_threads() > threads) {
    set_threads(threads);
    b.capped_threads = threads;
  }
  if (lib != nullptr) dlclose(lib);  // drops the reference RTLD_NOLOAD took
  return b;
}

std::string blasLine(const HostBlas& blas) {
  if (blas.name.empty()) return "";
  if (blas.reference) {
    return strCat("warning: CPU matrix products go through the reference BLAS (", blas.path,
                  "), many times slower than an optimised one; install OpenBLAS (Debian: "
                  "apt-get install libopenblas0-openmp; if it is installed, select it with "
                  "update-alternatives --config libblas.so.3-x86_64-linux-gnu) and run again");
  }
  return strCat("cpu: matrix products by ", blas.name,
                blas.capped_threads > 0 ? strCat(", its thread pool capped at ", blas.capped_threads)
                                        : std::string());
}

std::string tuneConvolutionsForTraining(const Config& cfg, const at::Device& device) {
  if (!device.is_cuda()) return "";
  const bool on = cfg.train.cudnn_benchmark;
  at::globalContext().setBenchmarkCuDNN(on);
  return on ? "cudnn: benchmark mode on for training (off during the batch search: Note [cudnn benchmark])"
            : "cudnn: benchmark mode off (train.cudnn_benchmark: false)";
}

}  // namespace batchdist::worker
