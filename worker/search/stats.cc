#include "worker/search/stats.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace batchdist::worker {

double MedianEstimate::relative() const {
  if (!(median > 0) || !std::isfinite(half_width)) return std::numeric_limits<double>::infinity();
  return half_width / median;
}

double median(std::vector<double> xs) {
  if (xs.empty()) return 0;
  std::sort(xs.begin(), xs.end());
  const std::size_t n = xs.size();
  return n % 2 ? xs[n / 2] : 0.5 * (xs[n / 2 - 1] + xs[n / 2]);
}

MedianEstimate medianEstimate(std::vector<double> xs) {
  MedianEstimate e;
  e.n = static_cast<int64_t>(xs.size());
  e.median = median(xs);
  e.half_width = std::numeric_limits<double>::infinity();
  if (e.n < kMinSamples) return e;
  for (auto& x : xs) x = std::abs(x - e.median);
  const double sigma = 1.4826 * median(std::move(xs));
  // Asymptotic standard error of the median of a normal sample: sqrt(pi/2) sigma/sqrt(n).
  constexpr double kZ95 = 1.959964;
  const double kSqrtHalfPi = std::sqrt(std::acos(-1.0) / 2);
  e.half_width = kZ95 * kSqrtHalfPi * sigma / std::sqrt(static_cast<double>(e.n));
  return e;
}

}  // namespace batchdist::worker
