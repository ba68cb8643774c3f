// Note [mfu]: the FLOPs counted from a forward's products and convolutions, the
// GPT formula, the peak table, and MFU's arithmetic.
#include <gtest/gtest.h>
#include <ATen/Context.h>
#include <torch/torch.h>

#include <string>

#include "tests/config_errors.h"
#include "worker/config/config.h"
#include "worker/model/flops.h"
#include "worker/model/model.h"

using namespace batchdist::worker;

TEST(Flops, CountsMatrixProductsAndConvolutionsByTheirShapes) {
  torch::NoGradGuard no_grad;
  const auto a = torch::randn({5, 7}), b = torch::randn({7, 3}), bias = torch::randn({3});
  EXPECT_DOUBLE_EQ(countForwardFlops([&] { torch::mm(a, b); }), 2.0 * 5 * 7 * 3);
  EXPECT_DOUBLE_EQ(countForwardFlops([&] { torch::addmm(bias, a, b); }), 2.0 * 5 * 7 * 3);
  EXPECT_DOUBLE_EQ(countForwardFlops([&] { torch::linear(a, b.t(), bias); }), 2.0 * 5 * 7 * 3);
  const auto x = torch::randn({4, 2, 6, 5}), y = torch::randn({4, 5, 3});
  EXPECT_DOUBLE_EQ(countForwardFlops([&] { torch::matmul(x, torch::randn({5, 3})); }), 2.0 * 4 * 2 * 6 * 5 * 3);
  EXPECT_DOUBLE_EQ(countForwardFlops([&] { torch::bmm(torch::randn({4, 6, 5}), y); }), 2.0 * 4 * 6 * 5 * 3);
  // conv: [2, 3, 9, 9] by 8 filters of 3x3x3, stride 2, padding 1 -> [2, 8, 5, 5].
  const auto img = torch::randn({2, 3, 9, 9}), w = torch::randn({8, 3, 3, 3});
  EXPECT_DOUBLE_EQ(countForwardFlops([&] { torch::conv2d(img, w, torch::Tensor(), 2, 1); }), 2.0 * (2 * 8 * 5 * 5) * 27);
  // grouped (4 groups of 2 channels) and 1x1
  const auto g = torch::randn({8, 2, 1, 1});
  EXPECT_DOUBLE_EQ(countForwardFlops([&] { torch::conv2d(torch::randn({1, 8, 4, 4}), g, torch::Tensor(), at::IntArrayRef{1, 1}, at::IntArrayRef{0, 0}, at::IntArrayRef{1, 1}, 4); }),
                   2.0 * (8 * 4 * 4) * 2);
  // element-wise work is not counted; nothing is counted outside the call
  EXPECT_DOUBLE_EQ(countForwardFlops([&] { torch::relu(img) + img; }), 0.0);
  torch::mm(a, b);
  EXPECT_DOUBLE_EQ(countForwardFlops([] {}), 0.0);
}

TEST(Flops, BuiltInModelsCarryTheirTrainingFlops) {
  // mlp 12 -> 16 -> 5: 3 x 2 x (12 x 16 + 16 x 5) per sample
  auto mlp = buildModel(parseConfig("model: {name: mlp, hidden: [16], batchnorm: false}", "t.yaml").model,
                        {12}, 5);
  EXPECT_DOUBLE_EQ(mlp->trainingFlopsPerSample(), 3.0 * 2 * (12 * 16 + 16 * 5));
  // ResNet-50 at 224 x 224 (ImageNet stem): 4.1 G multiply-adds forward, as
  // usually quoted; 3 x 2 x that to train.
  auto r50 = buildModel(parseConfig("model: {name: resnet50, stem: imagenet}", "t.yaml").model,
                        {3, 224, 224}, 1000);
  EXPECT_NEAR(r50->trainingFlopsPerSample() / 1e9, 3 * 2 * 4.09, 0.3);
  // gpt: 6 N + 12 L H Q T per token (N without wpe), times T tokens
  const auto cfg = parseConfig("model: {name: gpt, layers: 2, heads: 2, embed: 32, vocab: 64, seq_len: 16}\n"
                               "data: {name: tokens, path: t.bin}",
                               "t.yaml").model;
  auto gpt = buildModel(cfg, {16}, 64);
  int64_t n = 0;
  for (const auto& [name, p] : gpt->namedParameters()) {
    if (name != "wpe.weight") n += p.numel();
  }
  EXPECT_GT(n, 0);
  EXPECT_DOUBLE_EQ(gpt->trainingFlopsPerSample(), 16.0 * (6.0 * n + 12.0 * 2 * 32 * 16));
}

TEST(Flops, TheConfigGivesATorchScriptModulesFlopsOnly) {
  using batchdist::testsupport::configError;
  const auto e = configError("model: {name: mlp, flops_per_sample: 1000}");
  EXPECT_NE(e.find("model.flops_per_sample"), std::string::npos) << e;
  EXPECT_NE(e.find("is for a torchscript module"), std::string::npos) << e;
  const auto ts = parseConfig("model: {name: torchscript, path: m.pt, flops_per_sample: 2e9}", "t.yaml");
  EXPECT_DOUBLE_EQ(ts.model.flops_per_sample, 2e9);
  EXPECT_TRUE(ts.resolved["model"].contains("flops_per_sample"));
  EXPECT_FALSE(parseConfig("model: {name: mlp}", "t.yaml").resolved["model"].contains("flops_per_sample"));
}

TEST(Flops, ThePeakTableKnowsTheDataCentreGpusByName) {
  EXPECT_DOUBLE_EQ(tablePeakTflops("NVIDIA H100 80GB HBM3", "bf16", false), 989.4);
  EXPECT_DOUBLE_EQ(tablePeakTflops("NVIDIA H100 PCIe", "bf16", false), 756);
  EXPECT_DOUBLE_EQ(tablePeakTflops("NVIDIA H200", "fp16", false), 989.4);
  EXPECT_DOUBLE_EQ(tablePeakTflops("NVIDIA A100-SXM4-80GB", "fp32", true), 156);
  EXPECT_DOUBLE_EQ(tablePeakTflops("NVIDIA A100-SXM4-80GB", "fp32", false), 19.5);
  EXPECT_DOUBLE_EQ(tablePeakTflops("NVIDIA A10", "bf16", false), 125);
  EXPECT_DOUBLE_EQ(tablePeakTflops("NVIDIA L4", "bf16", false), 121);
  EXPECT_DOUBLE_EQ(tablePeakTflops("NVIDIA L40S", "bf16", false), 362.05);
  EXPECT_DOUBLE_EQ(tablePeakTflops("Tesla V100-SXM2-16GB", "bf16", false), 0);  // no bf16 tensor cores
  EXPECT_DOUBLE_EQ(tablePeakTflops("Tesla V100-SXM2-16GB", "fp16", false), 125);
  EXPECT_DOUBLE_EQ(tablePeakTflops("NVIDIA GeForce RTX 4090", "bf16", false), 0);
  // a model's name as a word of its own, not a prefix of another's
  EXPECT_DOUBLE_EQ(tablePeakTflops("NVIDIA RTX A1000", "bf16", false), 0);
  EXPECT_DOUBLE_EQ(tablePeakTflops("NVIDIA RTX A4000", "bf16", false), 0);
  EXPECT_DOUBLE_EQ(tablePeakTflops("NVIDIA A10G", "bf16", false), 0);
  EXPECT_DOUBLE_EQ(tablePeakTflops("NVIDIA GH200 480GB", "bf16", false), 989.4);
}

TEST(Flops, MfuIsTheModelsFlopsOverEveryRanksPeak) {
  TrainConfig train;
  train.peak_tflops = 100;
  train.precision = Precision::kBf16;
  const auto y = yardstickFor(6e9, train, /*cuda=*/true, "NVIDIA H100 80GB HBM3", /*ranks=*/8);
  EXPECT_EQ(y.peak_source, "train.peak_tflops");
  EXPECT_DOUBLE_EQ(y.mfu(1000), 1000 * 6e9 / (8 * 100e12));
  EXPECT_EQ(mfuText(y.mfu(1000)), "0.75 %");
  EXPECT_EQ(mfuText(0.412), "41.2 %");
  EXPECT_EQ(mfuText(-1), "");
  train.peak_tflops = 0;
  const auto table = yardstickFor(6e9, train, true, "NVIDIA H100 80GB HBM3", 1);
  EXPECT_DOUBLE_EQ(table.peak_flops, 989.4e12);
  EXPECT_EQ(table.peak_source, "table: NVIDIA H100 80GB HBM3, bf16 dense");
  const auto unknown = yardstickFor(6e9, train, true, "Some GPU", 1);
  EXPECT_FALSE(unknown.known());
  EXPECT_LT(unknown.mfu(1000), 0);
  EXPECT_NE(yardstickLine(unknown).find("Some GPU is not in the table; set train.peak_tflops"), std::string::npos);
  // fp32: TF32's figure where cuDNN may use it for a convolutional model
  train.precision = Precision::kFp32;
  EXPECT_DOUBLE_EQ(yardstickFor(6e9, train, true, "NVIDIA A100-SXM4-80GB", 1, /*convolutional=*/true).peak_flops,
                   at::globalContext().allowTF32CuDNN() ? 156e12 : 19.5e12);
  train.precision = Precision::kBf16;
  // measuring moves no generator of the run
  torch::manual_seed(1);
  const auto before = torch::rand({3});
  torch::manual_seed(1);
  const auto cpu = yardstickFor(6e9, train, false, "", 1);
  EXPECT_TRUE(torch::equal(torch::rand({3}), before));
  EXPECT_GT(cpu.peak_flops, 1e8);  // any CPU does more than 0.1 GFLOP/s
  EXPECT_NE(cpu.peak_source.find("measured: a bf16 GEMM"), std::string::npos) << cpu.peak_source;
  EXPECT_FALSE(yardstickFor(0, train, false, "", 1).known());
  EXPECT_NE(yardstickLine(yardstickFor(0, train, false, "", 1)).find("model.flops_per_sample"), std::string::npos);
}
