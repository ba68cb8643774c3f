#include "worker/train/shard_layout.h"

#include <algorithm>

namespace batchdist::worker {

ShardLayout makeShardLayout(const std::vector<int64_t>& numels, int ranks) {
  ShardLayout l;
  l.ranks = std::max(1, ranks);
  for (const int64_t n : numels) {
    l.starts.push_back(l.total);
    l.total += n;
  }
  l.slice = (l.total + l.ranks - 1) / l.ranks;
  return l;
}

int64_t ShardLayout::filled(int r) const {
  const int64_t begin = std::min(total, r * slice), end = std::min(total, (r + 1) * slice);
  return end - begin;
}

std::vector<ShardPiece> ShardLayout::piecesOf(int r) const {
  std::vector<ShardPiece> out;
  const int64_t begin = r * slice, end = std::min(total, (r + 1) * slice);
  // The first parameter that ends after `begin`.
  auto it = std::upper_bound(starts.begin(), starts.end(), begin);
  std::size_t i = static_cast<std::size_t>(std::max<std::ptrdiff_t>(0, it - starts.begin() - 1));
  for (; i < starts.size() && starts[i] < end; ++i) {
    const int64_t p_end = i + 1 < starts.size() ? starts[i + 1] : total;
    const int64_t a = std::max(begin, starts[i]), b = std::min(end, p_end);
    if (b <= a) continue;  // an empty parameter, or one wholly before the slice
    out.push_back({static_cast<int64_t>(i), a - starts[i], b - a, a});
  }
  return out;
}

}  // namespace batchdist::worker
