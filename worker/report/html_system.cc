#include "worker/report/html_system.h"

#include <map>
#include <sstream>
#include <vector>

#include "common/error.h"
#include "worker/common/util.h"
#include "worker/report/html.h"

namespace batchdist::worker {
namespace {

const char* const kColors[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728",
                               "#9467bd", "#8c564b", "#e377c2", "#17becf"};

/// One line of a chart: a metric, per rank ("rank 3 process"), or once for the
/// host (the first of its ranks that read it: every rank of a host reads the same).
struct SystemLine {
  const char* key;
  const char* label;
  bool per_host = false;
};

/// One chart of a host's row, scaled.
struct SystemChart {
  const char* id;
  const char* title;
  const char* y_label;
  std::vector<SystemLine> lines;
  double scale = 1;
};

const std::vector<SystemChart>& charts() {
  static const std::vector<SystemChart> kCharts = {
      {"gpu", "GPU busy (NVML)", "%", {{"gpu_util_pct", ""}}},
      {"memory-controller", "GPU memory controller busy", "%", {{"gpu_memory_util_pct", ""}}},
      {"gpu-memory", "GPU memory used", "GiB", {{"gpu_memory_used_mb", ""}}, 1.0 / 1024},
      {"power", "GPU power", "W", {{"gpu_power_w", ""}}},
      {"temperature", "GPU temperature", "C", {{"gpu_temperature_c", ""}}},
      {"sm-clock", "SM clock", "MHz", {{"gpu_sm_clock_mhz", ""}}},
      {"cpu", "CPU: process (% of a core), host (% of all)", "%",
       {{"cpu_process_pct", ""}, {"cpu_host_pct", "host", true}}},
      {"loader", "loader threads busy", "%", {{"loader_busy", ""}}, 100},
  };
  return kCharts;
}

ChartSeries lineOf(const SystemChart& chart, const SystemLine& line,
                   const nlohmann::ordered_json& rank, std::size_t color) {
  ChartSeries s;
  s.name = line.per_host ? std::string(line.label)
                         : strCat("rank ", rank["rank"].get<int>(),
                                  *line.label ? strCat(" ", line.label) : std::string());
  s.color = kColors[color % (sizeof kColors / sizeof *kColors)];
  for (const auto& p : rank["series"]) {
    if (p.contains(line.key)) {
      s.points.emplace_back(p["seconds"].get<double>(), p[line.key].get<double>() * chart.scale);
    }
  }
  s.markers = s.points.size() == 1;
  return s;
}

/// `chart` for the ranks of one host; "" when none of them read its metrics.
std::string hostChart(const SystemChart& chart, const std::string& host,
                      const std::vector<const nlohmann::ordered_json*>& ranks) {
  std::vector<ChartSeries> series;
  for (const auto& line : chart.lines) {
    for (const auto* rank : ranks) {
      ChartSeries s = lineOf(chart, line, *rank, series.size());
      if (s.points.empty()) continue;
      series.push_back(std::move(s));
      if (line.per_host) break;
    }
  }
  if (series.empty()) return "";
  ChartOptions o;
  o.id = strCat("plot-system-", chart.id, "-", host);
  o.title = chart.title;
  o.x_label = "seconds of training";
  o.y_label = chart.y_label;
  o.width = 340;
  o.height = 220;
  return svgLineChart(o, series);
}

/// One host's row: its charts, or a line saying why there are none (a run
/// shorter than report.sample_s took no sample: the row was a heading alone).
std::string hostRow(const std::string& host, const std::vector<const nlohmann::ordered_json*>& ranks,
                    double sample_s) {
  std::string row;
  for (const auto& chart : charts()) row += hostChart(chart, host, ranks);
  if (!row.empty()) return "<div class=\"grid\">\n" + row + "</div>\n";
  int64_t samples = 0;  // the run's, or (an older report) its points'
  for (const auto* rank : ranks) {
    samples += rank->value("run", nlohmann::ordered_json::object()).value("samples", int64_t{0});
    for (const auto& p : rank->value("series", nlohmann::ordered_json::array())) {
      samples += p.value("samples", int64_t{0});
    }
  }
  return strCat("<p class=\"sub\" id=\"system-none-", xmlEscape(host), "\">",
                samples == 0 ? strCat("No sample was taken: training ended before the first one (every ",
                                     sample_s, " s, report.sample_s; lower it for a run this short).")
                            : std::string("No metric could be read on this host (see 'Not read')."),
                "</p>\n");
}

}  // namespace

std::string systemSection(const nlohmann::ordered_json& report) {
  if (!report.contains("system") || !report["system"].contains("ranks")) return "";
  const auto& system = report["system"];
  std::map<std::string, std::vector<const nlohmann::ordered_json*>> by_host;
  for (const auto& rank : system["ranks"]) by_host[rank.value("host", std::string("?"))].push_back(&rank);
  std::ostringstream os;
  os << "<h2>System metrics</h2>\n<p class=\"sub\">Sampled every "
     << system.value("sample_s", 0.0) << " s on a thread of each rank; each point is a metrics "
        "interval's mean (memory and temperature: its maximum).</p>\n";
  for (const auto& [host, ranks] : by_host) {
    os << "<h3 id=\"system-" << xmlEscape(host) << "\">" << xmlEscape(host) << "</h3>\n"
       << hostRow(host, ranks, system.value("sample_s", 0.0));
  }
  std::ostringstream unread;
  for (const auto& rank : system["ranks"]) {
    for (const auto& u : rank.value("unread", nlohmann::ordered_json::array())) {
      unread << "<li>rank " << rank.value("rank", 0) << " (" << xmlEscape(rank.value("host", std::string()))
             << "): " << xmlEscape(u.get<std::string>()) << "</li>\n";
    }
  }
  if (!unread.str().empty()) {
    os << "<p>Not read:</p>\n<ul id=\"system-unread\">\n" << unread.str() << "</ul>\n";
  }
  return os.str();
}

}  // namespace batchdist::worker
