#pragma once
// Note [torch compat], device half: CUDA devices, memory, streams, autocast and
// the attention kernel (and torch::optim's state keys, the fused optimizer steps) across LibTorch 1.13 (Debian, CPU-only) and 2.x (pip
// wheel, CUDA). Every function compiles in both; in a CPU build the CUDA ones
// are no-ops, return 0, or say that the build is CPU-only. The c10d half is collective/torch_compat.h.

#include <torch/version.h>

#if defined(BATCHDIST_WITH_CUDA)
#include <ATen/Context.h>
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#endif

#include <ATen/Functions.h>
#include <ATen/autocast_mode.h>
#include <ATen/core/Tensor.h>

#include <cmath>
#include <cstdlib>
#include <limits>
#include <mutex>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <type_traits>

namespace batchdist::compat {

/// True when this batchdist was built against a LibTorch with CUDA.
#if defined(BATCHDIST_WITH_CUDA)
constexpr bool kCudaBuild = true;
#else
constexpr bool kCudaBuild = false;
#endif

/// "major.minor" of a CUDA version number as the runtime reports it (13000 -> "13.0").
inline std::string cudaVersionText(int v) {
  return std::to_string(v / 1000) + "." + std::to_string((v % 1000) / 10);
}

/// The CUDA runtime this process loaded, e.g. "13.0"; "" in a CPU build.
inline std::string cudaRuntimeVersion() {
#if defined(BATCHDIST_WITH_CUDA)
  int v = 0;
  if (cudaRuntimeGetVersion(&v) == cudaSuccess && v > 0) return cudaVersionText(v);
  return "unknown";
#else
  return "";
#endif
}

/// CUDA devices this process can use: 0 in a CPU build, without a driver, or
/// with every device hidden by CUDA_VISIBLE_DEVICES. Never throws, prints nothing.
inline int visibleGpuCount() {
#if defined(BATCHDIST_WITH_CUDA)
  return static_cast<int>(c10::cuda::device_count());
#else
  return 0;
#endif
}

/// Why visibleGpuCount() is 0, for an error message: names the build, the
/// driver or CUDA_VISIBLE_DEVICES, whichever hides the GPUs.
inline std::string whyNoGpu(const std::string& host) {
#if defined(BATCHDIST_WITH_CUDA)
  std::string why = "no GPU is visible on host " + host + ": ";
  const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
  int driver = 0;
  if (cudaDriverGetVersion(&driver) != cudaSuccess) driver = 0;
  if (driver == 0) {
    why += "no NVIDIA driver is installed (libcuda.so.1 not found)";
  } else if (visible != nullptr) {
    why += "CUDA_VISIBLE_DEVICES='" + std::string(visible) + "' leaves none of them";
  } else {
    why += "the NVIDIA driver (CUDA " + cudaVersionText(driver) + ") reports no CUDA device";
  }
  return why + " (this build: LibTorch " + TORCH_VERSION + " with CUDA " + cudaRuntimeVersion() +
         ")";
#else
  (void)host;
  return std::string("this batchdist is a CPU-only build (LibTorch ") + TORCH_VERSION +
         " without CUDA)";
#endif
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
  const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(
      static_cast<c10::DeviceIndex>(index));
  return static_cast<double>(stats.allocated_bytes[0].peak);
#else
  (void)index;
  return 0;
#endif
}

inline void cudaResetPeak(int index) {
#if defined(BATCHDIST_WITH_CUDA)
  c10::cuda::CUDACachingAllocator::resetPeakStats(static_cast<c10::DeviceIndex>(index));
#else
  (void)index;
#endif
}

inline double cudaTotalBytes(int index) {
#if defined(BATCHDIST_WITH_CUDA)
  return static_cast<double>(
      at::cuda::getDeviceProperties(static_cast<c10::DeviceIndex>(index))->totalGlobalMem);
#else
  (void)index;
  return 0;
#endif
}

inline std::string cudaDeviceName(int index) {
#if defined(BATCHDIST_WITH_CUDA)
  return at::cuda::getDeviceProperties(static_cast<c10::DeviceIndex>(index))->name;
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

/// The default CPU generator's state (dropout and every other random op on CPU
/// tensors), read under the generator's mutex.
inline at::Tensor cpuRngState() {
  at::Generator gen = at::globalContext().defaultGenerator(at::kCPU);
  std::lock_guard<std::mutex> lock(gen.mutex());
  return gen.get_state();
}

/// Restores a state taken by cpuRngState().
inline void setCpuRngState(const at::Tensor& state) {
  at::Generator gen = at::globalContext().defaultGenerator(at::kCPU);
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_state(state);
}

/// Note [cuda rng]: the state of `device`'s default CUDA generator (dropout and
/// every other random kernel on that GPU), as a uint8 CPU tensor: Philox's seed
/// and offset, 16 bytes in LibTorch 1.13 and 2.x alike (the generic
/// at::Generator calls, no CUDA generator header). An empty tensor for a CPU
/// device or in a CPU build. The generator's mutex is held while it is read.
inline at::Tensor cudaRngState(const at::Device& device) {
#if defined(BATCHDIST_WITH_CUDA)
  if (device.is_cuda()) {
    at::Generator gen = at::globalContext().defaultGenerator(device);
    std::lock_guard<std::mutex> lock(gen.mutex());
    return gen.get_state();
  }
#endif
  (void)device;
  return at::empty({0}, at::TensorOptions().dtype(at::kByte));
}

/// Restores a state taken by cudaRngState() into `device`'s default CUDA
/// generator. Returns false (nothing done) for a CPU device, a CPU build or an
/// empty state; the generator itself throws on a state of the wrong size.
inline bool setCudaRngState(const at::Device& device, const at::Tensor& state) {
#if defined(BATCHDIST_WITH_CUDA)
  if (device.is_cuda() && state.numel() > 0) {
    at::Generator gen = at::globalContext().defaultGenerator(device);
    std::lock_guard<std::mutex> lock(gen.mutex());
    gen.set_state(state);
    return true;
  }
#endif
  (void)device;
  (void)state;
  return false;
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

/// Whether autocast is on for a device type, and its low-precision dtype: what
/// the recompute of Note [activation recompute] (worker/model/recompute.h) sets
/// again in backward. (LibTorch 2.4 made the per-device getters generic.)
inline bool autocastEnabled(at::DeviceType type) {
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
  return at::autocast::is_autocast_enabled(type);
#else
  return type == at::kCUDA ? at::autocast::is_enabled() : at::autocast::is_cpu_enabled();
#endif
}

inline at::ScalarType autocastDtype(at::DeviceType type) {
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
  return at::autocast::get_autocast_dtype(type);
#else
  return type == at::kCUDA ? at::autocast::get_autocast_gpu_dtype()
                           : at::autocast::get_autocast_cpu_dtype();
#endif
}

/// Note [causal attention]: softmax(q kᵀ / sqrt(d) + causal mask) v for q, k, v
/// of [N, H, T, D], with dropout on the attention weights. LibTorch 2.x has
/// at::scaled_dot_product_attention (a fused kernel: flash or memory-efficient
/// on CUDA, no T x T matrix kept for backward); 1.13 has only the private
/// _scaled_dot_product_attention, so it computes the product explicitly. 2.1
/// added `scale` and 2.5 `enable_gqa` after is_causal, both defaulted: the six
/// arguments below compile on every 2.x. `dropout_p` is applied whenever it is
/// > 0 (neither path looks at a training flag): the caller passes 0 outside
/// training.
constexpr bool kHasFusedAttention = TORCH_VERSION_MAJOR >= 2;

/// The explicit formulation, in every release: the reference the fused kernel
/// is tested against, and the path on 1.13. q·kᵀ/sqrt(D), -inf above the
/// diagonal (query i sees keys 0..i), softmax, dropout, ·v. The scale and the
/// mask are applied in place on the [N, H, T, T] scores: neither matmul's nor
/// their own backward reads the scores, so autograd allows it, the result is
/// the same bits as out of place, and two T x T tensors a layer are not made.
inline at::Tensor causalAttentionExplicit(const at::Tensor& q, const at::Tensor& k,
                                          const at::Tensor& v, double dropout_p) {
  const double scale = 1.0 / std::sqrt(static_cast<double>(q.size(-1)));
  auto scores = at::matmul(q, k.transpose(-2, -1));
  scores.mul_(scale);
  const auto future = at::ones({q.size(-2), k.size(-2)}, q.options().dtype(at::kBool)).triu(1);
  scores.masked_fill_(future, -std::numeric_limits<double>::infinity());
  auto weights = at::softmax(scores, -1);
  if (dropout_p > 0) weights = at::dropout(weights, dropout_p, /*train=*/true);
  return at::matmul(weights, v);
}

/// Causal self-attention (Note [causal attention]): the fused kernel where the
/// LibTorch has one, else the explicit product.
inline at::Tensor causalAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                  double dropout_p) {
#if TORCH_VERSION_MAJOR >= 2
  return at::scaled_dot_product_attention(q, k, v, /*attn_mask=*/{}, dropout_p,
                                          /*is_causal=*/true);
#else
  return causalAttentionExplicit(q, k, v, dropout_p);
#endif
}

/// torch::optim keeps a parameter's state in a map keyed by the parameter's
/// TensorImpl: its address as text on 1.13 (c10::guts::to_string), the pointer on
/// 2.x. The key type is read off the map, so every release in between compiles.
template <typename StateMap>
typename StateMap::key_type optimizerStateKey(const StateMap&, const at::Tensor& param) {
  using Key = typename StateMap::key_type;
  if constexpr (std::is_same_v<Key, std::string>) {
    std::ostringstream text;  // what c10::guts::to_string writes
    text << param.unsafeGetTensorImpl();
    return text.str();
  } else {
    return param.unsafeGetTensorImpl();
  }
}

// Note [fused optimizer steps]: LibTorch 2.4 and later have one-kernel sgd and
// adamw steps over a list of tensors (at::_fused_sgd_, at::_fused_adamw_) for
// CUDA and the CPU; earlier releases (1.13 among them) have them on CUDA only
// from 2.0/2.2, or not at all. batchdist takes them from 2.4 on, where both
// devices have both, and elsewhere steps by the multi-tensor ops (Note
// [multi-tensor step] in worker/model/optimizer.cc). The calls below compile in
// every release and throw where the kernels are missing.
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
constexpr bool kHasFusedOptimizerSteps = true;
#else
constexpr bool kHasFusedOptimizerSteps = false;
#endif

/// torch.optim.SGD(fused=True)'s step: weight decay, momentum (buffers given;
/// `first_step`: set them to this step's direction), nesterov, lr.
inline void fusedSgdStep(at::TensorList params, at::TensorList grads, at::TensorList momentum,
                         double weight_decay, double momentum_factor, double lr, double dampening,
                         bool nesterov, bool first_step) {
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
  at::_fused_sgd_(params, grads, momentum, weight_decay, momentum_factor, lr, dampening, nesterov,
                  /*maximize=*/false, first_step);
#else
  (void)params, (void)grads, (void)momentum, (void)weight_decay, (void)momentum_factor, (void)lr,
      (void)dampening, (void)nesterov, (void)first_step;
  throw std::runtime_error("this LibTorch has no fused sgd step (2.4 or later has)");
#endif
}

/// torch.optim.AdamW(fused=True)'s step. `steps`: each tensor's step count after
/// this step, as float scalars on the tensors' device.
inline void fusedAdamwStep(at::TensorList params, at::TensorList grads, at::TensorList exp_avg,
                           at::TensorList exp_avg_sq, at::TensorList steps, double lr,
                           double beta1, double beta2, double weight_decay, double eps) {
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
  at::_fused_adamw_(params, grads, exp_avg, exp_avg_sq, /*max_exp_avg_sqs=*/{}, steps, lr, beta1,
                    beta2, weight_decay, eps, /*amsgrad=*/false, /*maximize=*/false);
#else
  (void)params, (void)grads, (void)exp_avg, (void)exp_avg_sq, (void)steps, (void)lr, (void)beta1,
      (void)beta2, (void)weight_decay, (void)eps;
  throw std::runtime_error("this LibTorch has no fused adamw step (2.4 or later has)");
#endif
}

}  // namespace batchdist::compat
