#pragma once
// Which elements of the parameters each rank's optimizer owns under
// dist.shard: optimizer (Note [shard layout]).

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

namespace batchdist::worker {

/// Note [shard layout]: the trainable parameters, in their fixed order, are laid
/// end to end in one flat space of N elements, padded to W x n with
/// n = ceil(N / W); rank r owns the slice [r n, (r+1) n). A parameter may straddle
/// two (or more) slices: each rank steps the pieces of it that fall in its slice,
/// a piece being the parameter's elements [offset, offset + length) in its own
/// row-major order. The pad (W n - N elements, fewer than W) belongs to the last
/// ranks and is never stepped. The layout depends on the shapes and W only, so
/// it is the same on every rank, and a checkpoint's state (Note [sharded
/// checkpoint]) can be re-sliced for any W' by recomputing it.
struct ShardPiece {
  int64_t param = 0;   ///< index into the parameter list
  int64_t offset = 0;  ///< first element within the parameter (row-major)
  int64_t length = 0;  ///< elements
  int64_t flat = 0;    ///< first element in the flat space
};

struct ShardLayout {
  int64_t total = 0;  ///< N: the parameters' elements
  int64_t slice = 0;  ///< n = ceil(N / W)
  int ranks = 1;      ///< W
  std::vector<int64_t> starts;  ///< each parameter's first element in the flat space

  /// The pieces in rank `r`'s slice, in flat order (may be empty: a tiny model on
  /// many ranks).
  std::vector<ShardPiece> piecesOf(int r) const;
  /// Elements of rank r's slice that are parameters, not pad.
  int64_t filled(int r) const;
};

/// The layout of parameters with `numels` elements each over `ranks` ranks.
ShardLayout makeShardLayout(const std::vector<int64_t>& numels, int ranks);

}  // namespace batchdist::worker
