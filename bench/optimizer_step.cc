// Benchmark, not a test: batchdist's optimizer step (Note [multi-tensor step],
// worker/model/optimizer.cc) per tensor, multi-tensor and fused (where this
// LibTorch has the kernels), against torch::optim's per-parameter step, the
// baseline, on the parameter shapes of GPT-2 small (148 tensors: adamw) and of a
// ResNet-50-like stack (161 tensors: sgd with momentum; lars, against its own
// per-tensor step), divided in width by SCALE so a CPU run stays short. The steps
// are interleaved (the order reversed every round), repeated, and each median
// reported with its ratio to the baseline's (above 1: faster than the baseline).
//
//   build/bench/batchdist_optimizer_step [SCALE=4] [REPEATS=15] [cpu|cuda]
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "worker/model/optimizer.h"

using namespace batchdist::worker;

namespace {

using Shapes = std::vector<std::vector<int64_t>>;

Shapes gpt2Small(int64_t s) {
  const int64_t d = 768 / s, vocab = 50257 / s, ctx = 1024;
  Shapes out{{vocab, d}, {ctx, d}};
  for (int layer = 0; layer < 12; ++layer) {
    const Shapes block{{d}, {d}, {d, 3 * d}, {3 * d}, {d, d}, {d}, {d}, {d}, {d, 4 * d}, {4 * d},
                       {4 * d, d}, {d}};
    out.insert(out.end(), block.begin(), block.end());
  }
  out.push_back({d});
  out.push_back({d});
  return out;  // 148
}

Shapes resnetLike(int64_t s) {
  Shapes out{{64 / s, 3, 7, 7}, {64 / s}, {64 / s}};
  const int64_t widths[] = {64, 128, 256, 512};
  const int blocks[] = {3, 4, 6, 3};
  int64_t in = 64 / s;
  for (int stage = 0; stage < 4; ++stage) {
    const int64_t w = widths[stage] / s, outw = 4 * w;
    for (int b = 0; b < blocks[stage]; ++b) {
      for (const auto& conv : Shapes{{w, in, 1, 1}, {w, w, 3, 3}, {outw, w, 1, 1}}) {
        out.push_back(conv);
        out.push_back({conv[0]});  // BatchNorm weight
        out.push_back({conv[0]});  // and bias
      }
      if (b == 0) {
        out.push_back({outw, in, 1, 1});
        out.push_back({outw});
        out.push_back({outw});
      }
      in = outw;
    }
  }
  out.push_back({1000, in});
  out.push_back({1000});
  return out;  // 161
}

std::vector<torch::Tensor> make(const Shapes& shapes, torch::Device device) {
  std::vector<torch::Tensor> out;
  for (const auto& s : shapes) {
    auto t = torch::randn(s, torch::TensorOptions().device(device)).requires_grad_();
    t.mutable_grad() = torch::randn(s, torch::TensorOptions().device(device));
    out.push_back(t);
  }
  return out;
}

double seconds(const std::function<void()>& step, torch::Device device) {
  const auto t0 = std::chrono::steady_clock::now();
  step();
  if (device.is_cuda()) torch::cuda::synchronize();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

double median(std::vector<double> v) {
  std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
  return v[v.size() / 2];
}

/// Times `baseline` against batchdist's step under each of optim.kernels'
/// per_tensor, multi_tensor and fused (fused where this LibTorch has the kernels).
void compare(const char* name, const Shapes& shapes, OptimConfig cfg,
             const std::function<void()>& baseline, const char* baseline_name, int repeats,
             torch::Device device) {
  std::vector<StepKernels> kernels{StepKernels::kPerTensor, StepKernels::kMultiTensor};
  if (resolveStepKernels(StepKernels::kFused, device.is_cuda()) == StepKernels::kFused) {
    kernels.push_back(StepKernels::kFused);
  }
  std::vector<std::vector<torch::Tensor>> params;
  std::vector<std::unique_ptr<Optimizer>> opts;
  std::vector<std::function<void()>> steps{baseline};
  for (const auto k : kernels) {
    cfg.kernels = k;
    params.push_back(make(shapes, device));
    opts.push_back(makeOptimizer(cfg, params.back()));
    steps.push_back([&, i = opts.size() - 1] { opts[i]->step(cfg.lr); });
  }
  std::vector<std::vector<double>> t(steps.size());
  for (int r = -2; r < repeats; ++r) {  // two warm-up rounds: the state is made on the first step
    for (std::size_t k = 0; k < steps.size(); ++k) {
      const std::size_t i = r % 2 == 0 ? k : steps.size() - 1 - k;  // the order alternates
      const double s = seconds(steps[i], device);
      if (r >= 0) t[i].push_back(s);
    }
  }
  int64_t n = 0;
  for (const auto& p : params.front()) n += p.numel();
  const double base = median(t[0]);
  std::printf("%-6s %3zu tensors %6.1f M params: %s %8.3f ms", name, shapes.size(), n / 1e6,
              baseline_name, 1e3 * base);
  for (std::size_t k = 0; k < kernels.size(); ++k) {
    const double m = median(t[k + 1]);
    std::printf("; %s %8.3f ms (%.2fx)", toString(kernels[k]), 1e3 * m, base / m);
  }
  std::printf("; median of %d\n", repeats);
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t scale = argc > 1 ? std::atoll(argv[1]) : 4;
  const int repeats = argc > 2 ? std::atoi(argv[2]) : 15;
  const torch::Device device(argc > 3 && std::string(argv[3]) == "cuda" ? torch::kCUDA : torch::kCPU);
  torch::manual_seed(0);
  torch::NoGradGuard no_grad;
  std::printf("optimizer step, width / %lld, %s, torch threads %d\n", static_cast<long long>(scale),
              device.str().c_str(), torch::get_num_threads());

  OptimConfig adamw;
  adamw.name = OptimName::kAdamw;
  adamw.lr = 1e-3;
  adamw.weight_decay = 0.1;
  const auto gpt = gpt2Small(scale);
  auto gpt_base = make(gpt, device);
  torch::optim::AdamW gpt_torch(gpt_base,
                                torch::optim::AdamWOptions(adamw.lr).weight_decay(adamw.weight_decay));
  compare("adamw", gpt, adamw, [&] { gpt_torch.step(); }, "torch::optim", repeats, device);

  OptimConfig sgd;
  sgd.lr = 0.1;
  sgd.momentum = 0.9;
  sgd.weight_decay = 5e-5;
  const auto resnet = resnetLike(scale);
  auto resnet_base = make(resnet, device);
  torch::optim::SGD resnet_torch(
      resnet_base, torch::optim::SGDOptions(sgd.lr).momentum(sgd.momentum).weight_decay(sgd.weight_decay));
  compare("sgd", resnet, sgd, [&] { resnet_torch.step(); }, "torch::optim", repeats, device);

  // LARS: torch::optim has none; the baseline is batchdist's own per-tensor step.
  OptimConfig lars = sgd;
  lars.name = OptimName::kLars;
  lars.kernels = StepKernels::kPerTensor;
  auto lars_base = make(resnet, device);
  auto lars_each = makeOptimizer(lars, lars_base);
  compare("lars", resnet, lars, [&] { lars_each->step(lars.lr); }, "per-tensor", repeats, device);
  return 0;
}
