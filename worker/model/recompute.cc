#include "worker/model/recompute.h"

#include <ATen/autocast_mode.h>
#include <torch/torch.h>

#include <mutex>
#include <utility>

#include "common/device_compat.h"
#include "common/error.h"

namespace batchdist::worker {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

/// What the forward leaves for the recompute (Note [activation recompute]):
/// the block, the random state before it, autocast's state. Held by the
/// autograd context as a capsule (its IValue map takes no std::function).
struct RecomputeState : torch::CustomClassHolder {
  BlockForward block;
  std::vector<at::Tensor> params;  ///< the leaves themselves: their gradients are asked for
  at::Device device = at::kCPU;
  at::Tensor cpu_rng, cuda_rng;
  bool autocast = false;
  at::ScalarType autocast_dtype = at::kBFloat16;
  bool input_requires_grad = false;
  std::vector<at::Tensor> kept;  ///< Note [recompute replay]: what the first pass kept
  std::size_t next_kept = 0;     ///< the replay's place in `kept`
};

/// Note [recompute replay]: the pass of the block running on this thread.
thread_local RecomputePass t_pass = RecomputePass::kNone;
thread_local RecomputeState* t_state = nullptr;

/// Sets this thread's pass and state for a scope, and restores what was there.
class PassScope {
 public:
  PassScope(RecomputePass pass, RecomputeState* state) : pass_(t_pass), state_(t_state) {
    t_pass = pass;
    t_state = state;
  }
  ~PassScope() {
    t_pass = pass_;
    t_state = state_;
  }
  PassScope(const PassScope&) = delete;
  PassScope& operator=(const PassScope&) = delete;

 private:
  RecomputePass pass_;
  RecomputeState* state_;
};

/// For the recompute's span: the random state and autocast as they were at the
/// forward; what backward found comes back afterwards, however the span ends.
class ForwardConditions {
 public:
  explicit ForwardConditions(const RecomputeState& s)
      : device_(s.device), cpu_rng_(compat::cpuRngState()), cuda_rng_(compat::cudaRngState(s.device)),
        autocast_(compat::autocastEnabled(s.device.type())),
        autocast_dtype_(compat::autocastDtype(s.device.type())), replayed_autocast_(s.autocast) {
    compat::setCpuRngState(s.cpu_rng);
    compat::setCudaRngState(device_, s.cuda_rng);
    compat::setAutocast(device_.type(), s.autocast, s.autocast_dtype);
    if (replayed_autocast_) at::autocast::increment_nesting();
  }
  ~ForwardConditions() {
    // The recompute's cached casts of the weights go with it (as AutocastScope).
    if (replayed_autocast_ && at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
    compat::setAutocast(device_.type(), autocast_, autocast_dtype_);
    compat::setCudaRngState(device_, cuda_rng_);
    compat::setCpuRngState(cpu_rng_);
  }
  ForwardConditions(const ForwardConditions&) = delete;
  ForwardConditions& operator=(const ForwardConditions&) = delete;

 private:
  at::Device device_;
  at::Tensor cpu_rng_, cuda_rng_;
  bool autocast_;
  at::ScalarType autocast_dtype_;
  bool replayed_autocast_;
};

/// Note [activation recompute]: forward without autograd (Function::apply runs
/// it with grad mode off), backward by a recompute.
struct RecomputeFunction : public torch::autograd::Function<RecomputeFunction> {
  static at::Tensor forward(AutogradContext* ctx, at::Tensor x, at::TensorList params,
                            c10::intrusive_ptr<RecomputeState> state) {
    state->params = params.vec();
    state->device = x.device();
    state->cpu_rng = compat::cpuRngState();
    state->cuda_rng = compat::cudaRngState(x.device());
    state->autocast = compat::autocastEnabled(x.device().type());
    state->autocast_dtype = compat::autocastDtype(x.device().type());
    state->input_requires_grad = x.requires_grad();
    at::Tensor y;
    {
      PassScope pass(RecomputePass::kFirst, state.get());
      y = state->block(x);
    }
    ctx->save_for_backward({x});
    ctx->saved_data["state"] = c10::IValue::make_capsule(std::move(state));
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto holder = ctx->saved_data["state"].toCapsule();
    auto& state = *static_cast<RecomputeState*>(holder.get());
    const auto saved = ctx->get_saved_variables();
    if (!grads[0].defined()) return variable_list(state.params.size() + 2);
    variable_list inputs;
    at::Tensor x = saved[0].detach().requires_grad_(state.input_requires_grad);
    if (state.input_requires_grad) inputs.push_back(x);
    for (const auto& p : state.params) inputs.push_back(p);
    at::Tensor y;
    {
      ForwardConditions conditions(state);
      torch::AutoGradMode grad_mode(true);
      PassScope pass(RecomputePass::kReplay, &state);
      state.next_kept = 0;
      y = state.block(x);
    }
    auto computed = torch::autograd::grad({y}, inputs, {grads[0]}, /*retain_graph=*/false,
                                          /*create_graph=*/false, /*allow_unused=*/true);
    variable_list out;
    std::size_t next = 0;
    out.push_back(state.input_requires_grad ? computed[next++] : at::Tensor());
    while (next < computed.size()) out.push_back(computed[next++]);
    out.push_back(at::Tensor());  // the state
    return out;
  }
};

}  // namespace

RecomputePass recomputePass() { return t_pass; }

void keepForReplay(const at::Tensor& t) {
  if (t_pass == RecomputePass::kFirst && t_state != nullptr) t_state->kept.push_back(t.detach());
}

at::Tensor takeReplayed() {
  if (t_pass != RecomputePass::kReplay || t_state == nullptr ||
      t_state->next_kept >= t_state->kept.size()) {
    throw Error("activation recompute: the replay of a block asked for a value its first pass "
                "did not keep (the two passes took different paths)");
  }
  return t_state->kept[t_state->next_kept++];
}

at::Tensor recomputed(const BlockForward& block, const at::Tensor& x,
                      const std::vector<at::Tensor>& params) {
  if (!at::GradMode::is_enabled()) return block(x);
  std::vector<at::Tensor> trainable;
  for (const auto& p : params) {
    if (p.requires_grad()) trainable.push_back(p);
  }
  if (trainable.empty() && !x.requires_grad()) return block(x);
  auto state = c10::make_intrusive<RecomputeState>();
  state->block = block;
  return RecomputeFunction::apply(x, at::TensorList(trainable), std::move(state));
}

BlockForward recomputing(BlockForward block, std::vector<at::Tensor> params) {
  return [block = std::move(block), params = std::move(params)](const at::Tensor& x) {
    return recomputed(block, x, params);
  };
}

}  // namespace batchdist::worker
