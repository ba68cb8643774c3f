#pragma once
// Note [adaptive checkpoint] (worker/train/adapt/adaptive_batch.h): the entries of the
// adaptive batch's record, keyed (checkpoint format 4). A record written by
// formats 2 and 3 held them as positional arrays; those still read, so such a
// checkpoint resumes as before.

#include <nlohmann/json.hpp>

#include <vector>

#include "worker/plan/adapt.h"
#include "worker/train/step/noise_scale.h"
#include "worker/train/result.h"

namespace batchdist::worker::adapt_record {

/// Keyed entries. A figure that is not finite is written as its "unknown" value
/// (JSON has no inf or NaN); a throughput point that is not finite is left out.
nlohmann::ordered_json throughputJson(const std::vector<ThroughputPoint>& points);
nlohmann::ordered_json segmentsJson(const std::vector<AdaptSegment>& segments);
nlohmann::ordered_json historyJson(const std::vector<BatchChange>& history);
nlohmann::ordered_json noiseJson(const NoiseScaleEstimator::State& n);

/// Keyed or positional. Throw nlohmann::json::exception on a damaged entry.
std::vector<ThroughputPoint> throughputFrom(const nlohmann::ordered_json& j);
std::vector<AdaptSegment> segmentsFrom(const nlohmann::ordered_json& j);
std::vector<BatchChange> historyFrom(const nlohmann::ordered_json& j);
NoiseScaleEstimator::State noiseFrom(const nlohmann::ordered_json& j);

}  // namespace batchdist::worker::adapt_record
