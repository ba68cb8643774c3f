#include "worker/train/shard/shard_layout.h"

#include <algorithm>

namespace batchdist::worker {
namespace {

void addSegment(ShardLayout& l, int64_t first, int64_t end, int64_t elements) {
  ShardSegment s;
  s.first = first;
  s.end = end;
  s.base = l.flatSize();
  s.elements = elements;
  s.chunk = (elements + l.ranks - 1) / l.ranks;
  s.owned = l.slice;
  for (int64_t i = first; i < end; ++i) {
    l.starts.push_back(s.base + l.packed[static_cast<std::size_t>(i)] -
                       l.packed[static_cast<std::size_t>(first)]);
  }
  l.slice += s.chunk;
  l.segments.push_back(s);
}

/// A layout of no segment yet: W and the packed space (the parameters end to end).
ShardLayout packedLayout(const std::vector<int64_t>& numels, int ranks) {
  ShardLayout l;
  l.ranks = std::max(1, ranks);
  for (const int64_t n : numels) {
    l.packed.push_back(l.total);
    l.total += n;
  }
  return l;
}

}  // namespace

ShardLayout makeShardLayout(const std::vector<int64_t>& numels, int ranks,
                            int64_t segment_elements) {
  ShardLayout l = packedLayout(numels, ranks);
  const int64_t cap = segment_elements > 0 ? segment_elements : l.total;
  int64_t first = 0, elements = 0;
  for (int64_t i = 0; i < static_cast<int64_t>(numels.size()); ++i) {
    const int64_t n = numels[static_cast<std::size_t>(i)];
    if (i > first && elements + n > cap) {
      addSegment(l, first, i, elements);
      first = i;
      elements = 0;
    }
    elements += n;
  }
  if (!numels.empty() || l.segments.empty()) {
    addSegment(l, first, static_cast<int64_t>(numels.size()), elements);
  }
  return l;
}

ShardLayout makeUnitShardLayout(const std::vector<int64_t>& numels, int ranks,
                                const std::vector<int64_t>& ends) {
  ShardLayout l = packedLayout(numels, ranks);
  int64_t first = 0;
  for (const int64_t end : ends) {
    int64_t elements = 0;
    for (int64_t i = first; i < end; ++i) elements += numels[static_cast<std::size_t>(i)];
    addSegment(l, first, end, elements);
    first = end;
  }
  return l;
}

int64_t ShardLayout::filled(int r) const {
  int64_t out = 0;
  for (const auto& s : segments) {
    out += std::min(s.elements, (r + 1) * s.chunk) - std::min(s.elements, r * s.chunk);
  }
  return out;
}

std::vector<ShardPiece> ShardLayout::piecesOf(int r) const {
  std::vector<ShardPiece> out;
  for (const auto& s : segments) {
    const int64_t begin = s.base + r * s.chunk;
    const int64_t end = std::min(s.base + s.elements, begin + s.chunk);
    // The first parameter of the segment that ends after `begin`.
    auto first = starts.begin() + s.first, last = starts.begin() + s.end;
    auto it = std::upper_bound(first, last, begin);
    auto i = static_cast<std::size_t>(std::max<std::ptrdiff_t>(s.first, it - starts.begin() - 1));
    for (; i < static_cast<std::size_t>(s.end) && starts[i] < end; ++i) {
      const int64_t p_end = i + 1 < static_cast<std::size_t>(s.end) ? starts[i + 1] : s.base + s.elements;
      const int64_t a = std::max(begin, starts[i]), b = std::min(end, p_end);
      if (b <= a) continue;  // an empty parameter, or one wholly before the chunk
      const int64_t offset = a - starts[i];
      out.push_back({static_cast<int64_t>(i), offset, b - a, a, packed[i] + offset,
                     s.owned + a - begin});
    }
  }
  return out;
}

}  // namespace batchdist::worker
