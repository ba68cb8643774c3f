#include "worker/model/flops.h"

#include <ATen/Context.h>
#include <ATen/record_function.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <iomanip>
#include <sstream>
#include <vector>

#include "common/error.h"

namespace batchdist::worker {

double Yardstick::mfu(double samples_per_s) const {
  if (!known() || samples_per_s <= 0) return -1;
  return samples_per_s * flops_per_sample / (peak_flops * static_cast<double>(std::max<int64_t>(1, ranks)));
}

std::string mfuText(double mfu) {
  if (mfu < 0) return "";
  std::ostringstream out;
  out << std::fixed << std::setprecision(mfu < 0.1 ? 2 : 1) << 100 * mfu << " %";
  return out.str();
}

namespace {

thread_local double* counted = nullptr;  ///< the running countForwardFlops's sum

/// What a call's start saw of its operands (the inputs are read there only: by
/// its end, LibTorch 2.x no longer holds them): FLOPs per output element.
struct CallFlops : at::ObserverContext {
  double per_output = 0;
};

const at::Tensor* tensorAt(c10::ArrayRef<const c10::IValue> in, std::size_t i) {
  return i < in.size() && in[i].isTensor() ? &in[i].toTensor() : nullptr;
}

/// Each output element of out = a @ b takes a's inner size in multiply-adds;
/// a convolution's, weight.numel() / its output channels (a transposed one's:
/// per input element, counted here whole).
std::unique_ptr<at::ObserverContext> onStart(const at::RecordFunction& fn) {
  if (!counted) return nullptr;
  const char* name = fn.name();
  const auto in = fn.inputs();
  const auto inner = [&](std::size_t a) -> double {
    const at::Tensor* t = tensorAt(in, a);
    return t && t->dim() > 0 ? 2.0 * static_cast<double>(t->size(-1)) : 0.0;
  };
  auto ctx = std::make_unique<CallFlops>();
  if (!std::strcmp(name, "aten::mm") || !std::strcmp(name, "aten::bmm")) {
    ctx->per_output = inner(0);
  } else if (!std::strcmp(name, "aten::addmm") || !std::strcmp(name, "aten::baddbmm")) {
    ctx->per_output = inner(1);
  } else if (!std::strcmp(name, "aten::convolution")) {
    const at::Tensor* input = tensorAt(in, 0);
    const at::Tensor* weight = tensorAt(in, 1);
    if (!input || !weight || weight->dim() < 3) return nullptr;
    const double per = 2.0 * static_cast<double>(weight->numel()) / static_cast<double>(weight->size(0));
    if (in.size() > 6 && in[6].isBool() && in[6].toBool()) {  // transposed
      *counted += per * static_cast<double>(input->numel());
      return nullptr;
    }
    ctx->per_output = per;
  } else {
    return nullptr;
  }
  return ctx;
}

void onEnd(const at::RecordFunction& fn, at::ObserverContext* ctx) {
  if (!counted || !ctx) return;
  const auto& outs = fn.outputs();
  if (outs.empty() || !outs[0].isTensor()) return;
  *counted += static_cast<CallFlops*>(ctx)->per_output * static_cast<double>(outs[0].toTensor().numel());
}

}  // namespace

double countForwardFlops(const std::function<void()>& forward) {
  double flops = 0;
  counted = &flops;
  const auto handle = at::addThreadLocalCallback(
      at::RecordFunctionCallback(onStart, onEnd).needsInputs(true).needsOutputs(true));
  try {
    forward();
  } catch (...) {
    at::removeCallback(handle);
    counted = nullptr;
    throw;
  }
  at::removeCallback(handle);
  counted = nullptr;
  return flops;
}

double gptTrainingFlopsPerSample(int64_t params_without_position, int64_t layers, int64_t heads,
                                 int64_t embed, int64_t tokens) {
  const double t = static_cast<double>(tokens);
  const double per_token = 6.0 * static_cast<double>(params_without_position) +
                           12.0 * static_cast<double>(layers) * static_cast<double>(embed) * t;
  return per_token * t;  // 12 L H Q T with H Q = embed
}

namespace {

/// Dense TFLOP/s by NVIDIA's data sheets: bf16/fp16 tensor cores, TF32, plain FP32.
struct GpuPeak {
  const char* name;  ///< matched in the CUDA device name; the more specific first
  double half, tf32, fp32;
  bool bf16 = true;  ///< Volta and Turing have fp16 tensor cores only
};

const GpuPeak kGpuPeaks[] = {
    {"GB200", 2500, 1250, 80},      {"B200", 2250, 1125, 75},       {"B100", 1750, 875, 60},
    {"GH200", 989.4, 494.7, 66.9},  {"H200", 989.4, 494.7, 66.9},   {"H100 PCIe", 756, 378, 51.2},
    {"H100 NVL", 835, 417.5, 60},   {"H100", 989.4, 494.7, 66.9},   {"H800", 989.4, 494.7, 66.9},
    {"H20", 148, 74, 44},           {"A100", 312, 156, 19.5},       {"A800", 312, 156, 19.5},
    {"A30", 165, 82, 10.3},         {"A40", 149.7, 74.8, 37.4},     {"A10", 125, 62.5, 31.2},
    {"L40S", 362.05, 183, 91.6},    {"L40", 181, 90.5, 90.5},       {"L4", 121, 60, 30.3},
    {"V100", 125, 0, 15.7, false},  {"T4", 65, 0, 8.1, false},
};

/// Whether `device_name` has `model` as a word of its own: "NVIDIA A100-SXM4-80GB"
/// names A100, "NVIDIA RTX A1000" does not, nor "NVIDIA L40S" L4.
bool namesModel(const std::string& device_name, const std::string& model) {
  for (auto at = device_name.find(model); at != std::string::npos; at = device_name.find(model, at + 1)) {
    const std::size_t end = at + model.size();
    const bool starts = at == 0 || device_name[at - 1] == ' ';
    const bool ends = end == device_name.size() || device_name[end] == ' ' || device_name[end] == '-';
    if (starts && ends) return true;
  }
  return false;
}

}  // namespace

double tablePeakTflops(const std::string& device_name, const std::string& precision, bool tf32) {
  for (const auto& g : kGpuPeaks) {
    if (!namesModel(device_name, g.name)) continue;
    if (precision == "fp16") return g.half;
    if (precision == "bf16") return g.bf16 ? g.half : 0;
    return tf32 && g.tf32 > 0 ? g.tf32 : g.fp32;
  }
  return 0;
}

double measureCpuGemmFlops(const std::string& precision) {
  torch::NoGradGuard no_grad;
  constexpr int64_t n = 512;
  const auto dtype = precision == "bf16" ? torch::kBFloat16 : torch::kFloat;
  // Not randn: the run's generators are seeded already, and a measurement must not move them.
  const auto a = torch::full({n, n}, 0.5, dtype), b = torch::full({n, n}, 0.25, dtype);
  std::vector<double> seconds;
  for (int i = 0; i < 6; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    const auto c = torch::mm(a, b);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (i > 0) seconds.push_back(s);  // the first warms up
  }
  std::nth_element(seconds.begin(), seconds.begin() + seconds.size() / 2, seconds.end());
  return 2.0 * n * n * n / std::max(seconds[seconds.size() / 2], 1e-9);
}

Yardstick yardstickFor(double flops_per_sample, const TrainConfig& train, bool cuda,
                       const std::string& cuda_name, int64_t ranks, bool convolutional) {
  Yardstick y;
  y.flops_per_sample = flops_per_sample;
  y.ranks = ranks;
  const std::string precision = toString(train.precision);
  if (train.peak_tflops > 0) {
    y.peak_flops = train.peak_tflops * 1e12;
    y.peak_source = "train.peak_tflops";
  } else if (cuda) {
    // fp32 products on TF32 tensor cores where allowed: cuBLAS's matmuls (off by
    // default), cuDNN's convolutions (on by default).
    const bool tf32 = at::globalContext().allowTF32CuBLAS() ||
                      (convolutional && at::globalContext().allowTF32CuDNN());
    y.peak_flops = tablePeakTflops(cuda_name, precision, tf32) * 1e12;
    y.peak_source = y.peak_flops > 0 ? strCat("table: ", cuda_name, ", ", precision,
                                              precision == "fp32" ? (tf32 ? " (TF32)" : " (no TF32)") : "",
                                              " dense")
                                     : strCat(cuda_name, " is not in the table; set train.peak_tflops");
  } else if (flops_per_sample > 0) {
    y.peak_flops = measureCpuGemmFlops(precision);
    y.peak_source = strCat("measured: a ", precision, " GEMM of 512 on ", at::get_num_threads(),
                           " thread(s) of this CPU");
  }
  return y;
}

std::string yardstickLine(const Yardstick& y) {
  if (y.flops_per_sample <= 0) {
    return "mfu: not shown: the model's FLOPs are unknown (a TorchScript module gives them as "
           "model.flops_per_sample; a program model's are not counted)";
  }
  std::ostringstream out;
  out << std::setprecision(3) << "mfu: " << y.flops_per_sample / 1e9
      << " GFLOP a sample (forward and backward), ";
  if (y.peak_flops <= 0) {
    out << "no MFU: " << y.peak_source;
  } else {
    out << "peak " << y.peak_flops / 1e12 << " TFLOP/s a device (" << y.peak_source << ")";
  }
  return out.str();
}

}  // namespace batchdist::worker
