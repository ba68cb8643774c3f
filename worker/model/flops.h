#pragma once
// Model FLOPs utilisation (Note [mfu]): what one sample costs to train, what the
// device can do, and the ratio at a rate. Pure data and arithmetic here; the
// counting forward and the CPU's measured peak are in flops.cc.

#include <cstdint>
#include <functional>
#include <string>

#include "worker/config/config.h"

namespace batchdist::worker {

// Note [mfu]
// ~~~~~~~~~~
// MFU = samples/s over all ranks x training FLOPs per sample / (ranks x the peak
// FLOP/s of one rank's device at the run's precision), as PaLM (appendix B)
// defines it: the model's FLOPs, not the hardware's (a recomputed forward is not
// counted again, so recompute lowers MFU). Shown beside samples/s and tokens/s:
// the console's progress and closing lines, metrics.jsonl, TensorBoard and
// report.json. Training FLOPs per sample:
//  - gpt: per token 6 N + 12 L H Q T (N the parameters less the position
//    embedding, as nanoGPT's estimate_mfu; L layers, H heads, Q the head width,
//    T the sample's tokens), times T;
//  - mlp, cnn, resnet: 3 x the forward's matrix products and convolutions,
//    counted from their shapes as the check forward on a sample batch runs them
//    (countForwardFlops: aten::mm, addmm, bmm, baddbmm and convolution; the
//    element-wise layers are left out, as is usual);
//  - a TorchScript module: model.flops_per_sample, else unknown.
// Frozen parameters (Note [frozen parameters]) get no weight gradients, so 3x
// overcounts a model with a frozen backbone: MFU is then an upper bound.
// The peak: train.peak_tflops when given; on CUDA a table of NVIDIA's data-centre
// GPUs' dense figures by device name and precision (fp32: the TF32 tensor-core
// figure when matmuls may use TF32, else plain FP32); on the CPU the rate of a
// short GEMM measured at start on the rank's threads, at the run's precision,
// said as "measured" (every rank measures at once, as they will train, and the
// mean is the run's). Unknown FLOPs or peak: no MFU is shown, never a guess.

/// What a run's MFU is computed from; pure data (report.json, the logs).
struct Yardstick {
  double flops_per_sample = 0;  ///< training FLOPs of one sample (0: unknown)
  double peak_flops = 0;        ///< FLOP/s of one rank's device (0: unknown)
  std::string peak_source;      ///< where peak_flops comes from, in words
  int64_t ranks = 1;
  bool known() const { return flops_per_sample > 0 && peak_flops > 0; }
  /// MFU (0..1) at `samples_per_s` over all ranks; -1 when unknown.
  double mfu(double samples_per_s) const;
};

/// The FLOPs of the matrix products and convolutions that `forward` runs on this
/// thread (Note [mfu]), counted from their operands' shapes as ATen calls them.
double countForwardFlops(const std::function<void()>& forward);

/// Note [mfu]: gpt's training FLOPs per sample of `tokens` tokens.
double gptTrainingFlopsPerSample(int64_t params_without_position, int64_t layers, int64_t heads,
                                 int64_t embed, int64_t tokens);

/// NVIDIA's dense peak of `device_name` (as CUDA names it) in TFLOP/s at
/// `precision` ("fp32", "bf16", "fp16"; `tf32`: fp32 matmuls may use TF32), or 0
/// for a device the table does not know.
double tablePeakTflops(const std::string& device_name, const std::string& precision, bool tf32);

/// FLOP/s of a square GEMM on this thread's intra-op threads at `precision`
/// (fp32, bf16): the median of a few, after a warm-up.
double measureCpuGemmFlops(const std::string& precision);

/// A run's yardstick (Note [mfu]): `flops_per_sample` (the model's), and the
/// peak of one of the `ranks` devices: train.peak_tflops, else for CUDA
/// (`cuda_name`: the device's name) the table at train.precision, else the CPU
/// GEMM measured now on this thread's intra-op threads.
/// `convolutional`: fp32 convolutions count at TF32's peak where cuDNN may use it.
Yardstick yardstickFor(double flops_per_sample, const TrainConfig& train, bool cuda,
                       const std::string& cuda_name, int64_t ranks, bool convolutional = false);

/// The console's line for it: "mfu: 1.24 GFLOP a sample (forward and backward),
/// peak 989 TFLOP/s a device (table: NVIDIA H100 80GB HBM3, bf16)", or why none.
std::string yardstickLine(const Yardstick& y);

/// "41.2 %" (or "" when mfu < 0).
std::string mfuText(double mfu);

}  // namespace batchdist::worker
