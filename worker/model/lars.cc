#include "worker/model/lars.h"

#include <torch/torch.h>

#include "common/error.h"
#include "worker/model/archive.h"

namespace batchdist::worker {

double larsTrustRatio(double weight_norm, double grad_norm, double weight_decay, double eta) {
  if (weight_norm <= 0 || grad_norm <= 0) return 1.0;
  return eta * weight_norm / (grad_norm + weight_decay * weight_norm);
}

namespace {

/// The tensors of one step, split as LARS treats them: weights (dim > 1, of
/// their whole parameter) take the trust ratio and the decay, the rest neither.
struct LarsLists {
  std::vector<torch::Tensor> params, grads, momentum;
  std::vector<torch::Tensor> wholes, whole_grads;  ///< weights only
  std::vector<double> given;                       ///< weights only, when norms were given
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
    const bool cuda = !params_.empty() && params_.front().is_cuda();
    multi_tensor_ = resolveStepKernels(cfg.kernels, cuda) != StepKernels::kPerTensor;
  }
  void step(double lr) override {
    torch::NoGradGuard no_grad;
    if (multi_tensor_) stepLists(lr);
    else stepEach(lr);
    given_.clear();
  }
  StepKernels kernels() const override {
    return multi_tensor_ ? StepKernels::kMultiTensor : StepKernels::kPerTensor;
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
  /// Tensor by tensor: two norms read back to the host per weight.
  void stepEach(double lr) {
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
  }
  // Note [multi-tensor step], LARS: the norms by _foreach_norm and the trust
  // ratios on the device, in double as larsTrustRatio computes them on the host,
  // so that the step reads nothing back (stepEach waits for two norms a weight:
  // 2 x 53 waits a ResNet-50 step). The other operations are stepEach's, in its
  // order, over the lists.
  void stepLists(double lr) {
    LarsLists weights, others;
    for (std::size_t i = 0; i < params_.size(); ++i) {
      if (!params_[i].grad().defined()) continue;
      const bool weight = wholes_[i].dim() > 1;
      auto& l = weight ? weights : others;
      l.params.push_back(params_[i]);
      l.grads.push_back(params_[i].grad());
      l.momentum.push_back(momentum_[i]);
      if (!weight) continue;
      l.wholes.push_back(wholes_[i]);
      if (given_.empty()) l.whole_grads.push_back(wholes_[i].grad());
      else l.given.push_back(given_.at(i));
    }
    if (!weights.params.empty()) {
      auto d = at::_foreach_mul(weights.params, cfg_.weight_decay);
      at::_foreach_add_(d, weights.grads);  // g + wd * p, as stepEach adds them
      const auto trust = trustRatios(weights).unbind(0);
      for (std::size_t i = 0; i < d.size(); ++i) d[i].mul_(trust[i]);
      momentumStep(weights.params, weights.momentum, d, lr);
    }
    if (!others.params.empty()) momentumStep(others.params, others.momentum, others.grads, lr);
  }
  /// larsTrustRatio of each weight, as a double tensor on the weights' device.
  torch::Tensor trustRatios(const LarsLists& w) const {
    const auto options = w.params.front().options().dtype(torch::kDouble);
    const auto wn = torch::stack(at::_foreach_norm(w.wholes)).to(torch::kDouble);
    const auto gn = w.given.empty() ? torch::stack(at::_foreach_norm(w.whole_grads)).to(torch::kDouble)
                                    : torch::tensor(w.given, torch::kDouble).to(options.device());
    const auto ratio = cfg_.trust_coefficient * wn / (gn + cfg_.weight_decay * wn);
    return torch::where((wn > 0).logical_and(gn > 0), ratio, torch::ones_like(ratio, options));
  }
  void momentumStep(std::vector<torch::Tensor>& params, std::vector<torch::Tensor>& momentum,
                    const std::vector<torch::Tensor>& d, double lr) const {
    at::_foreach_mul_(momentum, cfg_.momentum);
    at::_foreach_add_(momentum, d, lr);
    at::_foreach_sub_(params, momentum);
  }

  std::vector<torch::Tensor> params_;
  std::vector<torch::Tensor> wholes_;  ///< what params_[i] is part of (itself when whole)
  std::vector<double> given_;  ///< the next step's |grad| per tensor (Note [sharded gradients])
  std::vector<torch::Tensor> momentum_;
  OptimConfig cfg_;
  bool multi_tensor_ = false;
};

}  // namespace

std::unique_ptr<Optimizer> makeLars(std::vector<OptimizerParam> params, const OptimConfig& cfg) {
  return std::make_unique<Lars>(std::move(params), cfg);
}

}  // namespace batchdist::worker
