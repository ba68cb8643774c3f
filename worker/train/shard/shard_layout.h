#pragma once
// Which elements of the parameters each rank owns under dist.shard: optimizer
// and gradients (Note [shard layout]).

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

namespace batchdist::worker {

/// Note [shard layout]: the trainable parameters, in their fixed order, are cut
/// into segments of consecutive parameters, and each segment k of n_k elements is
/// laid out in one flat space padded to W x s_k elements, s_k = ceil(n_k / W);
/// rank r owns chunk r of every segment, [base_k + r s_k, base_k + (r+1) s_k), and
/// keeps its chunks end to end (its shard: sum_k s_k elements).
///  - dist.shard: optimizer (ZeRO-1) has one segment: rank r's slice is one
///    contiguous range [r n, (r+1) n), n = ceil(N / W), the pad (fewer than W
///    elements) at the end of the space.
///  - dist.shard: gradients (ZeRO-2) has a segment per gradient bucket
///    (dist.bucket_mb; a parameter larger than that is a segment of its own):
///    each segment is one reduce-scatter of W s_k elements and one in-place
///    all-gather (Note [sharded gradients]), so no buffer of the whole gradient
///    is ever needed; the pads (fewer than W elements per segment) are never
///    stepped.
/// A parameter may straddle two (or more) chunks: each rank steps the pieces of it
/// that fall in its chunks, a piece being the parameter's elements [offset,
/// offset + length) in its own row-major order. The layout depends on the shapes,
/// W and the segment size only, so it is the same on every rank; the packed space
/// (the parameters end to end, no pad) does not depend on them at all, which is
/// how a checkpoint's state (Note [sharded checkpoint]) is re-sliced for any W'
/// or segmentation.
struct ShardPiece {
  int64_t param = 0;   ///< index into the parameter list
  int64_t offset = 0;  ///< first element within the parameter (row-major)
  int64_t length = 0;  ///< elements
  int64_t flat = 0;    ///< first element in the flat (padded) space
  int64_t packed = 0;  ///< first element in the packed space (no pad)
  int64_t owned = 0;   ///< first element in the rank's shard (its chunks end to end)
};

/// One segment: parameters [first, end), n_k elements from `base` in the flat space.
struct ShardSegment {
  int64_t first = 0, end = 0;  ///< parameter indices
  int64_t base = 0;            ///< first element in the flat space
  int64_t elements = 0;        ///< n_k: the parameters' elements
  int64_t chunk = 0;           ///< s_k = ceil(n_k / W)
  int64_t owned = 0;           ///< first element of chunk r in rank r's shard
};

struct ShardLayout {
  int64_t total = 0;  ///< N: the parameters' elements
  int64_t slice = 0;  ///< one rank's shard: sum_k s_k (one segment: ceil(N / W))
  int ranks = 1;      ///< W
  std::vector<int64_t> starts;  ///< each parameter's first element in the flat space
  std::vector<int64_t> packed;  ///< ... in the packed space
  std::vector<ShardSegment> segments;

  /// Elements of the flat space: W x slice.
  int64_t flatSize() const { return slice * ranks; }
  /// The pieces in rank `r`'s chunks, in flat order (may be empty: a tiny model
  /// on many ranks).
  std::vector<ShardPiece> piecesOf(int r) const;
  /// Elements of rank r's shard that are parameters, not pad.
  int64_t filled(int r) const;
};

/// The layout of parameters with `numels` elements each over `ranks` ranks, in
/// segments of at most `segment_elements` (0: one segment, ZeRO-1's).
ShardLayout makeShardLayout(const std::vector<int64_t>& numels, int ranks,
                            int64_t segment_elements = 0);

/// The layout with a segment per unit (Note [parameter units]): segment k holds
/// parameters [ends[k-1], ends[k]) (ends increasing, the last = numels.size(); a
/// unit without parameters is a segment of 0 elements). The packed space is
/// makeShardLayout's.
ShardLayout makeUnitShardLayout(const std::vector<int64_t>& numels, int ranks,
                                const std::vector<int64_t>& ends);

}  // namespace batchdist::worker
