#pragma once
// Gradient averaging over ranks, coalesced into a few large buffers.
//
// Note [gradient buckets]: parameters are grouped (in reverse registration order,
// which is roughly the order backward produces their gradients) into buckets of
// at most `bucket_bytes` of one dtype/device. Each bucket is one flat buffer and
// one allreduce, so a model with hundreds of tensors costs a handful of
// collectives. Buckets are launched asynchronously and waited in order; a later
// change can launch a bucket from autograd hooks as soon as its last gradient is
// ready, overlapping communication with the rest of backward.

#include <ATen/core/Tensor.h>

#include <cstddef>
#include <vector>

#include "collective/communicator.h"

namespace batchdist::collective {

class GradientSynchronizer {
 public:
  /// `params` must outlive this object and be the same, in the same order, on
  /// every rank.
  GradientSynchronizer(Communicator& comm, std::vector<at::Tensor> params,
                       std::size_t bucket_bytes = 25u << 20);

  /// Replaces every parameter's gradient by its sum over the ranks. A parameter
  /// without a gradient on this rank contributes zeros (and receives the sum).
  /// Divide in the loss, not here: see Note [loss normalisation] in the trainer.
  /// `side`, if given, is summed over the ranks in the same allreduce (extra
  /// elements of the first bucket): a free channel for per-step agreement, e.g. a
  /// stop request, or an out-of-memory, that every rank must honour at the same step.
  void sumGradients(SideChannel* side = nullptr);

  std::size_t bucketCount() const { return buckets_.size(); }

 private:
  struct Bucket {
    std::vector<std::size_t> params;  // indices into params_
    at::Tensor flat;
  };
  Communicator& comm_;
  std::vector<at::Tensor> params_;
  std::vector<Bucket> buckets_;
};

/// Overwrites `tensors` on every rank with root's values, coalesced by dtype.
void broadcastCoalesced(Communicator& comm, const std::vector<at::Tensor>& tensors, int root);

}  // namespace batchdist::collective
