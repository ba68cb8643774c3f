#include "worker/model/optimizer.h"

#include <torch/torch.h>

#include <sstream>

#include "common/error.h"

namespace batchdist::worker {

double larsTrustRatio(double weight_norm, double grad_norm, double weight_decay, double eta) {
  if (weight_norm <= 0 || grad_norm <= 0) return 1.0;
  return eta * weight_norm / (grad_norm + weight_decay * weight_norm);
}

namespace {

std::string archiveBytes(torch::serialize::OutputArchive& archive) {
  std::ostringstream out;
  archive.save_to(out);
  return out.str();
}

void loadArchive(torch::serialize::InputArchive& archive, const std::string& bytes,
                 const at::Device& device) {
  std::istringstream in(bytes);
  archive.load_from(in, device);
}

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
  std::string saveState() override {
    torch::serialize::OutputArchive archive;
    opt_.save(archive);
    return archiveBytes(archive);
  }
  void loadState(const std::string& bytes, const at::Device& device) override {
    torch::serialize::InputArchive archive;
    loadArchive(archive, bytes, device);
    opt_.load(archive);  // creates the per-parameter state for these parameters
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
        const double trust = larsTrustRatio(wn, gn, cfg_.weight_decay, cfg_.trust_coefficient);
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
  std::string saveState() override {
    torch::serialize::OutputArchive archive;
    for (std::size_t i = 0; i < momentum_.size(); ++i) archive.write(strCat("m", i), momentum_[i]);
    return archiveBytes(archive);
  }
  void loadState(const std::string& bytes, const at::Device& device) override {
    torch::serialize::InputArchive archive;
    loadArchive(archive, bytes, device);
    torch::NoGradGuard no_grad;
    for (std::size_t i = 0; i < momentum_.size(); ++i) {
      torch::Tensor m;
      if (!archive.try_read(strCat("m", i), m) || !m.sizes().equals(momentum_[i].sizes())) {
        throw Error(strCat("lars state: momentum ", i, " is missing or has another shape"));
      }
      momentum_[i].copy_(m);  // in place: the tensor step() updates
    }
  }

 private:
  std::vector<torch::Tensor> params_;
  std::vector<torch::Tensor> momentum_;
  OptimConfig cfg_;
};

}  // namespace

std::unique_ptr<Optimizer> makeOptimizer(const OptimConfig& cfg, std::vector<torch::Tensor> params) {
  if (cfg.name == OptimName::kSgd) {
    if (cfg.nesterov && cfg.momentum <= 0) {
      throw ConfigError("optim.nesterov: true needs optim.momentum > 0");
    }
    return std::make_unique<TorchOptimizer<torch::optim::SGD, torch::optim::SGDOptions>>(
        params, torch::optim::SGDOptions(cfg.lr)
                    .momentum(cfg.momentum)
                    .nesterov(cfg.nesterov)
                    .weight_decay(cfg.weight_decay));
  }
  if (cfg.name == OptimName::kAdamw) {
    return std::make_unique<TorchOptimizer<torch::optim::AdamW, torch::optim::AdamWOptions>>(
        params, torch::optim::AdamWOptions(cfg.lr)
                    .betas({cfg.beta1, cfg.beta2})
                    .eps(cfg.eps)
                    .weight_decay(cfg.weight_decay));
  }
  return std::make_unique<Lars>(params, cfg);
}

}  // namespace batchdist::worker
