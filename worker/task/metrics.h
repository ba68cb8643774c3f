#pragma once
// Named evaluation figures (Note [task] in worker/task/task.h). Pure data, no torch:
// the results and the report carry them.

#include <string>
#include <vector>

namespace batchdist::worker {

/// One named figure of an evaluation, e.g. {"accuracy", 0.9861}.
struct Metric {
  std::string name;
  double value = 0;
};
/// In the task's order (classification: accuracy; regression: mse, mae).
using Metrics = std::vector<Metric>;

/// The value of metric `name` in `m`, or `fallback` when it has none.
inline double metricValue(const Metrics& m, const std::string& name, double fallback = 0) {
  for (const auto& x : m) {
    if (x.name == name) return x.value;
  }
  return fallback;
}

}  // namespace batchdist::worker
