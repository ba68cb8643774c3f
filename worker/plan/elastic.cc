#include "worker/plan/elastic.h"

#include <algorithm>

#include "common/error.h"

namespace batchdist::worker {
namespace {

/// The largest divisor of `share` in [lo, hi], or 0.
int64_t largestDivisor(int64_t share, int64_t lo, int64_t hi) {
  for (int64_t m = std::min(share, hi); m >= lo; --m) {
    if (share % m == 0) return m;
  }
  return 0;
}

}  // namespace

ElasticSplit elasticSplit(const ElasticSlots& in) {
  if (in.global < 1 || in.min_ranks < 1 || in.max_fit < 1 || in.max_fit < in.min_per_gpu) {
    throw Error(strCat("elastic split: global batch ", in.global, ", min ranks ", in.min_ranks,
                       ", largest per-GPU batch that fits ", in.max_fit, ", per-GPU minimum ",
                       in.min_per_gpu, ": not a job's"));
  }
  ElasticSplit out;
  const int64_t top = in.max_ranks > 0 ? std::min(in.slots, in.max_ranks) : in.slots;
  if (top < in.min_ranks) {
    out.why = strCat(top, " rank(s) available, fewer than the minimum of ", in.min_ranks);
    return out;
  }
  for (int64_t w = top; w >= in.min_ranks; --w) {
    if (in.global % w != 0) {
      out.passed_over.push_back(strCat(w, " ranks: G=", in.global, " is not divisible by ", w));
      continue;
    }
    const int64_t share = in.global / w;
    const int64_t m = largestDivisor(share, in.min_per_gpu, in.max_fit);
    if (m == 0) {
      out.passed_over.push_back(strCat(w, " ranks: ", share, " samples a rank have no divisor from ",
                                       in.min_per_gpu, " to ", in.max_fit,
                                       " (the largest per-GPU batch known to fit)"));
      continue;
    }
    out.world = w;
    out.per_gpu = m;
    out.accum = share / m;
    out.why = strCat("G=", in.global, " = ", m, " per GPU x ", out.accum, " accumulation x ", w,
                     " ranks", w < top ? strCat(", the largest world of ", top, " or fewer with an equal split") : "");
    return out;
  }
  out.why = strCat("no world from ", top, " down to ", in.min_ranks,
                   " ranks has an equal split of G=", in.global, " into per-GPU batches from ",
                   in.min_per_gpu, " to ", in.max_fit);
  return out;
}

}  // namespace batchdist::worker
