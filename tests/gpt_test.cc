// Note [gpt]: the decoder's parameter count (GPT-2 small's from the same formula
// the built model is checked against), the causal property, the tied head,
// GPT-2's initialisation, dropout in training only, the model.* keys and their
// errors; Note [causal attention]: the explicit product against a direct softmax,
// and the fused kernel (LibTorch 2.x) against the explicit product.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <string>

#include "common/device_compat.h"
#include "common/error.h"
#include "tests/config_errors.h"
#include "tests/gpt_fixtures.h"
#include "worker/config/config.h"
#include "worker/model/gpt.h"
#include "worker/model/model.h"

using batchdist::ConfigError;
using namespace batchdist::worker;
using batchdist::testsupport::configError;
namespace compat = batchdist::compat;

namespace {

at::Tensor param(const Model& m, const std::string& name) {
  for (const auto& [n, t] : m.namedParameters()) {
    if (n == name) return t;
  }
  ADD_FAILURE() << "no parameter " << name;
  return {};
}

int64_t numel(const Model& m) {
  int64_t n = 0;
  for (const auto& t : m.parameters()) n += t.numel();
  return n;
}

/// softmax(q_i · k_j / sqrt(D), j <= i) · v, one query at a time.
at::Tensor directCausalAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  auto out = torch::zeros_like(q);
  const int64_t t = q.size(2);
  const double scale = 1.0 / std::sqrt(static_cast<double>(q.size(3)));
  for (int64_t i = 0; i < t; ++i) {
    const auto keys = k.narrow(2, 0, i + 1);  // [N, H, i+1, D]
    const auto scores = (keys * q.narrow(2, i, 1)).sum(-1) * scale;  // [N, H, i+1]
    const auto w = torch::softmax(scores, -1).unsqueeze(-1);
    out.narrow(2, i, 1).copy_((w * v.narrow(2, 0, i + 1)).sum(2, /*keepdim=*/true));
  }
  return out;
}

}  // namespace

// GPT-2 small is ~0.5 GB of fp32 to build; its count is checked through the
// formula, which buildGpt enforces against every model it builds (two built
// here: the default shape, counted by hand, and a second one).
TEST(Gpt, ParameterCountIsGpt2SmallsAndTheBuiltModels) {
  GptShape gpt2;
  gpt2.layers = 12;
  gpt2.heads = 12;
  gpt2.embed = 768;
  gpt2.vocab = 50257;
  gpt2.seq_len = 1024;
  EXPECT_EQ(gptParameterCount(gpt2), 124439808);

  // Defaults: wte 256x64 + wpe 64x64 + 2 blocks x 49,984 + ln_f 128.
  const GptShape defaults = gptShape(ModelConfig{});
  const int64_t block = 128 + (64 * 192 + 192) + (64 * 64 + 64) + 128 + (64 * 256 + 256) +
                        (256 * 64 + 64);
  EXPECT_EQ(block, 49984);
  const int64_t by_hand = 256 * 64 + 64 * 64 + 2 * block + 128;
  EXPECT_EQ(gptParameterCount(defaults), by_hand);
  const auto model = buildGpt(defaults);
  EXPECT_EQ(numel(*model), by_hand);
  EXPECT_EQ(model->describe(), "gpt (2 layers, 2 heads, embed 64, vocab 256, seq 64), 0.12 M parameters");
  EXPECT_FALSE(model->hasBatchNorm());
  EXPECT_TRUE(model->namedBuffers().empty());

  const auto other = buildGpt(smallGptShape());
  EXPECT_EQ(numel(*other), gptParameterCount(smallGptShape()));
}

TEST(Gpt, LogitsArePerTokenAndInputsAreChecked) {
  torch::manual_seed(0);
  const auto model = buildGpt(smallGptShape());
  const auto tokens = torch::randint(0, 50, {3, 7}, torch::kLong);
  EXPECT_EQ(model->forward(tokens).sizes().vec(), (std::vector<int64_t>{3, 7, 50}));
  EXPECT_EQ(model->forward(torch::randint(0, 50, {2, 16}, torch::kInt)).sizes().vec(),
            (std::vector<int64_t>{2, 16, 50}));

  const auto error = [&](const at::Tensor& x) -> std::string {
    try {
      model->forward(x);
    } catch (const ConfigError& e) {
      return e.what();
    }
    return "<no error>";
  };
  EXPECT_NE(error(torch::zeros({2, 17}, torch::kLong)).find("model.seq_len: 16 positions, but the "
                                                            "input has 17 tokens"),
            std::string::npos);
  EXPECT_NE(error(torch::zeros({2, 8})).find("gpt takes token ids of shape [N, T] (integers), got "
                                             "Float of shape [2, 8]"),
            std::string::npos);
}

TEST(Gpt, LaterTokensDoNotReachEarlierLogits) {
  torch::manual_seed(1);
  const auto model = buildGpt(smallGptShape(/*dropout=*/0.3));
  model->train(false);
  torch::NoGradGuard no_grad;
  const auto tokens = torch::randint(0, 50, {2, 16}, torch::kLong);
  const auto base = model->forward(tokens);
  for (int64_t t : {0, 5, 14}) {
    auto later = tokens.clone();
    const int64_t rest = 16 - t - 1;
    later.narrow(1, t + 1, rest).add_(torch::randint(1, 50, {2, rest}, torch::kLong)).remainder_(50);
    const auto out = model->forward(later);
    EXPECT_TRUE(torch::allclose(out.narrow(1, 0, t + 1), base.narrow(1, 0, t + 1), 0, 1e-6))
        << "position <= " << t;
    EXPECT_GT((out.narrow(1, t + 1, 1) - base.narrow(1, t + 1, 1)).abs().max().item<double>(), 1e-4)
        << "position " << t + 1;

    auto here = tokens.clone();
    here.narrow(1, t, 1).add_(1).remainder_(50);
    EXPECT_GT((model->forward(here).narrow(1, t, 1) - base.narrow(1, t, 1)).abs().max().item<double>(),
              1e-4)
        << "position " << t;
  }
}

TEST(Gpt, DropoutOnlyInTraining) {
  torch::manual_seed(2);
  const auto model = buildGpt(smallGptShape(/*dropout=*/0.3));
  const auto tokens = torch::randint(0, 50, {2, 16}, torch::kLong);
  torch::NoGradGuard no_grad;
  model->train(false);
  EXPECT_TRUE(torch::equal(model->forward(tokens), model->forward(tokens)));
  model->train(true);
  EXPECT_FALSE(torch::allclose(model->forward(tokens), model->forward(tokens)));
}

TEST(Gpt, InitialisationIsGpt2s) {
  torch::manual_seed(3);
  GptShape s = smallGptShape();
  s.layers = 4;
  s.embed = 128;
  const auto model = buildGpt(s);
  const double residual = 0.02 / std::sqrt(2.0 * 4);
  for (const std::string name : {"h.0.attn.c_proj.weight", "h.3.mlp.c_proj.weight"}) {
    EXPECT_NEAR(param(*model, name).std().item<double>(), residual, 0.1 * residual) << name;
  }
  for (const std::string name : {"wte.weight", "wpe.weight", "h.1.attn.c_attn.weight",
                                 "h.2.mlp.c_fc.weight"}) {
    EXPECT_NEAR(param(*model, name).std().item<double>(), 0.02, 0.002) << name;
  }
  EXPECT_TRUE(torch::equal(param(*model, "h.0.attn.c_attn.bias"), torch::zeros({3 * 128})));
  EXPECT_TRUE(torch::equal(param(*model, "h.3.mlp.c_proj.bias"), torch::zeros({128})));
  EXPECT_TRUE(torch::equal(param(*model, "ln_f.weight"), torch::ones({128})));
  EXPECT_TRUE(torch::equal(param(*model, "h.2.ln_2.bias"), torch::zeros({128})));
}

// The head has no weight of its own: a token that is never input still gets a
// gradient in wte (through the head only), and after an optimizer step on wte a
// zeroed row of wte zeroes that token's logit everywhere.
TEST(Gpt, HeadIsTheTokenEmbedding) {
  torch::manual_seed(4);
  const auto model = buildGpt(smallGptShape());
  for (const auto& [name, t] : model->namedParameters()) {
    if (name != "wte.weight") {
      EXPECT_NE(t.size(0), 50) << name << " looks like a head";
    }
  }
  auto wte = param(*model, "wte.weight");
  const auto tokens = torch::randint(0, 4, {2, 8}, torch::kLong);  // tokens 0..3 only
  model->forward(tokens).pow(2).sum().backward();
  EXPECT_GT(wte.grad()[10].abs().sum().item<double>(), 0);

  torch::optim::SGD sgd({wte}, torch::optim::SGDOptions(0.5));
  sgd.step();
  {
    torch::NoGradGuard no_grad;
    wte[10].zero_();
    wte[11].mul_(2);
  }
  const auto before = model->forward(tokens).detach();
  EXPECT_TRUE(torch::equal(before.select(2, 10), torch::zeros({2, 8})));
  {
    torch::NoGradGuard no_grad;
    wte[11].mul_(2);
  }
  // Token 11 is not an input: its row reaches the logits through the head alone.
  EXPECT_TRUE(torch::allclose(model->forward(tokens).detach().select(2, 11),
                              2 * before.select(2, 11), 1e-5, 1e-6));
}

// causalAttentionExplicit scales and masks its scores in place: the same bits,
// forward and backward, as the out-of-place product it replaced.
TEST(Gpt, ExplicitAttentionInPlaceIsBitwiseTheOutOfPlaceProduct) {
  torch::manual_seed(7);
  const auto q = torch::randn({2, 3, 6, 4}, torch::requires_grad()),
             k = torch::randn({2, 3, 6, 4}, torch::requires_grad()),
             v = torch::randn({2, 3, 6, 4}, torch::requires_grad());
  const auto out_of_place = [&] {
    const auto future = torch::ones({6, 6}, torch::kBool).triu(1);
    const auto scores = torch::matmul(q, k.transpose(-2, -1)) * (1.0 / std::sqrt(4.0));
    return torch::matmul(torch::softmax(scores.masked_fill(future, -INFINITY), -1), v);
  }();
  const auto in_place = compat::causalAttentionExplicit(q, k, v, 0.0);
  EXPECT_TRUE(torch::equal(in_place, out_of_place));
  const auto grads_of = [&](const at::Tensor& out) {
    return torch::autograd::grad({out.pow(2).sum()}, {q, k, v});
  };
  const auto gi = grads_of(in_place), go = grads_of(out_of_place);
  for (std::size_t i = 0; i < gi.size(); ++i) EXPECT_TRUE(torch::equal(gi[i], go[i])) << "gradient " << i;
}

TEST(Gpt, ExplicitAttentionIsTheDirectSoftmax) {
  torch::manual_seed(5);
  const auto q = torch::randn({2, 3, 6, 4}), k = torch::randn({2, 3, 6, 4}),
             v = torch::randn({2, 3, 6, 4});
  EXPECT_TRUE(torch::allclose(compat::causalAttentionExplicit(q, k, v, 0.0),
                              directCausalAttention(q, k, v), 1e-5, 1e-6));
}

// On LibTorch 2.x causalAttention is the fused kernel; on 1.13 it is the
// explicit product itself (kHasFusedAttention false), checked by the test above.
TEST(Gpt, FusedAttentionMatchesTheExplicitProduct) {
  EXPECT_EQ(compat::kHasFusedAttention, TORCH_VERSION_MAJOR >= 2);
  torch::manual_seed(6);
  const auto q = torch::randn({2, 3, 6, 4}, torch::requires_grad()),
             k = torch::randn({2, 3, 6, 4}, torch::requires_grad()),
             v = torch::randn({2, 3, 6, 4}, torch::requires_grad());
  const auto fused = compat::causalAttention(q, k, v, 0.0);
  const auto explicit_out = compat::causalAttentionExplicit(q, k, v, 0.0);
  EXPECT_TRUE(torch::allclose(fused, explicit_out, 1e-5, 1e-6));
  const auto grads_of = [&](const at::Tensor& out) {
    return torch::autograd::grad({out.pow(2).sum()}, {q, k, v});
  };
  const auto gf = grads_of(fused), ge = grads_of(explicit_out);
  for (std::size_t i = 0; i < gf.size(); ++i) {
    EXPECT_TRUE(torch::allclose(gf[i], ge[i], 1e-4, 1e-5)) << "gradient " << i;
  }
}

TEST(Gpt, ConfigKeysDefaultsAndErrors) {
  // A gpt reads token data (Note [task choice]: any other data is refused).
  const std::string tokens = "\ndata: {name: tokens, path: t.bin}";
  auto cfg = parseConfig("model: {name: gpt}" + tokens, "test.yaml");
  EXPECT_EQ(cfg.model.name, ModelName::kGpt);
  EXPECT_EQ(cfg.model.layers, 2);
  EXPECT_EQ(cfg.model.heads, 2);
  EXPECT_EQ(cfg.model.embed, 64);
  EXPECT_EQ(cfg.model.vocab, 256);
  EXPECT_EQ(cfg.model.seq_len, 64);
  EXPECT_EQ(cfg.resolved["model"]["seq_len"], 64);
  EXPECT_FALSE(modelHasBatchNorm(cfg.model));
  // Other models' resolved config (checkpoints, search cache keys) is unchanged.
  EXPECT_FALSE(parseConfig("model: {name: mlp}", "test.yaml").resolved["model"].contains("layers"));

  cfg = parseConfig("model: {name: gpt, layers: 4, heads: 4, embed: 48, vocab: 1000, seq_len: 32, "
                    "dropout: 0.1}" + tokens, "test.yaml");
  const auto s = gptShape(cfg.model);
  EXPECT_EQ(s.layers, 4);
  EXPECT_EQ(s.heads, 4);
  EXPECT_EQ(s.embed, 48);
  EXPECT_EQ(s.vocab, 1000);
  EXPECT_EQ(s.seq_len, 32);
  EXPECT_DOUBLE_EQ(s.dropout, 0.1);

  EXPECT_NE(configError("model: {name: gpt, embed: 100, heads: 3}")
                .find("test.yaml: model.embed: 100 is not divisible by model.heads (3)"),
            std::string::npos);
  EXPECT_NE(configError("model: {name: gpt, layers: 0}").find("test.yaml:1: model.layers: must be >= 1, got 0"),
            std::string::npos);
  EXPECT_NE(configError("model: {name: gpt, vocab: 1}").find("model.vocab: must be >= 2, got 1"),
            std::string::npos);
  EXPECT_NE(configError("model: {name: gpt, seq_len: 0}").find("model.seq_len: must be >= 1, got 0"),
            std::string::npos);
  EXPECT_NE(configError("model: {name: gpt, layer: 3}").find("did you mean 'model.layers'?"),
            std::string::npos);
}

// buildModel's check (Note [gpt]): samples of [T] token ids, T <= seq_len.
TEST(Gpt, BuildModelChecksTheSampleShape) {
  const auto cfg = parseConfig("model: {name: gpt, seq_len: 32}\ndata: {name: tokens, path: t.bin}",
                               "test.yaml");
  EXPECT_EQ(buildModel(cfg.model, {32}, 10)->describe().rfind("gpt (2 layers", 0), 0u);
  const auto error = [&](const std::vector<int64_t>& shape) -> std::string {
    try {
      buildModel(cfg.model, shape, 10);
    } catch (const ConfigError& e) {
      return e.what();
    }
    return "<no error>";
  };
  EXPECT_NE(error({3, 32, 32}).find("gpt reads samples of [T] token ids with T <= model.seq_len "
                                    "(32), but the data has shape [3, 32, 32]"),
            std::string::npos);
  EXPECT_NE(error({33}).find("raise model.seq_len"), std::string::npos);
}
