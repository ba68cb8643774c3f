#pragma once
// The reduce-scatter half of dist.shard: gradients: each micro-batch's
// gradients summed over the ranks into this rank's shard, segment by segment,
// while backward still runs (Note [gradient scatter]).

#include <ATen/core/Tensor.h>

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

#include "collective/communicator.h"
#include "collective/grad_hooks.h"
#include "worker/train/shard/shard_layout.h"

namespace batchdist::worker {

/// Note [gradient scatter]: how a micro-batch's gradients reach the shard of
/// Note [sharded gradients] (a round: one reduce-scatter per segment of Note
/// [shard layout]), in the spirit of the overlapped reducer (Note [overlapped
/// reducer] in collective/reducer.h) but keeping no buffer of the whole gradient:
///  - A post-hook on each parameter's gradient accumulator (Note [reducer hooks])
///    copies the gradient autograd has just accumulated into its segment's
///    buffer (W s_k elements, allocated zeroed when the segment's first gradient
///    arrives: the pad and any parameter without a gradient stay zero) and frees
///    the parameter's .grad at once. So during backward a rank holds, besides its
///    shard, only the buffers of the segments still filling or in flight, not N.
///  - When a segment's last gradient is in, its reduce-scatter starts (with
///    dist.overlap: from the hook, while autograd computes earlier layers; without
///    it: when the round closes) into the rank's chunk of the shard (the first
///    round of a step) or into a temporary added to it (later rounds, summing the
///    micro-batches).
///  - Segments start in one order on every rank (collectives match by order): a
///    ready segment waits for the ones before it. The order is the segments'
///    reverse (roughly the order backward produces them) for the first step, then
///    the order rank 0 saw them become ready in its first step (broadcast at its
///    end, so every rank agrees), as the reducer rebuilds its buckets.
///  - At most kInFlight segments are in flight: starting one more first retires
///    the oldest (waits for it, adds its temporary, frees its buffer), so the
///    buffers a rank holds stay bounded whatever the model's size. On NCCL the
///    wait only orders the current stream after it; on the CPU the oldest has had
///    a segment's worth of backward to finish.
///  - closeRound() (the next micro-batch's beginRound(), or endStep()) starts
///    what did not start (a segment some parameter of which got no gradient: its
///    buffer as it is, zeros if nothing came) and retires everything. A rank whose
///    backward failed halfway closes its round the same way and makes the rounds
///    it missed with zeros (endStep), so every rank makes the same collectives.
///  - With norms measured, each gradient's |g|^2 is added (on the device) as it
///    is copied: this rank's own gradient per micro-batch (Note [gradient norms]).
class GradientScatter {
 public:
  /// Segments started and not yet retired, at most.
  static constexpr std::size_t kInFlight = 2;

  /// `shard` (the layout's slice elements) receives the sums; `params` as the
  /// layout's, the same on every rank. `learn_order` false: the segments start in
  /// their reverse order in every step (Note [parameter units]: units run
  /// backward in that order), and no step ends with the order's agreement.
  GradientScatter(collective::Communicator& comm, std::vector<at::Tensor> params,
                  const ShardLayout& layout, at::Tensor shard, bool overlap,
                  bool learn_order = true);
  ~GradientScatter();
  GradientScatter(const GradientScatter&) = delete;
  GradientScatter& operator=(const GradientScatter&) = delete;

  /// Before a step: the shard zero, the parameters' gradients freed, no round made.
  void beginStep();
  /// Whether take() adds each gradient's |g|^2 to localSq() (Note [gradient norms]).
  void setMeasureNorms(bool on) { measure_ = on; }
  /// Before a micro-batch's backward: closes the open round, opens the next.
  void beginRound();
  /// After the step's last backward (or a failure): closes the open round and
  /// makes zero rounds up to `rounds`; the shard then holds the step's sum.
  void endStep(int64_t rounds);
  /// A rank that left the step (Note [collective replay]): waits for what is in
  /// flight, drops the buffers, and counts the step's `rounds` made, so endStep()
  /// makes no collective; the shard holds nothing meaningful.
  void abandonStep(int64_t rounds);
  /// This step's own |g|^2 so far, one term per gradient (double, on the device).
  const at::Tensor& localSq() const { return local_sq_; }
  /// Called (from the hook, under the scatter's lock) with segment k once all its
  /// gradients of a round are in: Note [parameter units] frees the unit then.
  void setSegmentDone(std::function<void(std::size_t)> done) { done_ = std::move(done); }

  /// Reduce-scatters started so far, and of those from a hook (during backward).
  int64_t started() const { return started_; }
  int64_t startedFromHooks() const { return started_from_hooks_; }
  /// The most bytes of segment buffers and temporaries held at once since beginStep().
  int64_t peakBufferBytes() const { return peak_bytes_; }
  /// Whether the start order is rank 0's ready order (after the first step).
  bool learnedOrder() const { return learned_; }

 private:
  struct Segment {
    std::size_t pending = 0;  // gradients still to come this round
    bool ready = false;
    at::Tensor buffer;  // W s_k elements while filling or in flight
    at::Tensor out;     // what the reduce-scatter writes: the shard's chunk or a temporary
    std::unique_ptr<collective::PendingWork> work;
  };

  void onGradReady(std::size_t param);
  void take(std::size_t param);       // holds mu_
  void startReady(bool from_hook);    // holds mu_
  void start(std::size_t k, bool from_hook);
  void retireOldest();
  void closeRound();
  void learnOrder();
  at::Tensor allocate(int64_t elements, bool zeroed);
  void release(at::Tensor& t);

  collective::Communicator& comm_;
  std::vector<at::Tensor> params_;
  ShardLayout layout_;
  at::Tensor shard_;
  bool overlap_;
  std::vector<std::size_t> segment_of_;  // parameter -> segment
  std::vector<Segment> segments_;
  std::vector<std::size_t> order_;     // segments in start order
  std::vector<std::size_t> seen_order_;  // first step: segments in the order they became ready
  std::size_t next_ = 0;               // order_[next_] starts next
  std::deque<std::size_t> in_flight_;  // started, not retired, oldest first
  std::mutex mu_;
  bool open_ = false;
  bool measure_ = false;
  bool learned_ = false;
  int64_t round_ = 0;
  int64_t started_ = 0, started_from_hooks_ = 0;
  int64_t live_bytes_ = 0, peak_bytes_ = 0;
  at::Tensor local_sq_;
  std::function<void(std::size_t)> done_;
  /// Last: removed first, before anything onGradReady() touches (Note [reducer hooks]).
  std::unique_ptr<collective::GradReadyHooks> hooks_;
};

}  // namespace batchdist::worker
