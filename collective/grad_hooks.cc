#include "collective/grad_hooks.h"

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/utils/lambda_post_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <utility>

#include "common/error.h"

namespace batchdist::collective {

GradReadyHooks::GradReadyHooks(const std::vector<at::Tensor>& params, Callback on_ready,
                               const char* owner) {
  auto callback = std::make_shared<Callback>(std::move(on_ready));
  try {
    for (std::size_t i = 0; i < params.size(); ++i) {
      auto acc = torch::autograd::impl::grad_accumulator(params[i]);
      if (!acc) {
        throw CollectiveError(strCat(owner, ": parameter ", i, " has no gradient accumulator (it "
                                     "does not require grad, or is not a leaf)"));
      }
      const uintptr_t key = acc->add_post_hook(
          std::make_unique<torch::autograd::utils::LambdaPostHook>(
              [callback, i](const torch::autograd::variable_list& outputs,
                            const torch::autograd::variable_list&) {
                (*callback)(i);
                return outputs;
              }));
      torch::autograd::Node* node = acc.get();
      hooks_.push_back({std::make_shared<decltype(acc)>(acc), node, key});
    }
  } catch (...) {
    for (auto& hook : hooks_) hook.accumulator->del_post_hook(hook.key);
    throw;
  }
}

GradReadyHooks::~GradReadyHooks() {
  for (auto& hook : hooks_) hook.accumulator->del_post_hook(hook.key);
}

}  // namespace batchdist::collective
