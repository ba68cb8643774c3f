#pragma once
// Gradient averaging over ranks, coalesced into a few large buffers.
//
// Note [gradient buckets]: parameters are grouped (in reverse registration order,
// which is roughly the order backward produces their gradients) into buckets of
// at most `bucket_bytes` of one dtype/device. Each bucket is one flat buffer and
// one allreduce, so a model with hundreds of tensors costs a handful of
// collectives. Buckets are launched asynchronously and waited in order; the
// Reducer (collective/reducer.h) launches them from autograd hooks instead, as
// soon as a bucket's last gradient is ready, overlapping communication with the
// rest of backward. Both are a GradientSync (Note [gradient sync]).

#include <ATen/core/Tensor.h>

#include <cstddef>
#include <memory>
#include <tuple>
#include <vector>

#include "collective/communicator.h"

namespace batchdist::collective {

/// Note [gradient norms]: the two squared norms the gradient noise scale needs
/// (worker/train/step/noise_scale.h), measured by the gradient sum at the cost of one
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
  /// The local gradients summed in `local_sum` per rank: 1 (the step's whole
  /// gradient), or under dist.shard: gradients the accumulation a (one per
  /// micro-batch, each reduce-scattered on its own: Note [sharded gradients]).
  int64_t parts = 1;
};

/// Note [side channel]: the per-step side channel (SideChannel, Note [step wishes]
/// in worker/train/trainer.h) and the gradient norms ride in the tail of the
/// bucket sent last, in every GradientSync, laid out as
///   [the bucket's gradients][side channel: kSideSlots][own |g|^2: 1][arrivals: W or 0]
/// (the arrivals, each rank's step time in its own slot, only in the reducer).
/// Last, because the overlapped reducer starts that bucket only from its
/// sumGradients(), never from a hook: a rank whose backward failed halfway can
/// still say so in it. A model without trainable parameters gets one bucket of
/// the tail alone, so the agreement still travels.
constexpr int64_t kSideSlots = static_cast<int64_t>(std::tuple_size_v<SideChannel>);
struct TailLayout {
  int64_t side = 0;      ///< offset of the side channel in the last bucket
  int64_t norm = 0;      ///< offset of this rank's squared norm
  int64_t arrivals = 0;  ///< offset of the W arrival slots (if any)
  int64_t size = 0;      ///< the tail's length
};
/// The tail after `param_elements` gradient elements, with `arrival_slots` arrivals.
TailLayout tailLayout(int64_t param_elements, int64_t arrival_slots);

/// Note [gradient sync]: how a step's gradients become their sum over the ranks,
/// the communication half of an update strategy (Note [update strategy] in
/// worker/train/step/update_strategy.h, which owns it and forwards the trainer's calls):
///   zeroGrad(); { beforeBackward(final?); backward } x accum; sumGradients(side);
/// with backwardFailed() before sumGradients() on a rank whose backward threw. Two strategies today: the Reducer
/// (dist.overlap: true; buckets start from autograd hooks during the last
/// backward) and the GradientSynchronizer (dist.overlap: false; one pass after
/// backward). Both keep Note [side channel]'s layout; a sharded update strategy
/// brings a third, that reduce-scatters.
class GradientSync {
 public:
  virtual ~GradientSync() = default;
  /// Before a step's first micro-batch: every gradient zero.
  virtual void zeroGrad() = 0;
  /// Every gradient gone (after a step that is not applied), once no bucket is
  /// in flight.
  virtual void dropGrad() = 0;
  /// After a backward that failed on this rank, before sumGradients(): what
  /// this rank sends for its partial gradients (every rank discards the step).
  virtual void backwardFailed() = 0;
  /// Before each micro-batch's backward; `final_micro`: the last of the
  /// accumulation window (the only one whose gradients are sent).
  virtual void beforeBackward(bool final_micro) = 0;
  /// After the final micro-batch's backward, on every rank at every step (also
  /// one whose backward failed: it sends what it has, so no rank waits): every
  /// gradient becomes its sum over the ranks, and `side` is summed in the same
  /// allreduce. Returns the summed side channel. Divide in the loss, not here
  /// (Note [loss normalisation] in the trainer).
  virtual SideChannel sumGradients(const SideChannel& side) = 0;
  /// Measure Note [gradient norms] at every sumGradients() (off by default; only
  /// with more than one rank).
  virtual void setMeasureNorms(bool on) = 0;
  /// The norms of the last sumGradients() (valid = false when not measured).
  virtual const GradSqNorms& lastNorms() const = 0;
  /// How much of the last sumGradients() was spent waiting for a slower rank to
  /// end its backward (seconds; 0 where the strategy cannot tell).
  virtual double lastSkewSeconds() const { return 0; }
  virtual std::size_t bucketCount() const = 0;
};

/// The strategy of dist.overlap: the Reducer (true) or the GradientSynchronizer.
/// `params` as their constructors ask.
std::unique_ptr<GradientSync> makeGradientSync(bool overlap, Communicator& comm,
                                               std::vector<at::Tensor> params,
                                               std::size_t bucket_bytes);

/// The plain strategy: after backward, each bucket's gradients copied into one
/// flat buffer, summed, copied back.
class GradientSynchronizer : public GradientSync {
 public:
  /// `params` must outlive this object and be the same, in the same order, on
  /// every rank.
  GradientSynchronizer(Communicator& comm, std::vector<at::Tensor> params,
                       std::size_t bucket_bytes = 25u << 20);

  void zeroGrad() override;
  /// Gradients set to undefined.
  void dropGrad() override;
  /// dropGrad(): zeros are sent.
  void backwardFailed() override { dropGrad(); }
  void beforeBackward(bool /*final_micro*/) override {}
  /// Replaces every parameter's gradient by its sum over the ranks. A parameter
  /// without a gradient on this rank contributes zeros (and receives the sum).
  SideChannel sumGradients(const SideChannel& side = {}) override;

  std::size_t bucketCount() const override { return buckets_.size(); }
  void setMeasureNorms(bool on) override { measure_ = on && comm_.size() > 1; }
  const GradSqNorms& lastNorms() const override { return norms_; }

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
