#pragma once
// OUTPUT/report.html: one self-contained page (inline SVG and CSS, no script, no
// network) with the plan, the batch search, the training curves, the time
// breakdown, the diagnosis and the gradient noise scale.

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

#include "worker/train/result.h"

namespace batchdist::worker {

/// The page for a run. `report`: the run report (runReport()); `search`: the
/// search.json document, or null when the batch was not searched. The search
/// is read tolerantly (fields it lacks are left out of the plot): per candidate
/// `per_gpu_batch`, `samples_per_s`, `peak_memory_mb`, `failed`, `chosen`, and an
/// interval on samples/s when present (`ci_low`/`ci_high`, or a `[low, high]`
/// array under `ci`, `interval` or `samples_per_s_ci`). `metrics`: the points of
/// metrics.jsonl.
std::string reportHtml(const nlohmann::ordered_json& report, const nlohmann::ordered_json& search,
                       const std::vector<MetricPoint>& metrics);

/// One line chart as inline SVG (exposed for tests).
struct ChartSeries {
  std::string name;
  std::string color;
  std::vector<std::pair<double, double>> points;  ///< (x, y), in x order
  bool line = true;     ///< joined by a polyline
  bool markers = false; ///< a dot per point
};
struct ChartOptions {
  std::string id;       ///< the svg element's id
  std::string title;
  std::string x_label;
  std::string y_label;
  bool log_y = false;
  double hline = -1;           ///< a dashed horizontal reference line (< 0: none)
  std::string hline_label;
  double width = 460, height = 260;
};
std::string svgLineChart(const ChartOptions& opt, const std::vector<ChartSeries>& series);

}  // namespace batchdist::worker
