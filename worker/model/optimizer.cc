#include "worker/model/optimizer.h"

#include <torch/torch.h>

#include <cmath>
#include <sstream>
#include <type_traits>

#include "common/device_compat.h"
#include "common/error.h"
#include "worker/model/archive.h"

namespace batchdist::worker {

double larsTrustRatio(double weight_norm, double grad_norm, double weight_decay, double eta) {
  if (weight_norm <= 0 || grad_norm <= 0) return 1.0;
  return eta * weight_norm / (grad_norm + weight_decay * weight_norm);
}

namespace {

template <typename TorchOpt, typename Options>
class TorchOptimizer : public Optimizer {
  static constexpr bool kSgd = std::is_same_v<TorchOpt, torch::optim::SGD>;
  using State = std::conditional_t<kSgd, torch::optim::SGDParamState, torch::optim::AdamWParamState>;

 public:
  TorchOptimizer(std::vector<torch::Tensor> params, Options opts)
      : opt_(params, opts), tensors_(std::move(params)) {}
  /// `order`: the tensors in the order they were given (Note [optimizer state vectors]).
  TorchOptimizer(std::vector<torch::Tensor> order,
                 std::vector<torch::optim::OptimizerParamGroup> groups, Options opts)
      : opt_(std::move(groups), opts), tensors_(std::move(order)) {}
  void step(double lr) override {
    for (auto& group : opt_.param_groups()) static_cast<Options&>(group.options()).lr(lr);
    opt_.step();
  }
  void zeroGrad() override {
    for (auto& group : opt_.param_groups()) {
      for (auto& p : group.params()) {
        if (p.grad().defined()) p.mutable_grad().zero_();
      }
    }
  }
  std::string saveState() override {
    torch::serialize::OutputArchive archive;
    opt_.save(archive);
    return archiveBytes(archive);
  }
  void loadState(const std::string& bytes, const at::Device& device) override {
    torch::serialize::InputArchive archive;
    loadArchiveBytes(archive, bytes, device);
    try {
      opt_.load(archive);  // creates the per-parameter state for these parameters
    } catch (const c10::Error& e) {
      // e.g. another optimizer's state, or adamw's from before its two groups.
      throw Error(strCat("the checkpoint's optimizer state does not fit this optimizer and "
                         "model (", e.what_without_backtrace(), ")"));
    }
  }

  std::vector<std::string> stateNames() const override {
    if constexpr (kSgd) {
      const auto& o = static_cast<const Options&>(opt_.defaults());
      if (o.momentum() == 0) return {};
      return {"momentum"};
    } else {
      return {"exp_avg", "exp_avg_sq"};
    }
  }
  at::Tensor stateVector(std::size_t i, std::size_t k) override {
    State* st = find(i);
    if (!st) return torch::zeros({tensors_[i].numel()}, tensors_[i].options());
    return vectorOf(*st, k).reshape({-1});
  }
  void setStateVector(std::size_t i, std::size_t k, const at::Tensor& values) override {
    torch::NoGradGuard no_grad;
    auto& t = vectorOf(ensure(i), k);
    t.copy_(values.reshape(t.sizes()));
  }
  int64_t stepCount(std::size_t i) override {
    if constexpr (kSgd) {
      return 0;
    } else {
      State* st = find(i);
      return st ? static_cast<int64_t>(st->step()) : 0;
    }
  }
  void setStepCount(std::size_t i, int64_t steps) override {
    if constexpr (!kSgd) ensure(i).step(steps);
  }
  int64_t stateBytes() override {
    int64_t bytes = 0;
    for (std::size_t i = 0; i < tensors_.size(); ++i) {
      State* st = find(i);
      if (!st) continue;
      for (std::size_t k = 0; k < (kSgd ? 1u : 2u); ++k) {
        const auto& t = vectorOf(*st, k);
        if (t.defined()) bytes += static_cast<int64_t>(t.nbytes());
      }
    }
    return bytes;
  }

 private:
  State* find(std::size_t i) {
    auto& state = opt_.state();
    auto it = state.find(compat::optimizerStateKey(state, tensors_.at(i)));
    return it == state.end() ? nullptr : static_cast<State*>(it->second.get());
  }
  /// Tensor i's state, made as the optimizer's first step would find it: zeros, step 0.
  State& ensure(std::size_t i) {
    if (State* st = find(i)) return *st;
    auto st = std::make_unique<State>();
    const auto zeros = [&] { return torch::zeros_like(tensors_[i], at::MemoryFormat::Contiguous); };
    if constexpr (kSgd) {
      st->momentum_buffer(zeros());
    } else {
      st->step(0);
      st->exp_avg(zeros());
      st->exp_avg_sq(zeros());
    }
    State* out = st.get();
    auto& state = opt_.state();
    state[compat::optimizerStateKey(state, tensors_[i])] = std::move(st);
    return *out;
  }
  static torch::Tensor& vectorOf(State& st, std::size_t k) {
    if constexpr (kSgd) {
      return st.momentum_buffer();
    } else {
      return k == 0 ? st.exp_avg() : st.exp_avg_sq();
    }
  }

  TorchOpt opt_;
  std::vector<torch::Tensor> tensors_;  ///< in the order given, for the state vectors
};

/// SGD with layer-wise adaptive rate scaling. Weights (dim > 1) get the trust
/// ratio and weight decay; biases and BatchNorm parameters (dim <= 1) are
/// excluded from both, as in Goyal/You et al. A piece of a weight (Note [shard
/// layout]) takes the ratio of the whole weight: the same norms, so the same ratio.
class Lars : public Optimizer {
 public:
  Lars(std::vector<OptimizerParam> params, const OptimConfig& cfg) : cfg_(cfg) {
    for (auto& p : params) {
      params_.push_back(p.tensor);
      wholes_.push_back(p.whole);
      momentum_.push_back(torch::zeros_like(p.tensor));
    }
  }
  void step(double lr) override {
    torch::NoGradGuard no_grad;
    for (std::size_t i = 0; i < params_.size(); ++i) {
      auto& p = params_[i];
      if (!p.grad().defined()) continue;
      auto g = p.grad();
      const auto& whole = wholes_[i];
      if (whole.dim() > 1) {
        const double wn = whole.norm().item<double>();
        const double gn = given_.empty() ? whole.grad().norm().item<double>() : given_.at(i);
        const double trust = larsTrustRatio(wn, gn, cfg_.weight_decay, cfg_.trust_coefficient);
        g = (g + cfg_.weight_decay * p) * trust;
      }
      momentum_[i].mul_(cfg_.momentum).add_(g, lr);
      p.sub_(momentum_[i]);
    }
    given_.clear();
  }
  bool needsWholeGradNorms() const override { return true; }
  void setWholeGradNorms(std::vector<double> norms) override { given_ = std::move(norms); }
  void zeroGrad() override {
    for (auto& p : params_) {
      if (p.grad().defined()) p.mutable_grad().zero_();
    }
  }
  std::string saveState() override {
    torch::serialize::OutputArchive archive;
    for (std::size_t i = 0; i < momentum_.size(); ++i) archive.write(strCat("m", i), momentum_[i]);
    return archiveBytes(archive);
  }
  void loadState(const std::string& bytes, const at::Device& device) override {
    torch::serialize::InputArchive archive;
    loadArchiveBytes(archive, bytes, device);
    torch::NoGradGuard no_grad;
    for (std::size_t i = 0; i < momentum_.size(); ++i) {
      torch::Tensor m;
      if (!archive.try_read(strCat("m", i), m) || !m.sizes().equals(momentum_[i].sizes())) {
        throw Error(strCat("lars state: momentum ", i, " is missing or has another shape"));
      }
      momentum_[i].copy_(m);  // in place: the tensor step() updates
    }
  }
  std::vector<std::string> stateNames() const override { return {"momentum"}; }
  at::Tensor stateVector(std::size_t i, std::size_t) override { return momentum_.at(i).reshape({-1}); }
  void setStateVector(std::size_t i, std::size_t, const at::Tensor& values) override {
    torch::NoGradGuard no_grad;
    momentum_.at(i).copy_(values.reshape(momentum_.at(i).sizes()));
  }
  int64_t stepCount(std::size_t) override { return 0; }
  void setStepCount(std::size_t, int64_t) override {}
  int64_t stateBytes() override {
    int64_t bytes = 0;
    for (const auto& m : momentum_) bytes += static_cast<int64_t>(m.nbytes());
    return bytes;
  }

 private:
  std::vector<torch::Tensor> params_;
  std::vector<torch::Tensor> wholes_;  ///< what params_[i] is part of (itself when whole)
  std::vector<double> given_;  ///< the next step's |grad| per tensor (Note [sharded gradients])
  std::vector<torch::Tensor> momentum_;
  OptimConfig cfg_;
};

using AdamW = TorchOptimizer<torch::optim::AdamW, torch::optim::AdamWOptions>;

/// Two groups, in the parameters' order within each: weights (dim >= 2) decayed,
/// the rest not (a group with no parameters is left out).
std::unique_ptr<Optimizer> makeAdamw(const OptimConfig& cfg, std::vector<OptimizerParam> params) {
  const auto options = [&](double decay) {
    return std::make_unique<torch::optim::AdamWOptions>(torch::optim::AdamWOptions(cfg.lr)
                                                            .betas({cfg.beta1, cfg.beta2})
                                                            .eps(cfg.eps)
                                                            .weight_decay(decay));
  };
  std::vector<torch::Tensor> decayed, plain, order;
  for (auto& p : params) {
    (p.whole.dim() >= 2 ? decayed : plain).push_back(p.tensor);
    order.push_back(p.tensor);
  }
  std::vector<torch::optim::OptimizerParamGroup> groups;
  if (!decayed.empty()) groups.emplace_back(decayed, options(cfg.weight_decay));
  if (!plain.empty()) groups.emplace_back(plain, options(0.0));
  return std::make_unique<AdamW>(std::move(order), std::move(groups), *options(cfg.weight_decay));
}

}  // namespace

double clipGradNorm(const std::vector<at::Tensor>& params, double max_norm) {
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> grads;
  for (const auto& p : params) {
    if (p.grad().defined()) grads.push_back(p.grad());
  }
  if (grads.empty()) return 0.0;
  auto sq = torch::zeros({}, grads.front().options().dtype(torch::kDouble));
  for (const auto& g : grads) sq += g.to(torch::kDouble).square().sum();
  const double norm = std::sqrt(sq.item<double>());
  if (const double coef = clipCoefficient(norm, max_norm); coef != 1) {
    for (auto& g : grads) g.mul_(coef);
  }
  return norm;
}

double clipCoefficient(double norm, double max_norm) {
  if (!std::isfinite(norm) || norm <= max_norm) return 1;
  return max_norm / (norm + 1e-6);
}

std::unique_ptr<Optimizer> makeOptimizer(const OptimConfig& cfg, std::vector<torch::Tensor> params) {
  std::vector<OptimizerParam> wholes;
  for (auto& p : params) wholes.push_back({p, p});
  return makeOptimizer(cfg, std::move(wholes));
}

std::unique_ptr<Optimizer> makeOptimizer(const OptimConfig& cfg, std::vector<OptimizerParam> params) {
  if (cfg.name == OptimName::kSgd) {
    std::vector<torch::Tensor> tensors;
    for (auto& p : params) tensors.push_back(p.tensor);
    if (cfg.nesterov && cfg.momentum <= 0) {
      throw ConfigError("optim.nesterov: true needs optim.momentum > 0");
    }
    return std::make_unique<TorchOptimizer<torch::optim::SGD, torch::optim::SGDOptions>>(
        std::move(tensors), torch::optim::SGDOptions(cfg.lr)
                    .momentum(cfg.momentum)
                    .nesterov(cfg.nesterov)
                    .weight_decay(cfg.weight_decay));
  }
  if (cfg.name == OptimName::kAdamw) return makeAdamw(cfg, std::move(params));
  return std::make_unique<Lars>(std::move(params), cfg);
}

}  // namespace batchdist::worker
