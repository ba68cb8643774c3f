#include "worker/model.h"

#include "collective/error.h"

namespace batchdist::worker {

torch::nn::Sequential buildModel(const ModelConfig& cfg, const std::vector<int64_t>& shape,
                                 int64_t classes) {
  namespace nn = torch::nn;
  nn::Sequential net;
  if (cfg.name == "mlp") {
    int64_t in = 1;
    for (auto d : shape) in *= d;
    net->push_back(nn::Flatten());
    for (auto width : cfg.hidden) {
      net->push_back(nn::Linear(in, width));
      if (cfg.batchnorm) net->push_back(nn::BatchNorm1d(width));
      net->push_back(nn::ReLU());
      if (cfg.dropout > 0) net->push_back(nn::Dropout(cfg.dropout));
      in = width;
    }
    net->push_back(nn::Linear(in, classes));
    return net;
  }
  // cnn: 3x3 conv blocks, global average pooling, linear head.
  if (shape.size() != 3) {
    std::string s;
    for (auto d : shape) s += (s.empty() ? "" : ", ") + std::to_string(d);
    throw ConfigError(strCat("model.name: cnn needs image samples of shape [C, H, W], but the data "
                             "has shape [", s, "]; set data.shape (e.g. [1, 8, 8]) or use mlp"));
  }
  int64_t in = shape[0];
  int64_t h = shape[1];
  for (std::size_t i = 0; i < cfg.channels.size(); ++i) {
    const int64_t out = cfg.channels[i];
    net->push_back(nn::Conv2d(nn::Conv2dOptions(in, out, 3).padding(1).bias(!cfg.batchnorm)));
    if (cfg.batchnorm) net->push_back(nn::BatchNorm2d(out));
    net->push_back(nn::ReLU());
    if (i + 1 < cfg.channels.size() && h >= 8) {
      net->push_back(nn::MaxPool2d(2));
      h /= 2;
    }
    in = out;
  }
  net->push_back(nn::AdaptiveAvgPool2d(1));
  net->push_back(nn::Flatten());
  if (cfg.dropout > 0) net->push_back(nn::Dropout(cfg.dropout));
  net->push_back(nn::Linear(in, classes));
  return net;
}

bool hasBatchNorm(const torch::nn::Module& model) {
  for (const auto& m : model.modules(/*include_self=*/true)) {
    const auto name = m->name();
    if (name.find("BatchNorm") != std::string::npos) return true;
  }
  return false;
}

std::vector<torch::Tensor> modelState(const torch::nn::Module& model) {
  auto state = model.parameters();
  for (const auto& b : model.buffers()) state.push_back(b);
  return state;
}

double larsTrustRatio(double weight_norm, double grad_norm, double weight_decay, double eta) {
  if (weight_norm <= 0 || grad_norm <= 0) return 1.0;
  return eta * weight_norm / (grad_norm + weight_decay * weight_norm);
}

namespace {

template <typename TorchOpt, typename Options>
class TorchOptimizer : public Optimizer {
 public:
  TorchOptimizer(std::vector<torch::Tensor> params, Options opts) : opt_(std::move(params), opts) {}
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

 private:
  TorchOpt opt_;
};

/// SGD with layer-wise adaptive rate scaling. Weights (dim > 1) get the trust
/// ratio and weight decay; biases and BatchNorm parameters (dim <= 1) are
/// excluded from both, as in Goyal/You et al.
class Lars : public Optimizer {
 public:
  Lars(std::vector<torch::Tensor> params, const OptimConfig& cfg)
      : params_(std::move(params)), cfg_(cfg) {
    for (auto& p : params_) momentum_.push_back(torch::zeros_like(p));
  }
  void step(double lr) override {
    torch::NoGradGuard no_grad;
    for (std::size_t i = 0; i < params_.size(); ++i) {
      auto& p = params_[i];
      if (!p.grad().defined()) continue;
      auto g = p.grad();
      if (p.dim() > 1) {
        const double wn = p.norm().item<double>();
        const double gn = g.norm().item<double>();
        const double trust =
            larsTrustRatio(wn, gn, cfg_.weight_decay, cfg_.trust_coefficient);
        g = (g + cfg_.weight_decay * p) * trust;
      }
      momentum_[i].mul_(cfg_.momentum).add_(g, lr);
      p.sub_(momentum_[i]);
    }
  }
  void zeroGrad() override {
    for (auto& p : params_) {
      if (p.grad().defined()) p.mutable_grad().zero_();
    }
  }

 private:
  std::vector<torch::Tensor> params_;
  std::vector<torch::Tensor> momentum_;
  OptimConfig cfg_;
};

}  // namespace

std::unique_ptr<Optimizer> makeOptimizer(const OptimConfig& cfg, torch::nn::Module& model) {
  auto params = model.parameters();
  if (cfg.name == "sgd") {
    if (cfg.nesterov && cfg.momentum <= 0) {
      throw ConfigError("optim.nesterov: true needs optim.momentum > 0");
    }
    return std::make_unique<TorchOptimizer<torch::optim::SGD, torch::optim::SGDOptions>>(
        params, torch::optim::SGDOptions(cfg.lr)
                    .momentum(cfg.momentum)
                    .nesterov(cfg.nesterov)
                    .weight_decay(cfg.weight_decay));
  }
  if (cfg.name == "adamw") {
    return std::make_unique<TorchOptimizer<torch::optim::AdamW, torch::optim::AdamWOptions>>(
        params, torch::optim::AdamWOptions(cfg.lr)
                    .betas({cfg.beta1, cfg.beta2})
                    .eps(cfg.eps)
                    .weight_decay(cfg.weight_decay));
  }
  return std::make_unique<Lars>(params, cfg);
}

}  // namespace batchdist::worker
