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

/// Note [gradient norms]: the two squared norms the gradient noise scale needs
/// (worker/train/noise_scale.h), measured by the gradient sum at the cost of one
/// pass over the gradients before it (per bucket, just before the bucket is sent)
/// and one after it, and one more element in a bucket: no extra collective.
///  - `local_sum`: sum over the ranks of each rank's own |g_r|^2, taken before the
///    allreduce (it rides in a slot of the bucket sent last);
///  - `summed`: |sum_r g_r|^2, the squared norm of the summed gradient.
/// Both are in the units of the gradients as given (loss scale and the loss
/// normalisation included); the caller rescales.
struct GradSqNorms {
  double local_sum = 0;
  double summed = 0;
  bool valid = false;  ///< measured at the last sum (measuring on, world size > 1)
};

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

  /// Measure the norms of Note [gradient norms] at every sumGradients() (off by
  /// default; only with more than one rank).
  void setMeasureNorms(bool on) { measure_ = on && comm_.size() > 1; }
  /// The norms of the last sumGradients() (valid = false when not measured).
  const GradSqNorms& lastNorms() const { return norms_; }

 private:
  struct Bucket {
    std::vector<std::size_t> params;  // indices into params_
    at::Tensor flat;
  };
  int64_t paramElements(const Bucket& b) const;
  Communicator& comm_;
  std::vector<at::Tensor> params_;
  std::vector<Bucket> buckets_;
  bool measure_ = false;
  GradSqNorms norms_;
};

/// Overwrites `tensors` on every rank with root's values, coalesced by dtype.
void broadcastCoalesced(Communicator& comm, const std::vector<at::Tensor>& tensors, int root);

}  // namespace batchdist::collective
