#pragma once
// Robust timing statistics for the batch search (Note [adaptive timing] in
// worker/search/search.h). Pure functions, no torch.

#include <cstdint>
#include <vector>

namespace batchdist::worker {

/// The median of a sample and an approximate 95 % confidence interval for it.
struct MedianEstimate {
  double median = 0;
  double half_width = 0;  ///< absolute; +infinity below kMinSamples samples
  int64_t n = 0;
  /// half_width / median (+infinity when unknown).
  double relative() const;
};

/// Fewer samples than this give no interval (the spread cannot be estimated).
constexpr int64_t kMinSamples = 5;

/// Median and its 95 % half-width 1.96 * sqrt(pi/2) * sigma / sqrt(n), with sigma
/// estimated robustly as 1.4826 * MAD: a step stalled by the scheduler moves
/// neither the median nor the spread estimate, unlike the mean and the standard
/// deviation. `xs` is taken by value (sorted inside).
MedianEstimate medianEstimate(std::vector<double> xs);

/// The median of `xs` (0 for none).
double median(std::vector<double> xs);

}  // namespace batchdist::worker
