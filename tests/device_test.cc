// Which device a rank trains on, and every refusal, without needing a GPU: the
// GPU inventory is passed in (worker/device.h).
#include <gtest/gtest.h>

#include <filesystem>

#include "common/device_compat.h"
#include "collective/torch_compat.h"
#include "common/error.h"
#include "worker/device.h"
#include "worker/config/config.h"

using batchdist::ConfigError;
using batchdist::worker::chooseDevice;
using batchdist::worker::GpuInventory;
using batchdist::worker::probeGpus;

namespace {

batchdist::worker::Config config(const std::string& device, const std::string& backend) {
  return batchdist::worker::parseConfig(
      "train: {device: " + device + "}\ndist: {backend: " + backend + "}\n", "job.yaml");
}

const GpuInventory kCpuBuild{false, 0, "this batchdist is a CPU-only build (LibTorch 1.13.1 without CUDA)"};
const GpuInventory kNoGpu{true, 0, "no GPU is visible on host h: no NVIDIA driver is installed"};
const GpuInventory kTwoGpus{true, 2, ""};

/// The refusal's message; fails the test unless chooseDevice refuses with exit code 2.
std::string refusal(const std::string& device, const std::string& backend, const GpuInventory& g,
                    int local_size = 1) {
  try {
    const auto d = chooseDevice(config(device, backend), g, "h", 0, local_size);
    ADD_FAILURE() << "chose " << d.str() << " for device " << device << ", backend " << backend;
  } catch (const ConfigError& e) {
    EXPECT_EQ(e.exitCode(), 2);
    return e.what();
  }
  return "";
}

}  // namespace

TEST(Device, AutoTakesTheLocalRanksGpuOrTheCpu) {
  EXPECT_EQ(chooseDevice(config("auto", "auto"), kCpuBuild, "h", 0, 2), at::Device(at::kCPU));
  EXPECT_EQ(chooseDevice(config("auto", "gloo"), kNoGpu, "h", 1, 2), at::Device(at::kCPU));
  EXPECT_EQ(chooseDevice(config("auto", "auto"), kTwoGpus, "h", 1, 2), at::Device("cuda:1"));
  EXPECT_EQ(chooseDevice(config("cuda", "nccl"), kTwoGpus, "h", 0, 2), at::Device("cuda:0"));
  EXPECT_EQ(chooseDevice(config("cpu", "gloo"), kTwoGpus, "h", 0, 2), at::Device(at::kCPU));
}

TEST(Device, CudaWithoutAGpuSaysWhatTheHostHasAndWhatToSet) {
  auto m = refusal("cuda", "auto", kNoGpu);
  EXPECT_NE(m.find("job.yaml: train.device: cuda, but no GPU is visible on host h"), std::string::npos) << m;
  EXPECT_NE(m.find("Set train.device: cpu (or auto)"), std::string::npos) << m;
  EXPECT_NE(m.find("or run on a node with GPUs"), std::string::npos) << m;
  m = refusal("cuda", "gloo", kCpuBuild);
  EXPECT_NE(m.find("train.device: cuda, but this batchdist is a CPU-only build"), std::string::npos) << m;
  EXPECT_NE(m.find("build batchdist against a CUDA LibTorch"), std::string::npos) << m;
}

TEST(Device, NcclWithoutAGpuNamesTheBackendsAndGloo) {
  auto m = refusal("auto", "nccl", kNoGpu);
  EXPECT_NE(m.find("dist.backend: nccl, but no GPU is visible"), std::string::npos) << m;
  EXPECT_NE(m.find("this build has backends: auto, gloo"), std::string::npos) << m;
  EXPECT_NE(m.find("Set dist.backend: gloo (or auto)"), std::string::npos) << m;
  m = refusal("cuda", "nccl", kNoGpu);
  EXPECT_NE(m.find("train.device: cuda and dist.backend: nccl, but"), std::string::npos) << m;
  EXPECT_NE(m.find("Set train.device: cpu and dist.backend: gloo"), std::string::npos) << m;
  m = refusal("cpu", "nccl", kCpuBuild);
  EXPECT_NE(m.find("dist.backend: nccl, but this batchdist is a CPU-only build"), std::string::npos) << m;
  m = refusal("cpu", "nccl", kNoGpu);
  EXPECT_NE(m.find("dist.backend: nccl, but no GPU is visible"), std::string::npos) << m;
  m = refusal("cpu", "nccl", kTwoGpus);
  EXPECT_NE(m.find("dist.backend: nccl needs a GPU per rank, but train.device: cpu"), std::string::npos) << m;
}

TEST(Device, MoreLocalRanksThanGpusIsRefused) {
  for (const char* device : {"auto", "cuda"}) {
    const auto m = refusal(device, "auto", kTwoGpus, 3);
    EXPECT_NE(m.find("host h runs 3 ranks but this rank sees only 2 GPU(s)"), std::string::npos) << m;
    EXPECT_NE(m.find("start at most one rank per GPU"), std::string::npos) << m;
    EXPECT_NE(m.find("set dist.backend: gloo to share the GPUs"), std::string::npos) << m;
  }
  const auto m = refusal("cuda", "nccl", kTwoGpus, 3);
  EXPECT_NE(m.find("host h runs 3 ranks but this rank sees only 2 GPU(s)"), std::string::npos) << m;
}

// Note [ranks sharing a GPU]: over gloo or mpi, ranks share the GPUs round-robin.
TEST(Device, RanksShareTheGpusOverGlooOrMpi) {
  const GpuInventory one{true, 1, ""};
  for (const char* backend : {"gloo", "mpi"}) {
    for (const char* device : {"auto", "cuda"}) {
      EXPECT_EQ(chooseDevice(config(device, backend), one, "h", 1, 2), at::Device("cuda:0"))
          << device << " " << backend;
    }
    EXPECT_EQ(chooseDevice(config("cuda", backend), kTwoGpus, "h", 2, 3), at::Device("cuda:0"));
    EXPECT_EQ(chooseDevice(config("cuda", backend), kTwoGpus, "h", 1, 3), at::Device("cuda:1"));
  }
}

TEST(Device, ProbeMatchesTheBuild) {
  const auto g = probeGpus("thishost");
  EXPECT_EQ(g.cuda_build, batchdist::compat::kCudaBuild);
  if (g.count == 0) {
    EXPECT_NE(g.none_reason.find(g.cuda_build ? "no GPU is visible on host thishost"
                                              : "CPU-only build"),
              std::string::npos)
        << g.none_reason;
  }
}

// Note [host blas]
using batchdist::worker::blasLine;
using batchdist::worker::configureHostBlas;
using batchdist::worker::describeBlas;

TEST(HostBlas, DebiansReferenceAlternativeIsReportedWithWhatToInstall) {
  const auto b = describeBlas("/usr/lib/x86_64-linux-gnu/blas/libblas.so.3", "", -1);
  EXPECT_TRUE(b.reference);
  EXPECT_EQ(b.name, "reference BLAS");
  const auto line = blasLine(b);
  EXPECT_EQ(line.rfind("warning: ", 0), 0u) << line;
  EXPECT_NE(line.find("/usr/lib/x86_64-linux-gnu/blas/libblas.so.3"), std::string::npos) << line;
  EXPECT_NE(line.find("apt-get install libopenblas0-openmp"), std::string::npos) << line;
}

TEST(HostBlas, OpenBlasIsNamedWithVersionAndThreading) {
  const auto b = describeBlas("/usr/lib/x86_64-linux-gnu/openblas-openmp/libblas.so.3",
                              "OpenBLAS 0.3.21 DYNAMIC_ARCH NO_AFFINITY Haswell MAX_THREADS=64", 2);
  EXPECT_FALSE(b.reference);
  EXPECT_EQ(b.name, "OpenBLAS 0.3.21 (OpenMP)");
  EXPECT_EQ(blasLine(b), "cpu: matrix products by OpenBLAS 0.3.21 (OpenMP)");
  auto pooled = describeBlas("/x/openblas-pthread/libblas.so.3", "OpenBLAS 0.3.21 Haswell", 1);
  pooled.capped_threads = 1;
  EXPECT_EQ(blasLine(pooled), "cpu: matrix products by OpenBLAS 0.3.21 (pthreads), its thread pool capped at 1");
}

TEST(HostBlas, OtherLibrariesAreNamedByFileAndUnknownSaysNothing) {
  const auto mkl = describeBlas("/opt/intel/lib/libmkl_rt.so.2", "", -1);
  EXPECT_FALSE(mkl.reference);
  EXPECT_EQ(mkl.name, "libmkl_rt.so.2");
  EXPECT_EQ(blasLine(describeBlas("", "", -1)), "");
  // Only Debian's alternatives directory marks the reference build.
  EXPECT_FALSE(describeBlas("/usr/lib/libblas.so.3", "", -1).reference);
}

TEST(HostBlas, ProbeOfThisProcessFindsTheLibraryItNames) {
  const auto b = configureHostBlas(1);
  if (b.name.empty()) {
    // LibTorch with its BLAS linked in statically (pip wheels: MKL) exports no sgemm_.
    EXPECT_TRUE(b.path.empty());
  } else {
    EXPECT_FALSE(b.path.empty());
    EXPECT_TRUE(std::filesystem::exists(b.path)) << b.path;
  }
  // Debian's libtorch links libblas.so.3 dynamically: there the probe must find it.
  if (batchdist::compat::torchVersion().rfind("1.13", 0) == 0) {
    EXPECT_FALSE(b.name.empty());
  }
}

// Note [cudnn benchmark]: on for training on CUDA (it is a process-wide flag, set
// here without a GPU), said on the console; train.cudnn_benchmark: false keeps
// it off; a CPU run leaves it alone and says nothing.
TEST(CudnnBenchmark, OnForTrainingOnCudaOnly) {
  auto& ctx = at::globalContext();
  const bool before = ctx.benchmarkCuDNN();
  ctx.setBenchmarkCuDNN(false);
  const auto cfg = parseConfig("model: {name: cnn}", "t.yaml");
  EXPECT_EQ(tuneConvolutionsForTraining(cfg, at::Device(at::kCPU)), "");
  EXPECT_FALSE(ctx.benchmarkCuDNN());
  const auto line = tuneConvolutionsForTraining(cfg, at::Device(at::kCUDA, 0));
  EXPECT_TRUE(ctx.benchmarkCuDNN());
  EXPECT_NE(line.find("benchmark mode on for training (off during the batch search"), std::string::npos) << line;
  const auto off = parseConfig("model: {name: cnn}\ntrain: {cudnn_benchmark: false}", "t.yaml");
  EXPECT_NE(tuneConvolutionsForTraining(off, at::Device(at::kCUDA, 0)).find("train.cudnn_benchmark: false"),
            std::string::npos);
  EXPECT_FALSE(ctx.benchmarkCuDNN());
  ctx.setBenchmarkCuDNN(before);
}
