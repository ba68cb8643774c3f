#pragma once
// A callback after autograd has accumulated a parameter's gradient, for the
// collectives that start while backward still runs (Note [reducer hooks]).

#include <ATen/core/Tensor.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "collective/communicator.h"

namespace torch::autograd {
struct Node;
}

namespace batchdist::collective {

/// Note [reducer hooks]: one post-hook per parameter on its gradient accumulator
/// (AccumulateGrad), so `on_ready(i)` runs once per backward per parameter i that
/// got a gradient, after autograd has put it into .grad (a parameter used twice
/// in the graph is accumulated once: autograd sums its inputs first). The hooks
/// hold the callback, and the accumulators outlive their owner (they live as long
/// as the parameters, and a second owner may be built over the same model: the
/// batch search's candidates, a test). So the destructor removes every hook it
/// added; a backward after it never reaches a freed owner, and a gradient is seen
/// by the live owner alone. (Destroying it while a backward over its parameters
/// runs is not supported, as in c10d.) On CUDA the callback runs on the autograd
/// engine's device thread, the caller's thread waiting in backward().
class GradReadyHooks {
 public:
  using Callback = std::function<void(std::size_t)>;
  /// Throws CollectiveError naming `owner` for a parameter with no accumulator (it
  /// does not require grad, or is not a leaf).
  GradReadyHooks(const std::vector<at::Tensor>& params, Callback on_ready, const char* owner);
  ~GradReadyHooks();
  GradReadyHooks(const GradReadyHooks&) = delete;
  GradReadyHooks& operator=(const GradReadyHooks&) = delete;

 private:
  struct Hook {
    std::shared_ptr<void> keep;  // the accumulator's own pointer type (1.13 / 2.x), held
    torch::autograd::Node* accumulator = nullptr;
    uintptr_t key = 0;  // removes the hook again
  };
  std::vector<Hook> hooks_;
};

/// Note [ready order]: the order in which the hooks' owner saw its units (the
/// reducer's parameters, the gradient scatter's segments) become ready in its first
/// step, agreed over the ranks: rank 0's `seen`, then every unit of `initial` rank 0
/// did not see (no gradient, or a failed backward), in `initial`'s order. Ranks may
/// see different orders (threads on CUDA), and collectives must start in one order
/// everywhere, so everyone takes rank 0's. Collective (one broadcast, none when
/// `initial` is empty): every rank calls it at the same point.
std::vector<std::size_t> agreeReadyOrder(Communicator& comm, const std::vector<std::size_t>& seen,
                                         const std::vector<std::size_t>& initial);

}  // namespace batchdist::collective
