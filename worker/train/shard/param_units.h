#pragma once
// dist.shard: parameters: each rank keeps 1/W of every unit's parameters, and a
// unit is whole only while it runs (Note [parameter units] in worker/model/units.h).

#include <ATen/core/Tensor.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "collective/communicator.h"
#include "worker/model/units.h"
#include "worker/train/shard/shard_layout.h"

namespace batchdist::worker {

/// Note [parameter units]: the units' storage and the hooks the model runs them
/// through. At construction (no collective: every rank holds the same initial
/// weights) each unit's trainable parameters become views of one buffer of
/// W s_k elements (segment k of makeUnitShardLayout), chunk r of which is copied
/// into this rank's shard (owned(), the layout's slice elements, what the
/// optimizer steps: Note [sharded optimizer]), and every buffer is freed.
class ParamUnits : public UnitHooks {
 public:
  /// `params`: the trainable parameters, in order (as the update strategy's);
  /// `units`: Model::units(), whose trainable parameters must be consecutive in
  /// `params` and cover them (Error otherwise: a model's mistake, not the user's).
  /// `prefetch` (dist.prefetch): the next unit's all-gather starts as a unit
  /// begins (forward: the one after; backward: the one before), so it runs under
  /// the unit's compute.
  ParamUnits(collective::Communicator& comm, const std::vector<at::Tensor>& params,
             std::vector<ParamUnit> units, bool reshard_after_forward, bool prefetch = true);
  ~ParamUnits() override;
  ParamUnits(const ParamUnits&) = delete;
  ParamUnits& operator=(const ParamUnits&) = delete;

  const ShardLayout& layout() const { return layout_; }
  /// This rank's chunks of every unit's parameters, end to end.
  const at::Tensor& owned() const { return owned_; }

  void beforeUnit(std::size_t k) override;
  void afterUnit(std::size_t k, const at::Tensor& y) override;
  void gatherAll() override;
  void releaseAll(bool absorb_writes) override;
  void failBeforeUnit(std::size_t k) override { fail_before_ = static_cast<int64_t>(k); }

  /// Segment (unit) k's gradients have all reached the gradient scatter: free it.
  void gradientsIn(std::size_t k);
  /// After a step's backward: free what is still whole (a unit some parameter of
  /// which got no gradient).
  void endBackward();

  /// All-gathers made since construction (one per unit made whole), and of those
  /// the ones started ahead (prefetched).
  int64_t gathers() const { return gathers_; }
  int64_t prefetched() const { return prefetched_; }
  /// Units whole now, and the most at once in steps since resetPeak() (a
  /// whole-model scope, gatherAll(), does not count).
  int64_t liveUnits() const { return live_count_; }
  int64_t peakLiveUnits() const { return peak_live_; }
  /// Bytes of whole units now, and the most at once since resetPeak().
  int64_t liveBytes() const { return live_bytes_; }
  int64_t peakLiveBytes() const { return peak_bytes_; }
  void resetPeak() {
    peak_live_ = live_count_;
    peak_bytes_ = live_bytes_;
  }

 private:
  void gather(std::size_t k);
  /// Starts gathering unit k (and its uses) without waiting; gather() waits.
  void prefetch(std::size_t k);
  void allocate(std::size_t k);
  void release(std::size_t k);
  /// k and the units it uses (Note [parameter units]: the head reads wte).
  std::vector<std::size_t> withUses(std::size_t k) const;
  /// This rank's chunk of unit k's whole parameters into its shard.
  void keepChunk(std::size_t k);
  void gatherWithUses(std::size_t k);
  void releaseWithUses(std::size_t k);
  /// Unit k's gather in the current pass, then the next unit's started.
  void enter(std::size_t k, bool forward);
  std::vector<int64_t> unitEnds(const std::vector<at::Tensor>& params) const;

  collective::Communicator& comm_;
  std::vector<ParamUnit> units_;
  bool reshard_;
  bool prefetch_;
  ShardLayout layout_;
  at::Tensor owned_;
  std::vector<at::Tensor> full_;  ///< per unit: W s_k elements, its storage freed when not whole
  std::vector<bool> live_;         ///< memory allocated (gathered, or a gather in flight)
  std::vector<std::unique_ptr<collective::PendingWork>> pending_;  ///< prefetches in flight
  int64_t fail_before_ = -1;      ///< failBeforeUnit()'s unit, once
  int depth_ = 0;                 ///< gatherAll() scopes open
  bool absorb_ = false;           ///< a scope inside asked for its writes to be kept
  int64_t gathers_ = 0, prefetched_ = 0;
  int64_t live_count_ = 0, peak_live_ = 0, live_bytes_ = 0, peak_bytes_ = 0;
};

}  // namespace batchdist::worker
