#pragma once
// The gradient reducer: gradients summed over the ranks while backward still runs.
//
// Note [overlapped reducer] (in the spirit of c10d's Reducer, Li et al., VLDB 2020):
//  - Every parameter's .grad is a view into one flat bucket tensor, so autograd
//    accumulates straight into the buffer the allreduce sends: no copy in or out.
//  - A post-hook on each parameter's gradient accumulator counts the bucket's
//    pending gradients; when the last one is in, the bucket's allreduce starts,
//    while autograd computes the gradients of earlier layers.
//  - Hooks act only on the last micro-batch of an accumulation window (prepare()
//    says which): the others accumulate locally and send nothing.
//  - Buckets start strictly in index order on every rank (a ready bucket waits
//    for the ones before it), so every rank issues the same collectives in the
//    same order: Gloo and NCCL match collectives by order.
//  - finish() starts whatever did not start from a hook (parameters that got no
//    gradient this step: their zeroed views are sent, so no rank waits), then
//    waits for all buckets.
//  - After the first step, buckets are rebuilt in the order gradients really
//    became ready (rank 0's order, broadcast, so all ranks agree).
//  - The last bucket carries the tail of Note [side channel] (grad_sync.h):
//    the side channel (SideChannel, e.g. a stop request or an out-of-memory
//    that every rank must honour at the same step),
//    then one slot for this rank's squared gradient norm (with norms measured,
//    each bucket's squared norm is taken just before it is sent: the rank's own
//    gradient, final, not yet summed; the running total goes here; Note
//    [gradient norms] in collective/grad_sync.h), then W slots: each rank writes, into its own slot, how long its step took
//    until that bucket started (the end of its backward); the sum gives every
//    rank's time, so a rank knows how long it waited in finish() for a slower
//    peer (skew) rather than for the network.
//  - The last bucket starts only from finish(), never from a hook, so the side
//    channel can still say what happened during the whole step: a rank whose
//    backward failed halfway (out of memory) sets it after the failure and it
//    still travels (Note [oom back-off] in worker/train/oom_guard.h). It costs
//    little overlap: with buckets in ready order the last one's gradients are
//    the last of backward.
// On CUDA, c10d's NCCL backend runs the collectives on its own stream after an
// event on the stream that produced the gradients, and wait() makes the current
// stream wait for them: the optimizer sees summed gradients without a host sync.

#include <ATen/core/Tensor.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "collective/communicator.h"
#include "collective/grad_hooks.h"
#include "collective/grad_sync.h"

namespace batchdist::collective {

class Reducer : public GradientSync {
 public:
  /// `params` (those that require grad) must be identical in order, shape and
  /// dtype on every rank. Their .grad becomes a view into the buckets.
  Reducer(Communicator& comm, std::vector<at::Tensor> params, std::size_t bucket_bytes);
  ~Reducer();
  Reducer(const Reducer&) = delete;
  Reducer& operator=(const Reducer&) = delete;

  /// Zeroes every gradient (the bucket buffers), re-attaching any .grad that was
  /// replaced or dropped.
  void zeroGrad() override;
  /// The same: the gradients stay views of the buckets.
  void dropGrad() override { zeroGrad(); }
  /// Nothing: buckets may be in flight; sumGradients() sends what it has (zeros,
  /// or partial sums that every rank discards) and the next zeroGrad() clears it.
  void backwardFailed() override {}
  void beforeBackward(bool final_micro) override { prepare(final_micro); }
  /// setSide(side), then finish().
  SideChannel sumGradients(const SideChannel& side) override;

  /// Before a micro-batch's backward. `final_micro`: the last of the accumulation
  /// window (only then do hooks start allreduces). `side`: this rank's value of
  /// the side channel, summed over the ranks (read it from finish()).
  void prepare(bool final_micro, const SideChannel& side = {});

  /// Replaces this rank's side channel value for the current step (given to
  /// prepare()); any time before finish(), also after a backward that failed.
  void setSide(const SideChannel& side);

  /// After the final micro-batch's backward: starts the buckets no hook started,
  /// waits for all of them. Every gradient then holds its sum over the ranks.
  /// Returns the side channel summed over the ranks. Every rank must call it at
  /// every step, also one whose backward failed (it sends what it has: zeros, or
  /// partial sums that every rank then discards); after the first step it
  /// rebuilds the buckets in ready order (a collective).
  SideChannel finish();

  std::size_t bucketCount() const override { return buckets_.size(); }
  /// Bucket allreduces started so far (from hooks or finish()).
  int64_t collectivesStarted() const { return started_total_; }
  /// Of those, started from an autograd hook, i.e. during backward.
  int64_t startedFromHooks() const { return started_from_hooks_; }
  /// Whether the buckets have been rebuilt in ready order.
  bool rebuilt() const { return rebuilt_; }
  /// After finish(): how much later than this rank the slowest rank reached the
  /// end of its backward in the last step (seconds, >= 0): waiting for it is
  /// skew, not communication.
  double lastSkewSeconds() const override { return last_skew_s_; }

  /// Measure the norms of Note [gradient norms] at every step (off by default;
  /// only with more than one rank): one pass over each bucket before it is sent,
  /// one after finish() has summed it.
  void setMeasureNorms(bool on) override { measure_ = on && comm_.size() > 1; }
  /// The norms of the last finish() (valid = false when not measured).
  const GradSqNorms& lastNorms() const override { return norms_; }

 private:
  struct Bucket {
    std::vector<std::size_t> params;  // indices into params_
    at::Tensor flat;                  // + the tail (side channel, arrivals) in the last
    std::size_t pending = 0;          // gradients still to come this step
    bool ready = false;
    std::unique_ptr<PendingWork> work;
  };

  void build(const std::vector<std::size_t>& order);
  void attachViews();
  void onGradReady(std::size_t param);
  void startReadyBuckets(bool from_hook);  // holds mu_
  void rebuildInReadyOrder();
  void stampArrival(Bucket& bucket);  // the last bucket: this rank's step time
  TailLayout tail() const;  // Note [side channel]
  at::Tensor sideSlot() const;
  at::Tensor arrivalSlots() const;
  at::Tensor normSlot() const;
  /// Note [host tail]: the last bucket's tail is a handful of numbers; written
  /// and read as tensors (narrow, fill_, to, cpu, stack, item), finish()'s work
  /// before and after its wait took ~70-75 us a step on the CPU (~20 us through
  /// the pointer), over 10 % of a quickstart step. For a host float
  /// bucket they are read and written through this pointer instead; nullptr
  /// otherwise (a GPU or low-precision bucket keeps the tensor path).
  float* hostTail() const;
  /// The last bucket's tail after the allreduce, [side channel][norm][arrivals],
  /// on the host: through hostTail(), or one copy from the device.
  std::vector<double> summedTail() const;
  /// Sum over buckets of |summed gradient|^2 (Note [gradient norms]).
  double summedSqNorm() const;
  int64_t paramElements(const Bucket& bucket) const;

  /// A running sum of squared gradient norms (Note [gradient norms]): in double
  /// on the host for host buckets (Note [host tail]), else a device tensor, read
  /// with one sync.
  struct SqNormSum {
    bool host = true;
    double on_host = 0;
    at::Tensor on_device;  // double; undefined while nothing was added
    void add(const at::Tensor& g);
    double value() const;
  };
  SqNormSum sqNormSum() const { return SqNormSum{hostTail() != nullptr, 0, {}}; }

  Communicator& comm_;
  std::vector<at::Tensor> params_;
  std::size_t bucket_bytes_;
  std::vector<Bucket> buckets_;
  std::vector<std::size_t> bucket_of_;       // param -> bucket
  std::vector<std::size_t> ready_order_;     // first step: param ready order
  std::vector<bool> seen_;
  std::mutex mu_;
  bool final_ = false;
  bool in_step_ = false;
  std::size_t next_bucket_ = 0;
  SideChannel side_{};
  bool rebuilt_ = false;
  int64_t steps_ = 0;
  int64_t started_total_ = 0;
  int64_t started_from_hooks_ = 0;
  double step_started_ = 0;     // monotonic seconds at zeroGrad()
  double last_skew_s_ = 0;
  bool measure_ = false;
  SqNormSum local_sq_;  // this step's own squared norm so far
  GradSqNorms norms_;
  /// Last: removed first, before anything onGradReady() touches (Note [reducer hooks]).
  std::unique_ptr<GradReadyHooks> hooks_;
};

}  // namespace batchdist::collective
