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

// Note [cudnn benchmark]: cuDNN's benchmark mode times every convolution
// algorithm the first time it meets an input shape and keeps the fastest. It is
// on for training once the per-GPU batch is fixed, and off during the batch
// search: every candidate is a new shape, so each would pay the tuning in its
// first steps, by an amount that depends on the shape, and the search would rank
// candidates partly by how their tuning happened to fall in its untimed warm-up
// steps; off, every candidate runs cuDNN's heuristic choice alike. The chosen
// batch is then tuned once, in training's first step (train.cudnn_benchmark:
// false keeps the heuristic: e.g. for inputs whose shape changes every step).
// Two costs: the algorithms it picks may take larger workspaces than the
// heuristic's the search measured, which the memory fraction's headroom has to
// hold; and the choice is timed, so two runs (a resumed one, say) may pick
// different algorithms and round differently: set it false where a resumed run
// must train bitwise as the uninterrupted one.
/// Sets cuDNN's benchmark mode for training on `device` (Note [cudnn
/// benchmark]) and returns the console line that says so; on the CPU nothing,
/// and "".
std::string tuneConvolutionsForTraining(const worker::Config& cfg, const at::Device& device);

/// Note [host blas]: on the CPU, LibTorch's matrix products (Linear, the
/// im2col convolutions of a CPU build without oneDNN) call `sgemm_` of whatever
/// BLAS the dynamic linker found. Debian's libtorch links the alternative
/// libblas.so.3, which is the unoptimised reference BLAS unless an optimised one
/// is installed: bench/vs_ddp.sh's MLP trained at 2.7k samples/s on it and at
/// ~50k with libopenblas0-openmp on the same 2 cores. A run cannot fix that, so
/// rank 0 says which BLAS it got and warns about the reference one. OpenBLAS
/// built with pthreads keeps its own pool of one thread per core in every rank,
/// which oversubscribes the host; it is capped at the rank's threads.
struct HostBlas {
  std::string name;        ///< "OpenBLAS 0.3.21 (OpenMP)", "reference BLAS", ... ; empty: no sgemm_ exported
  std::string path;        ///< the file that provides sgemm_ (links resolved)
  bool reference = false;  ///< the netlib reference implementation
  int capped_threads = 0;  ///< > 0: OpenBLAS's own thread pool was set to this
};

/// What the probe learnt, as a pure function (tests/device_test.cc): `path` the
/// resolved library file; `openblas_config` openblas_get_config() or empty when
/// it is not OpenBLAS; `openblas_parallel` openblas_get_parallel() (0 serial,
/// 1 pthreads, 2 OpenMP).
HostBlas describeBlas(const std::string& path, const std::string& openblas_config,
                      int openblas_parallel);

/// Finds the BLAS in this process: the library that serves sgemm_ (dladdr), and
/// OpenBLAS's own functions looked up in that library and its dependencies only,
/// since OpenBLAS can be loaded (as Debian's liblapack.so.3) while sgemm_ comes
/// from the reference libblas.so.3. Caps an OpenBLAS pthread pool at `threads`.
/// Never throws.
HostBlas configureHostBlas(int threads);

/// The line rank 0 prints, empty when there is nothing to say; a warning for the
/// reference BLAS says what to install.
std::string blasLine(const HostBlas& blas);

}  // namespace batchdist::worker
