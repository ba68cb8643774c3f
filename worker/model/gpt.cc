#include "worker/model/gpt.h"

#include <torch/torch.h>

#include <cmath>
#include <string>

#include "common/device_compat.h"
#include "common/error.h"
#include "worker/common/util.h"
#include "worker/model/nn_module_model.h"
#include "worker/model/recompute.h"

namespace batchdist::worker {
namespace nn = torch::nn;

namespace {

constexpr double kInitStd = 0.02;  // Note [gpt]

/// Causal multi-head self-attention: one Linear makes q, k and v, one projects back.
class CausalSelfAttentionImpl : public nn::Module {
 public:
  explicit CausalSelfAttentionImpl(const GptShape& s) : heads_(s.heads), dropout_(s.dropout) {
    c_attn_ = register_module("c_attn", nn::Linear(s.embed, 3 * s.embed));
    c_proj_ = register_module("c_proj", nn::Linear(s.embed, s.embed));
    resid_drop_ = register_module("resid_drop", nn::Dropout(s.dropout));
  }

  torch::Tensor forward(const torch::Tensor& x) {
    const int64_t n = x.size(0), t = x.size(1), e = x.size(2);
    // [N, T, 3E] -> [3, N, H, T, D]: q, k and v, head-major.
    const auto qkv =
        c_attn_(x).view({n, t, 3, heads_, e / heads_}).permute({2, 0, 3, 1, 4}).unbind(0);
    auto y = compat::causalAttention(qkv[0], qkv[1], qkv[2], is_training() ? dropout_ : 0.0);
    y = y.transpose(1, 2).reshape({n, t, e});
    return resid_drop_(c_proj_(y));
  }

  const nn::Linear& projection() const { return c_proj_; }

 private:
  int64_t heads_;
  double dropout_;
  nn::Linear c_attn_{nullptr}, c_proj_{nullptr};
  nn::Dropout resid_drop_{nullptr};
};
TORCH_MODULE(CausalSelfAttention);

/// The position-wise MLP: E -> 4E, GELU (tanh approximation, as GPT-2), 4E -> E.
class MlpImpl : public nn::Module {
 public:
  explicit MlpImpl(const GptShape& s) {
    c_fc_ = register_module("c_fc", nn::Linear(s.embed, 4 * s.embed));
    c_proj_ = register_module("c_proj", nn::Linear(4 * s.embed, s.embed));
    drop_ = register_module("drop", nn::Dropout(s.dropout));
  }

  torch::Tensor forward(const torch::Tensor& x) {
    return drop_(c_proj_(at::gelu(c_fc_(x), "tanh")));
  }

  const nn::Linear& projection() const { return c_proj_; }

 private:
  nn::Linear c_fc_{nullptr}, c_proj_{nullptr};
  nn::Dropout drop_{nullptr};
};
TORCH_MODULE(Mlp);

/// One pre-LayerNorm block: x + attn(ln_1(x)), then + mlp(ln_2(.)).
class BlockImpl : public nn::Module {
 public:
  explicit BlockImpl(const GptShape& s) {
    ln_1_ = register_module("ln_1", nn::LayerNorm(nn::LayerNormOptions({s.embed})));
    attn_ = register_module("attn", CausalSelfAttention(s));
    ln_2_ = register_module("ln_2", nn::LayerNorm(nn::LayerNormOptions({s.embed})));
    mlp_ = register_module("mlp", Mlp(s));
  }

  torch::Tensor forward(torch::Tensor x) {
    x = x + attn_(ln_1_(x));
    return x + mlp_(ln_2_(x));
  }

  /// The two Linears that write into the residual stream (Note [gpt]: their
  /// initialisation shrinks with depth).
  std::vector<torch::Tensor> residualWeights() const {
    return {attn_->projection()->weight, mlp_->projection()->weight};
  }

 private:
  nn::LayerNorm ln_1_{nullptr}, ln_2_{nullptr};
  CausalSelfAttention attn_{nullptr};
  Mlp mlp_{nullptr};
};
TORCH_MODULE(Block);

/// The decoder of Note [gpt]; the head is wte's weight.
class GptNetImpl : public nn::Module {
 public:
  explicit GptNetImpl(const GptShape& s) : recompute_(s.recompute) {
    wte_ = register_module("wte", nn::Embedding(s.vocab, s.embed));
    wpe_ = register_module("wpe", nn::Embedding(s.seq_len, s.embed));
    drop_ = register_module("drop", nn::Dropout(s.dropout));
    auto h = register_module("h", nn::ModuleList());
    for (int64_t i = 0; i < s.layers; ++i) {
      blocks_.push_back(Block(s));
      h->push_back(blocks_.back());
    }
    ln_f_ = register_module("ln_f", nn::LayerNorm(nn::LayerNormOptions({s.embed})));
    initialise(s.layers);
  }

  /// Token ids [N, T] (T <= seq_len) -> logits [N, T, vocab], each part run as
  /// its unit through `hooks` (Note [parameter units]; null: none).
  torch::Tensor forward(const torch::Tensor& tokens, UnitHooks* hooks = nullptr) {
    const auto positions = torch::arange(tokens.size(1), tokens.options().dtype(torch::kLong));
    auto x = runUnit(hooks, 0, [&](const torch::Tensor& t) { return drop_(wte_(t) + wpe_(positions)); },
                     tokens);
    for (std::size_t i = 0; i < blocks_.size(); ++i) {
      auto block = blocks_[i];
      BlockForward run = [block](const torch::Tensor& in) mutable { return block->forward(in); };
      // Note [activation recompute]: the block's input is all it keeps.
      if (recompute_) run = recomputing(run, block->parameters());
      x = runUnit(hooks, i + 1, run, x);
    }
    const auto head = [&](const torch::Tensor& h) { return at::linear(ln_f_(h), wte_->weight); };
    return runUnit(hooks, blocks_.size() + 1, head, x);  // tied head: h · wteᵀ
  }
  void setRecompute(bool on) { recompute_ = on; }
  /// Note [parameter units]: the embeddings, each block, the head (which reads wte).
  std::vector<ParamUnit> units() const {
    std::vector<ParamUnit> out{{"embeddings", {wte_->weight, wpe_->weight}, {}}};
    for (std::size_t i = 0; i < blocks_.size(); ++i) {
      out.push_back({strCat("h.", i), blocks_[i]->parameters(), {}});
    }
    out.push_back({"head", ln_f_->parameters(), {0}});
    return out;
  }

 private:
  /// GPT-2's initialisation (Note [gpt]).
  void initialise(int64_t layers) {
    torch::NoGradGuard no_grad;
    for (const auto& m : modules(/*include_self=*/false)) {
      if (auto* linear = m->as<nn::Linear>()) {
        nn::init::normal_(linear->weight, 0.0, kInitStd);
        nn::init::zeros_(linear->bias);
      } else if (auto* embedding = m->as<nn::Embedding>()) {
        nn::init::normal_(embedding->weight, 0.0, kInitStd);
      } else if (auto* norm = m->as<nn::LayerNorm>()) {
        nn::init::ones_(norm->weight);
        nn::init::zeros_(norm->bias);
      }
    }
    const double residual_std = kInitStd / std::sqrt(2.0 * static_cast<double>(layers));
    for (auto& block : blocks_) {
      for (auto w : block->residualWeights()) nn::init::normal_(w, 0.0, residual_std);
    }
  }

  bool recompute_;
  nn::Embedding wte_{nullptr}, wpe_{nullptr};
  nn::Dropout drop_{nullptr};
  std::vector<Block> blocks_;  ///< also registered as "h"
  nn::LayerNorm ln_f_{nullptr};
};
TORCH_MODULE(GptNet);

std::string shapeName(const GptShape& s) {
  return strCat("gpt (", s.layers, " layers, ", s.heads, " heads, embed ", s.embed, ", vocab ",
                s.vocab, ", seq ", s.seq_len, ")");
}

/// The Model the trainer sees: a built-in (NnModuleModel) with the input checks a
/// token model needs.
class GptModel : public NnModuleModel {
 public:
  GptModel(GptNet net, GptShape shape)
      : NnModuleModel(net.ptr()), net_(std::move(net)), shape_(shape) {}

  torch::Tensor forward(const torch::Tensor& x) override {
    if (x.dim() != 2 || !c10::isIntegralType(x.scalar_type(), /*includeBool=*/false)) {
      throw ConfigError(strCat("model.name: gpt takes token ids of shape [N, T] (integers), got ",
                               x.scalar_type(), " of shape ", shapeText(x.sizes().vec()),
                               "; give it data.name: tokens (Note [tokens])"));
    }
    if (x.size(1) > shape_.seq_len) {
      throw ConfigError(strCat("model.seq_len: ", shape_.seq_len, " positions, but the input has ",
                               x.size(1), " tokens per sample; raise model.seq_len"));
    }
    return net_->forward(x.scalar_type() == at::kLong ? x : x.to(at::kLong), unitHooks());
  }
  std::vector<ParamUnit> units() const override { return net_->units(); }
  bool hasBatchNorm() const override { return false; }
  bool setRecompute(bool on) override {
    net_->setRecompute(on);
    shape_.recompute = on;
    return true;
  }
  std::string describe() const override {
    return shapeName(shape_) + ", " + parameterCountText(gptParameterCount(shape_)) + " parameters";
  }

 private:
  GptNet net_;
  GptShape shape_;
};

}  // namespace

GptShape gptShape(const ModelConfig& cfg) {
  GptShape s;
  s.layers = cfg.layers;
  s.heads = cfg.heads;
  s.embed = cfg.embed;
  s.vocab = cfg.vocab;
  s.seq_len = cfg.seq_len;
  s.dropout = cfg.dropout;
  s.recompute = cfg.recompute == Recompute::kOn;
  return s;
}

int64_t gptParameterCount(const GptShape& s) {
  const int64_t e = s.embed;
  const int64_t per_block = 2 * e                // ln_1
                            + e * 3 * e + 3 * e  // attn.c_attn
                            + e * e + e          // attn.c_proj
                            + 2 * e              // ln_2
                            + e * 4 * e + 4 * e  // mlp.c_fc
                            + 4 * e * e + e;     // mlp.c_proj
  return s.vocab * e + s.seq_len * e + s.layers * per_block + 2 * e;  // wte, wpe, h, ln_f
}

std::unique_ptr<Model> buildGpt(const GptShape& shape) {
  if (shape.heads < 1 || shape.embed % shape.heads != 0) {
    throw ConfigError(strCat("model.embed: ", shape.embed, " is not divisible by model.heads (",
                             shape.heads, ")"));
  }
  GptNet net(shape);
  int64_t built = 0;
  for (const auto& p : net->parameters()) built += p.numel();
  BATCHDIST_ENFORCE_OP(Error, built, ==, gptParameterCount(shape),
                       shapeName(shape), ": the built model and gptParameterCount disagree");
  return std::make_unique<GptModel>(std::move(net), shape);
}

}  // namespace batchdist::worker
