#include "worker/model/optimizer.h"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <initializer_list>
#include <map>
#include <sstream>
#include <type_traits>

#include "common/device_compat.h"
#include "common/error.h"
#include "worker/model/archive.h"
#include "worker/model/lars.h"

namespace batchdist::worker {

namespace {

template <typename TorchOpt, typename Options>
class TorchOptimizer : public Optimizer {
  static constexpr bool kSgd = std::is_same_v<TorchOpt, torch::optim::SGD>;
  using State = std::conditional_t<kSgd, torch::optim::SGDParamState, torch::optim::AdamWParamState>;

 public:
  TorchOptimizer(std::vector<torch::Tensor> params, Options opts, StepKernels kernels)
      : opt_(params, opts), tensors_(std::move(params)), kernels_(resolved(kernels)) {}
  /// `order`: the tensors in the order they were given (Note [optimizer state vectors]).
  TorchOptimizer(std::vector<torch::Tensor> order,
                 std::vector<torch::optim::OptimizerParamGroup> groups, Options opts,
                 StepKernels kernels)
      : opt_(std::move(groups), opts), tensors_(std::move(order)), kernels_(resolved(kernels)) {}
  void step(double lr) override {
    for (auto& group : opt_.param_groups()) static_cast<Options&>(group.options()).lr(lr);
    if (kernels_ == StepKernels::kPerTensor) {
      opt_.step();
      return;
    }
    for (auto& group : opt_.param_groups()) {
      if constexpr (kSgd) sgdGroupStep(group, lr);
      else adamwGroupStep(group, lr);
    }
  }
  StepKernels kernels() const override { return kernels_; }
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
  State* find(std::size_t i) { return find(tensors_.at(i)); }
  State* find(const torch::Tensor& p) {
    auto& state = opt_.state();
    auto it = state.find(compat::optimizerStateKey(state, p));
    return it == state.end() ? nullptr : static_cast<State*>(it->second.get());
  }
  State& put(const torch::Tensor& p, std::unique_ptr<State> st) {
    State& out = *st;
    auto& state = opt_.state();
    state[compat::optimizerStateKey(state, p)] = std::move(st);
    return out;
  }
  State& ensure(std::size_t i) { return ensure(tensors_.at(i)); }
  /// `p`'s state, made as the optimizer's first step would find it: zeros, step 0.
  State& ensure(const torch::Tensor& p) {
    if (State* st = find(p)) return *st;
    auto st = std::make_unique<State>();
    // The parameter's layout, as torch::optim's (a channels-last weight: Note
    // [channels last]): the fused kernels need the state laid out as the tensor.
    const auto zeros = [&] { return torch::zeros_like(p, at::MemoryFormat::Preserve); };
    if constexpr (kSgd) {
      st->momentum_buffer(zeros());
    } else {
      st->step(0);
      st->exp_avg(zeros());
      st->exp_avg_sq(zeros());
    }
    return put(p, std::move(st));
  }
  // Note [multi-tensor step]
  // ~~~~~~~~~~~~~~~~~~~~~~~~
  // torch::optim's C++ step loops over the parameters, a few kernels each: on a
  // GPU hundreds of launches a step (ResNet-50 has 161 parameters, GPT-2 small
  // 148). The steps below are torch::optim::SGD's and AdamW's, the same
  // operations in the same order, done by ATen's multi-tensor ops (_foreach_*)
  // over the whole group: a few launches per operation on CUDA. On the CPU they
  // run the same per-tensor kernels, so the update is bitwise torch::optim's
  // (tests/lr_test.cc, MultiTensorStep), but op by op over every tensor rather
  // than tensor by tensor, which loses the cache: on this project's 2-core CI
  // machine GPT-2 small's shapes stepped 0.77x (adamw, width/4) to 1.09x (full
  // width) and ResNet-50's 0.83x (sgd) of torch::optim's loop
  // (bench/optimizer_step.cc). On CUDA, StepKernels::kAuto goes one further, to
  // the fused kernels (one launch a group: Note [fused optimizer steps]) where
  // the LibTorch has them; their arithmetic is torch.optim's fused path, within
  // 1e-6 of these steps rather than bitwise. LARS (lars.cc) steps by the same
  // multi-tensor ops. The state stays torch::optim's (momentum_buffer; step,
  // exp_avg, exp_avg_sq) whichever runs, so checkpoints, old and new, are
  // unchanged in meaning and a run may resume under other kernels.
  void sgdGroupStep(torch::optim::OptimizerParamGroup& group, double lr) {
    torch::NoGradGuard no_grad;
    const auto& o = static_cast<const Options&>(group.options());
    std::vector<torch::Tensor> params, grads;
    for (auto& p : group.params()) {
      if (!p.grad().defined()) continue;
      params.push_back(p);
      grads.push_back(p.grad());
    }
    if (params.empty()) return;
    if (kernels_ == StepKernels::kFused && sgdFused(params, grads, o, lr)) return;
    auto d = o.weight_decay() != 0 ? at::_foreach_add(grads, params, o.weight_decay()) : grads;
    if (o.momentum() != 0) {
      auto bufs = momentumBuffers(params, d, o);
      if (o.nesterov()) d = at::_foreach_add(d, bufs, o.momentum());
      else d = std::move(bufs);
    }
    at::_foreach_add_(params, d, -1 * lr);
  }
  /// torch::optim::SGD's step in one fused kernel (Note [fused optimizer steps]);
  /// false, doing nothing, when only some tensors have momentum buffers (a
  /// checkpoint's, say): the kernel starts all or none.
  bool sgdFused(const std::vector<torch::Tensor>& params, const std::vector<torch::Tensor>& grads,
                const Options& o, double lr) {
    if (!fusable(params, {grads})) return false;
    std::vector<torch::Tensor> bufs;
    bool first = false;
    if (o.momentum() != 0) {
      for (const auto& p : params) {
        if (State* st = find(p)) bufs.push_back(st->momentum_buffer());
      }
      if (!bufs.empty() && (bufs.size() != params.size() || !fusable(params, {bufs}))) return false;
      first = bufs.empty();
      // made as the parameters are laid out (ensure), so fusable still holds
      for (std::size_t i = 0; first && i < params.size(); ++i) bufs.push_back(ensure(params[i]).momentum_buffer());
    }
    compat::fusedSgdStep(params, grads, bufs, o.weight_decay(), o.momentum(), lr, o.dampening(),
                         o.nesterov(), first);
    return true;
  }
  /// The momentum buffers of `params` after this step's update by `d`: a first
  /// step's is a clone of d (as torch::optim's), the others buf * m + d * (1 - dampening).
  std::vector<torch::Tensor> momentumBuffers(const std::vector<torch::Tensor>& params,
                                             const std::vector<torch::Tensor>& d,
                                             const Options& o) {
    std::vector<torch::Tensor> bufs(params.size()), kept, kept_d;
    for (std::size_t i = 0; i < params.size(); ++i) {
      if (State* st = find(params[i])) {
        bufs[i] = st->momentum_buffer();
        kept.push_back(bufs[i]);
        kept_d.push_back(d[i]);
      } else {
        auto first = std::make_unique<State>();
        first->momentum_buffer(torch::clone(d[i]).detach());
        bufs[i] = put(params[i], std::move(first)).momentum_buffer();
      }
    }
    if (!kept.empty()) {
      at::_foreach_mul_(kept, o.momentum());
      at::_foreach_add_(kept, kept_d, 1 - o.dampening());
    }
    return bufs;
  }
  /// torch::optim::AdamW's step (Note [multi-tensor step]): decoupled decay, the
  /// moments, and the bias-corrected update, over the tensors at the same step
  /// count at once (all of them, unless a checkpoint gave them different counts).
  void adamwGroupStep(torch::optim::OptimizerParamGroup& group, double lr) {
    torch::NoGradGuard no_grad;
    const auto& o = static_cast<const Options&>(group.options());
    struct Bucket {
      std::vector<torch::Tensor> params, grads, exp_avg, exp_avg_sq;
    };
    std::map<int64_t, Bucket> by_step;
    std::vector<torch::Tensor> decayed;
    for (auto& p : group.params()) {
      if (!p.grad().defined()) continue;
      decayed.push_back(p);
      State& st = ensure(p);
      st.step(st.step() + 1);
      Bucket& b = by_step[static_cast<int64_t>(st.step())];
      b.params.push_back(p);
      b.grads.push_back(p.grad());
      b.exp_avg.push_back(st.exp_avg());
      b.exp_avg_sq.push_back(st.exp_avg_sq());
    }
    const auto [beta1, beta2] = o.betas();
    const bool fused = kernels_ == StepKernels::kFused &&
                       std::all_of(by_step.begin(), by_step.end(), [](const auto& kv) {
                         const Bucket& b = kv.second;
                         return fusable(b.params, {b.grads, b.exp_avg, b.exp_avg_sq});
                       });
    if (fused) {
      for (auto& [step, b] : by_step) {
        const auto steps = torch::full({static_cast<int64_t>(b.params.size())},
                                       static_cast<double>(step),
                                       b.params.front().options().dtype(torch::kFloat));
        compat::fusedAdamwStep(b.params, b.grads, b.exp_avg, b.exp_avg_sq, steps.unbind(0), lr,
                               beta1, beta2, o.weight_decay(), o.eps());
      }
      return;
    }
    if (o.weight_decay() != 0 && !decayed.empty()) {
      at::_foreach_mul_(decayed, 1 - lr * o.weight_decay());
    }
    for (auto& [step, b] : by_step) {
      const double correction1 = 1 - std::pow(beta1, step);
      const double correction2 = 1 - std::pow(beta2, step);
      at::_foreach_mul_(b.exp_avg, beta1);
      at::_foreach_add_(b.exp_avg, b.grads, 1 - beta1);
      at::_foreach_mul_(b.exp_avg_sq, beta2);
      at::_foreach_addcmul_(b.exp_avg_sq, b.grads, b.grads, 1 - beta2);
      auto denom = at::_foreach_sqrt(b.exp_avg_sq);
      at::_foreach_div_(denom, std::sqrt(correction2));
      at::_foreach_add_(denom, o.eps());
      at::_foreach_addcdiv_(b.params, b.exp_avg, denom, -(lr / correction1));
    }
  }
  /// Whether the fused kernels take these lists (Note [fused optimizer steps]):
  /// one dtype and device, and each tensor's gradient and state laid out as it
  /// (a checkpoint's state, or a mixed-precision TorchScript module, may not be);
  /// otherwise the group steps by the multi-tensor ops, which take any.
  static bool fusable(const std::vector<torch::Tensor>& params,
                      std::initializer_list<std::reference_wrapper<const std::vector<torch::Tensor>>> others) {
    for (std::size_t i = 0; i < params.size(); ++i) {
      const auto& p = params[i];
      if (p.scalar_type() != params.front().scalar_type() || p.device() != params.front().device()) {
        return false;
      }
      for (const auto& list : others) {
        const auto& t = list.get()[i];
        if (t.scalar_type() != p.scalar_type() || t.device() != p.device() ||
            t.strides() != p.strides()) {
          return false;
        }
      }
    }
    return true;
  }
  static torch::Tensor& vectorOf(State& st, std::size_t k) {
    if constexpr (kSgd) {
      return st.momentum_buffer();
    } else {
      return k == 0 ? st.exp_avg() : st.exp_avg_sq();
    }
  }

  StepKernels resolved(StepKernels kernels) const {
    return resolveStepKernels(kernels, !tensors_.empty() && tensors_.front().is_cuda());
  }

  TorchOpt opt_;
  std::vector<torch::Tensor> tensors_;  ///< in the order given, for the state vectors
  StepKernels kernels_;                 ///< resolved (Note [multi-tensor step])
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
  return std::make_unique<AdamW>(std::move(order), std::move(groups), *options(cfg.weight_decay),
                                 cfg.kernels);
}

}  // namespace

StepKernels resolveStepKernels(StepKernels asked, bool on_cuda) {
  if (asked == StepKernels::kAuto) asked = on_cuda ? StepKernels::kFused : StepKernels::kPerTensor;
  if (asked == StepKernels::kFused && !compat::kHasFusedOptimizerSteps) return StepKernels::kMultiTensor;
  return asked;
}

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
                    .weight_decay(cfg.weight_decay),
        cfg.kernels);
  }
  if (cfg.name == OptimName::kAdamw) return makeAdamw(cfg, std::move(params));
  return makeLars(std::move(params), cfg);
}

}  // namespace batchdist::worker
