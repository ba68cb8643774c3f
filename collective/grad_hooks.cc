#include "collective/grad_hooks.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/utils/lambda_post_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>
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

std::vector<std::size_t> agreeReadyOrder(Communicator& comm, const std::vector<std::size_t>& seen,
                                         const std::vector<std::size_t>& initial) {
  if (initial.empty()) return {};
  std::vector<bool> was_seen(*std::max_element(initial.begin(), initial.end()) + 1);
  std::vector<int64_t> order;
  for (const auto k : seen) {
    was_seen[k] = true;
    order.push_back(static_cast<int64_t>(k));
  }
  for (const auto k : initial) {
    if (!was_seen[k]) order.push_back(static_cast<int64_t>(k));
  }
  auto t = at::tensor(order, at::kLong).to(comm.device());
  comm.broadcast(t, 0);
  t = t.cpu();
  return {t.data_ptr<int64_t>(), t.data_ptr<int64_t>() + t.numel()};
}

}  // namespace batchdist::collective
