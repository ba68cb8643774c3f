#include "worker/report/html.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>

#include "common/error.h"
#include "worker/common/console.h"
#include "worker/common/util.h"
#include "worker/model/flops.h"
#include "worker/plan/adapt.h"
#include "worker/report/diagnose.h"
#include "worker/report/html_system.h"

namespace batchdist::worker {
namespace {

/// Short number text for labels: 4 significant digits.
std::string num(double v) {
  char buf[64];
  if (std::abs(v) >= 1000 && std::abs(v) < 1e9) {
    std::snprintf(buf, sizeof buf, "%.0f", v);  // 15000, not 1.5e+04
  } else if (std::abs(v) >= 1e9 || (std::abs(v) < 1e-3 && v != 0)) {
    std::snprintf(buf, sizeof buf, "%.3g", v);
  } else {
    std::snprintf(buf, sizeof buf, "%.4g", v);
  }
  return buf;
}

std::string formatPct(double fraction) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f", 100 * fraction);
  return buf;
}

/// Coordinates in the SVG: one decimal.
std::string px(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f", v);
  return buf;
}

/// About `n` round tick values covering [lo, hi].
std::vector<double> niceTicks(double lo, double hi, int n = 5) {
  std::vector<double> out;
  const double range = hi - lo;
  if (!(range > 0) || !std::isfinite(range)) return {lo};
  const double raw = range / n;
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  double step = mag;
  for (double f : {1.0, 2.0, 2.5, 5.0, 10.0}) {
    if (f * mag >= raw) {
      step = f * mag;
      break;
    }
  }
  for (double t = std::ceil(lo / step) * step; t <= hi + step * 1e-9; t += step) {
    out.push_back(std::abs(t) < step * 1e-9 ? 0.0 : t);
  }
  return out;
}

double jnum(const nlohmann::ordered_json& j, const char* key, double fallback = 0) {
  if (!j.is_object()) return fallback;
  const auto it = j.find(key);
  return it != j.end() && it->is_number() ? it->get<double>() : fallback;
}

std::string jtext(const nlohmann::ordered_json& j, const char* key) {
  if (!j.is_object()) return "";
  const auto it = j.find(key);
  if (it == j.end() || it->is_null()) return "";
  return it->is_string() ? it->get<std::string>() : it->dump();
}

/// The plan's ranks in words: consecutive ranks with the same samples an epoch
/// on one line ("ranks 0&ndash;6: 250 samples an epoch each").
std::string ranksText(const nlohmann::ordered_json& ranks) {
  std::string s;
  for (std::size_t i = 0, j = 0; i < ranks.size(); i = ++j) {
    const auto n = ranks[i].value("samples_per_epoch", nlohmann::ordered_json());
    while (j + 1 < ranks.size() && ranks[j + 1].value("samples_per_epoch", nlohmann::ordered_json()) == n) ++j;
    const auto first = ranks[i].value("rank", static_cast<int64_t>(i));
    const auto last = ranks[j].value("rank", static_cast<int64_t>(j));
    s += strCat(s.empty() ? "" : "<br>", first == last ? strCat("rank ", first)
                                                       : strCat("ranks ", first, "&ndash;", last),
                ": ", xmlEscape(n.dump()), " samples an epoch", first == last ? "" : " each");
  }
  return s.empty() ? "none" : s;
}

/// A plan value for its table cell, in words: a list one item a line ("none"
/// when empty), a record as "key value" pairs; not JSON text.
std::string planText(const std::string& key, const nlohmann::ordered_json& v) {
  const auto records = [](const nlohmann::ordered_json& a) {
    return std::all_of(a.begin(), a.end(), [](const auto& e) { return e.is_object(); });
  };
  if (key == "ranks" && v.is_array() && records(v)) return ranksText(v);
  if (v.is_string()) return xmlEscape(v.get<std::string>());
  if (v.is_array()) {
    std::string s;
    for (const auto& e : v) s += (s.empty() ? "" : "<br>") + planText("", e);
    return s.empty() ? "none" : s;
  }
  if (v.is_object()) {
    std::string s;
    for (const auto& [k, e] : v.items()) s += strCat(s.empty() ? "" : ", ", xmlEscape(k), " ", planText(k, e));
    return s;
  }
  return xmlEscape(v.dump());
}

bool jbool(const nlohmann::ordered_json& j, const char* key) {
  if (!j.is_object()) return false;
  const auto it = j.find(key);
  return it != j.end() && it->is_boolean() && it->get<bool>();
}

/// The interval on a candidate's samples/s, under whichever name search.json
/// gives it (the search's statistics are still settling); ends of 0 (or an
/// empty interval) mean "none".
bool findIntervalAnyName(const nlohmann::ordered_json& c, double* lo, double* hi);
bool findInterval(const nlohmann::ordered_json& c, double* lo, double* hi) {
  return findIntervalAnyName(c, lo, hi) && *hi > *lo && *lo > 0;
}

bool findIntervalAnyName(const nlohmann::ordered_json& c, double* lo, double* hi) {
  static const std::pair<const char*, const char*> kPairs[] = {
      {"ci_low", "ci_high"},
      {"samples_per_s_ci_low", "samples_per_s_ci_high"},
      {"samples_per_s_low", "samples_per_s_high"},
      {"low", "high"},
      {"ci_lo", "ci_hi"}};
  for (const auto& [l, h] : kPairs) {
    if (c.contains(l) && c.contains(h) && c[l].is_number() && c[h].is_number()) {
      *lo = c[l].get<double>();
      *hi = c[h].get<double>();
      return true;
    }
  }
  for (const char* key : {"ci", "interval", "samples_per_s_ci", "samples_per_s_interval"}) {
    if (!c.contains(key)) continue;
    const auto& v = c[key];
    if (v.is_array() && v.size() == 2 && v[0].is_number() && v[1].is_number()) {
      *lo = v[0].get<double>();
      *hi = v[1].get<double>();
      return true;
    }
    if (v.is_object()) {
      for (const auto& [l, h] : kPairs) {
        if (v.contains(l) && v.contains(h) && v[l].is_number() && v[h].is_number()) {
          *lo = v[l].get<double>();
          *hi = v[h].get<double>();
          return true;
        }
      }
    }
  }
  return false;
}

/// Note [tokens per sample]: " (2048 tokens)" after a batch (or a noise scale) of
/// `samples` token windows of `tokens_per_sample` tokens; "" when the samples are
/// not tokens (0).
std::string tokensOf(double samples, double tokens_per_sample) {
  if (tokens_per_sample <= 0) return "";
  return " (" + noiseScaleText(samples * tokens_per_sample) + " tokens)";
}

/// The "N tokens/s" of a rate in samples/s; "" when the samples are not tokens.
std::string tokenRateOf(double samples_per_s, double tokens_per_sample) {
  if (tokens_per_sample <= 0) return "";
  return num(samples_per_s * tokens_per_sample) + " tokens/s";
}

const char* kCss = R"(
body{font-family:sans-serif;margin:24px auto;max-width:1000px;color:#222;line-height:1.4}
h1{font-size:22px;margin-bottom:4px} h2{font-size:17px;margin-top:28px;border-bottom:1px solid #ddd}
.sub{color:#666} table{border-collapse:collapse;font-size:13px} td,th{padding:2px 10px;text-align:left}
tr:nth-child(even){background:#f5f5f5} .num{text-align:right;font-variant-numeric:tabular-nums}
.cards{display:flex;gap:14px;flex-wrap:wrap} .card{flex:1;min-width:260px;border:1px solid #ccc;border-radius:6px;padding:10px 14px}
.card .big{font-size:26px;font-weight:bold} .card .what{font-size:12px;color:#555;text-transform:uppercase}
.grid{display:flex;flex-wrap:wrap;gap:10px} .warn{color:#a14400} ul.diag li{margin-bottom:6px}
svg{background:#fff;border:1px solid #eee}
)";

std::string svgSearch(const nlohmann::ordered_json& s) {
  const double W = 720, H = 400, L = 70, R = 70, T = 36, B = 46;
  const auto& cands = s.contains("candidates") && s["candidates"].is_array()
                          ? s["candidates"]
                          : nlohmann::ordered_json::array();
  struct Pt {
    double m, sps, mem, lo, hi;
    bool failed, chosen, has_ci;
    std::string reason;
  };
  std::vector<Pt> pts;
  double smax = 1, mmax = std::max(1.0, jnum(s, "memory_budget_mb"));
  double xmin = 1e300, xmax = -1e300;
  const double chosen = jnum(s, "chosen", -1);
  // Note [tokens per sample]: on token windows the rate axis is in tokens/s (the
  // points stay where they are: tokens/s is samples/s times a constant).
  const double tokens = jnum(s, "tokens_per_sample");
  const double unit = tokens > 0 ? tokens : 1;
  for (const auto& c : cands) {
    Pt p{};
    p.m = jnum(c, "per_gpu_batch", 0);
    if (p.m <= 0) continue;
    p.sps = jnum(c, "samples_per_s");
    p.mem = jnum(c, "peak_memory_mb");
    p.failed = jbool(c, "failed");
    p.chosen = jbool(c, "chosen") || (!c.contains("levers") && p.m == chosen);
    p.reason = jtext(c, "reason");
    p.has_ci = findInterval(c, &p.lo, &p.hi);
    smax = std::max({smax, p.sps, p.has_ci ? p.hi : 0.0});
    mmax = std::max(mmax, p.mem);
    xmin = std::min(xmin, std::log2(p.m));
    xmax = std::max(xmax, std::log2(p.m));
    pts.push_back(p);
  }
  std::sort(pts.begin(), pts.end(), [](const Pt& a, const Pt& b) { return a.m < b.m; });
  if (pts.empty()) xmin = 0, xmax = 1;
  if (xmax - xmin < 1e-9) xmin -= 0.5, xmax += 0.5;
  auto X = [&](double m) { return L + (std::log2(m) - xmin) / (xmax - xmin) * (W - L - R); };
  auto Ys = [&](double v) { return H - B - v / (smax * 1.1) * (H - T - B); };
  auto Ym = [&](double v) { return H - B - v / (mmax * 1.1) * (H - T - B); };
  std::ostringstream os;
  os << "<svg id=\"plot-search\" xmlns=\"http://www.w3.org/2000/svg\" width=\"" << W
     << "\" height=\"" << H << "\" font-family=\"sans-serif\" font-size=\"12\">\n"
     << "<text x=\"" << W / 2 << "\" y=\"20\" text-anchor=\"middle\" font-size=\"14\">batch search: "
     << jtext(s, "world_size") << " rank(s), " << xmlEscape(jtext(s, "device")) << ", objective "
     << xmlEscape(jtext(s, "objective")) << "</text>\n";
  // Axes and their grid.
  os << "<line x1=\"" << L << "\" y1=\"" << H - B << "\" x2=\"" << W - R << "\" y2=\"" << H - B
     << "\" stroke=\"black\"/>\n<line x1=\"" << L << "\" y1=\"" << T << "\" x2=\"" << L
     << "\" y2=\"" << H - B << "\" stroke=\"#1f77b4\"/>\n<line x1=\"" << W - R << "\" y1=\"" << T
     << "\" x2=\"" << W - R << "\" y2=\"" << H - B << "\" stroke=\"#d62728\"/>\n";
  for (double t : niceTicks(0, smax * 1.1 * unit)) {
    const double y = Ys(t / unit);
    os << "<line x1=\"" << L << "\" y1=\"" << px(y) << "\" x2=\"" << W - R << "\" y2=\""
       << px(y) << "\" stroke=\"#eee\"/><text x=\"" << L - 4 << "\" y=\"" << px(y + 4)
       << "\" text-anchor=\"end\" fill=\"#1f77b4\">" << num(t) << "</text>\n";
  }
  for (double t : niceTicks(0, mmax * 1.1)) {
    os << "<text x=\"" << W - R + 4 << "\" y=\"" << px(Ym(t) + 4) << "\" fill=\"#d62728\">"
       << num(t) << "</text>\n";
  }
  os << "<text x=\"" << W / 2 << "\" y=\"" << H - 8
     << "\" text-anchor=\"middle\">per-GPU batch (log scale)</text>\n"
     << "<text x=\"14\" y=\"" << H / 2 << "\" transform=\"rotate(-90 14 " << H / 2
     << ")\" text-anchor=\"middle\" fill=\"#1f77b4\">"
     << (tokens > 0 ? "tokens/s (all ranks)" : "samples/s (all ranks)") << "</text>\n"
     << "<text x=\"" << W - 10 << "\" y=\"" << H / 2 << "\" transform=\"rotate(90 " << W - 10
     << " " << H / 2 << ")\" text-anchor=\"middle\" fill=\"#d62728\">peak memory (MB)</text>\n";
  std::string sps_line, mem_line;
  double last_label = -1e9;
  for (const auto& p : pts) {
    const double x = X(p.m);
    if (x - last_label >= 30) {
      os << "<text x=\"" << px(x) << "\" y=\"" << H - B + 16 << "\" text-anchor=\"middle\">"
         << num(p.m) << "</text>\n";
      last_label = x;
    }
    if (p.failed) {
      os << "<text class=\"failed\" x=\"" << px(x) << "\" y=\"" << H - B - 4
         << "\" text-anchor=\"middle\" fill=\"#d62728\" font-weight=\"bold\">x<title>"
         << num(p.m) << ": " << xmlEscape(p.reason) << "</title></text>\n";
      continue;
    }
    sps_line += px(x) + "," + px(Ys(p.sps)) + " ";
    if (p.mem > 0) mem_line += px(x) + "," + px(Ym(p.mem)) + " ";
    if (p.has_ci) {
      os << "<g class=\"ci\" stroke=\"#1f77b4\"><line x1=\"" << px(x) << "\" y1=\"" << px(Ys(p.lo))
         << "\" x2=\"" << px(x) << "\" y2=\"" << px(Ys(p.hi)) << "\"/><line x1=\"" << px(x - 5)
         << "\" y1=\"" << px(Ys(p.lo)) << "\" x2=\"" << px(x + 5) << "\" y2=\"" << px(Ys(p.lo))
         << "\"/><line x1=\"" << px(x - 5) << "\" y1=\"" << px(Ys(p.hi)) << "\" x2=\""
         << px(x + 5) << "\" y2=\"" << px(Ys(p.hi)) << "\"/></g>\n";
    }
    os << "<circle class=\"sps\" cx=\"" << px(x) << "\" cy=\"" << px(Ys(p.sps))
       << "\" r=\"3.5\" fill=\"#1f77b4\"><title>per-GPU " << num(p.m) << ": " << num(p.sps)
       << " samples/s";
    if (p.has_ci) os << " [" << num(p.lo) << ", " << num(p.hi) << "]";
    if (tokens > 0) os << ", " << tokenRateOf(p.sps, tokens);
    os << "</title></circle>\n";
    if (p.mem > 0) {
      os << "<rect x=\"" << px(x - 3) << "\" y=\"" << px(Ym(p.mem) - 3)
         << "\" width=\"6\" height=\"6\" fill=\"#d62728\"><title>" << num(p.mem)
         << " MB</title></rect>\n";
    }
  }
  if (!sps_line.empty()) {
    os << "<polyline points=\"" << sps_line
       << "\" fill=\"none\" stroke=\"#1f77b4\" stroke-width=\"1.5\"/>\n";
  }
  if (!mem_line.empty()) {
    os << "<polyline points=\"" << mem_line
       << "\" fill=\"none\" stroke=\"#d62728\" stroke-width=\"1\"/>\n";
  }
  const double budget = jnum(s, "memory_budget_mb");
  if (budget > 0) {
    os << "<line x1=\"" << L << "\" y1=\"" << px(Ym(budget)) << "\" x2=\"" << W - R << "\" y2=\""
       << px(Ym(budget)) << "\" stroke=\"#d62728\" stroke-dasharray=\"6,4\"/>\n<text x=\""
       << L + 4 << "\" y=\"" << px(Ym(budget) - 4) << "\" fill=\"#d62728\">memory budget "
       << num(budget) << " MB</text>\n";
  }
  for (const auto& p : pts) {
    if (!p.chosen || p.failed) continue;
    os << "<circle id=\"search-choice\" cx=\"" << px(X(p.m)) << "\" cy=\"" << px(Ys(p.sps))
       << "\" r=\"9\" fill=\"none\" stroke=\"green\" stroke-width=\"2.5\"/>\n<text x=\""
       << px(X(p.m)) << "\" y=\"" << px(Ys(p.sps) - 14)
       << "\" text-anchor=\"middle\" fill=\"green\">chosen: " << num(p.m) << "</text>\n";
  }
  os << "</svg>\n";
  return os.str();
}

std::string svgTime(const nlohmann::ordered_json& t) {
  struct Part {
    const char* name;
    const char* key;
    const char* color;
  };
  static const Part kParts[] = {{"data wait", "data_wait_s", "#ff7f0e"},
                                {"compute", "compute_s", "#2ca02c"},
                                {"communication", "comm_s", "#1f77b4"},
                                {"waiting for slower ranks", "skew_s", "#9467bd"}};
  double total = 0;
  for (const auto& p : kParts) total += std::max(0.0, jnum(t, p.key));
  const double W = 720, H = 70, L = 10, R = 10;
  std::ostringstream os;
  os << "<svg id=\"plot-time\" xmlns=\"http://www.w3.org/2000/svg\" width=\"" << W
     << "\" height=\"" << H << "\" font-family=\"sans-serif\" font-size=\"12\">\n";
  double x = L, lx = L;
  for (const auto& p : kParts) {
    const double v = std::max(0.0, jnum(t, p.key));
    const double w = total > 0 ? v / total * (W - L - R) : 0;
    os << "<rect x=\"" << px(x) << "\" y=\"8\" width=\"" << px(w) << "\" height=\"26\" fill=\""
       << p.color << "\"><title>" << p.name << ": " << num(v) << " s</title></rect>\n";
    x += w;
    const std::string label =
        strCat(p.name, " ", total > 0 ? formatPct(v / total) : std::string("0"), " %");
    os << "<rect x=\"" << px(lx) << "\" y=\"46\" width=\"10\" height=\"10\" fill=\"" << p.color
       << "\"/><text x=\"" << px(lx + 14) << "\" y=\"55\">" << xmlEscape(label) << "</text>\n";
    lx += 40 + 6.5 * label.size();
  }
  os << "</svg>\n";
  return os.str();
}

/// Where the global batch changed during training (batch.adapt): (step, G)
/// from which each value applies, the first at the run's start. From report.json's
/// `batch_history` (the optimizer step, 0-based, i.e. the steps done before it)
/// when it has one, else from the metrics (the first point showing the new G).
/// Empty when G never changed and the report has no history: the page is then
/// the same as for a run without adaptation.
std::vector<std::pair<double, double>> globalBatchChanges(const nlohmann::ordered_json& report,
                                                          const std::vector<MetricPoint>& metrics) {
  std::vector<std::pair<double, double>> changes;
  const auto it = report.is_object() ? report.find("batch_history") : report.end();
  if (it != report.end() && it->is_array() && !it->empty()) {
    for (const auto& h : *it) {
      const double g = jnum(h, "global_batch");
      if (g <= 0) continue;
      if (changes.empty() || changes.back().second != g) changes.emplace_back(jnum(h, "step"), g);
    }
    return changes;
  }
  for (const auto& m : metrics) {
    if (m.global_batch <= 0) continue;
    const auto g = static_cast<double>(m.global_batch);
    if (changes.empty()) changes.emplace_back(0, g);
    else if (changes.back().second != g) changes.emplace_back(static_cast<double>(m.step), g);
  }
  if (changes.size() < 2) changes.clear();
  return changes;
}

/// The section on the adaptive global batch: G as a step line with the smoothed
/// B_simple on one log axis (Note [goodput]: G follows B), and the history's table.
std::string adaptSection(const nlohmann::ordered_json& report,
                         const std::vector<std::pair<double, double>>& changes,
                         const std::vector<std::pair<double, double>>& noise, double last_step) {
  std::vector<std::pair<double, double>> line;
  for (const auto& [x, g] : changes) {
    if (!line.empty()) line.emplace_back(x, line.back().second);  // the vertical at x
    line.emplace_back(x, g);
  }
  if (last_step > line.back().first) line.emplace_back(last_step, line.back().second);
  std::ostringstream os;
  os << "<h2>Global batch and noise scale</h2>\n";
  ChartOptions o;
  o.id = "plot-adapt";
  o.title = "global batch and B_simple (log scale)";
  o.x_label = "step";
  o.y_label = "samples";
  o.log_y = true;
  o.width = 720;
  o.height = 300;
  os << svgLineChart(o, {{"global batch", "#2ca02c", line, true, true},
                         {"B_simple (smoothed)", "#1f77b4", noise, true, false}});
  const auto* config = report.contains("config") ? &report["config"] : nullptr;
  if (config && config->contains("batch") && jtext((*config)["batch"], "adapt") == "warmup") {
    os << "<p>batch.adapt: warmup doubles the global batch from G0 as B_simple grows past each "
          "doubling, never shrinking it (docs/batch-search.md, \"Adaptive global batch\", "
          "batch-size warmup); the learning rate follows with the gain r.</p>\n";
  } else {
    os << "<p>batch.adapt: goodput re-decides the global batch from B_simple and the search's "
          "samples/s (docs/batch-search.md, \"Adaptive global batch\"); the learning rate follows "
          "with the gain r.</p>\n";
  }
  const auto& history = report.contains("batch_history") ? report["batch_history"]
                                                         : nlohmann::ordered_json();
  if (!history.is_array() || history.empty()) return os.str();
  // One row per change of the split: the history may also hold the decisions that
  // kept it (their gain and B are in report.json).
  constexpr size_t kRows = 40;
  os << "<table id=\"batch-history\">\n<tr><th>from step</th><th>global batch</th>"
        "<th>per-GPU batch</th><th>accumulation</th><th>lr gain</th><th>B_simple</th></tr>\n";
  size_t rows = 0, kept = 0;
  const nlohmann::ordered_json* prev = nullptr;
  for (const auto& h : history) {
    const bool same = prev != nullptr && jnum(h, "global_batch") == jnum(*prev, "global_batch") &&
                      jnum(h, "per_gpu_batch") == jnum(*prev, "per_gpu_batch") &&
                      jnum(h, "accum") == jnum(*prev, "accum");
    prev = &h;
    if (same) {
      ++kept;
      continue;
    }
    if (++rows > kRows) continue;
    const double b = jnum(h, "noise_scale", -1);
    os << "<tr><td class=\"num\">" << num(jnum(h, "step")) << "</td><td class=\"num\">"
       << num(jnum(h, "global_batch")) << "</td><td class=\"num\">" << num(jnum(h, "per_gpu_batch"))
       << "</td><td class=\"num\">" << num(jnum(h, "accum")) << "</td><td class=\"num\">"
       << formatFixed(jnum(h, "lr_gain", 1), 3) << "</td><td class=\"num\">"
       << (b > 0 ? num(std::round(b)) : std::string("unknown")) << "</td></tr>\n";
  }
  if (rows > kRows) {
    os << "<tr><td colspan=\"6\">and " << rows - kRows << " more changes in report.json</td></tr>\n";
  }
  os << "</table>\n";
  if (kept > 0) {
    os << "<p class=\"sub\">" << kept << " re-decision(s) kept the split; report.json's "
       << "batch_history has each with its gain and B_simple.</p>\n";
  }
  return os.str();
}

}  // namespace

std::string svgLineChart(const ChartOptions& opt, const std::vector<ChartSeries>& series) {
  const double W = opt.width, H = opt.height, L = 58, R = 14, T = 30, B = 40;
  double xmin = 1e300, xmax = -1e300, ymin = 1e300, ymax = -1e300;
  auto ty = [&](double y) { return opt.log_y ? std::log10(y) : y; };
  for (const auto& s : series) {
    for (const auto& [x, y] : s.points) {
      if (!std::isfinite(x) || !std::isfinite(y) || (opt.log_y && y <= 0)) continue;
      xmin = std::min(xmin, x);
      xmax = std::max(xmax, x);
      ymin = std::min(ymin, ty(y));
      ymax = std::max(ymax, ty(y));
    }
  }
  if (opt.hline > 0 || (!opt.log_y && opt.hline == 0)) {
    ymin = std::min(ymin, ty(opt.hline));
    ymax = std::max(ymax, ty(opt.hline));
  }
  const bool empty = xmin > xmax;
  if (empty) xmin = 0, xmax = 1, ymin = 0, ymax = 1;
  if (!opt.log_y && ymin > 0) ymin = 0;  // linear axes start at zero
  if (xmax - xmin < 1e-12) xmin -= 0.5, xmax += 0.5;
  if (ymax - ymin < 1e-12) {
    const double pad = opt.log_y ? 0.5 : std::max(std::abs(ymax) * 0.1, 1e-12);
    ymin -= pad;
    ymax += pad;
  }
  if (opt.log_y) {
    ymin = std::floor(ymin * 4) / 4;
    ymax = std::ceil(ymax * 4) / 4;
  } else {
    ymax += (ymax - ymin) * 0.05;
  }
  auto X = [&](double x) { return L + (x - xmin) / (xmax - xmin) * (W - L - R); };
  auto Y = [&](double y) { return H - B - (ty(y) - ymin) / (ymax - ymin) * (H - T - B); };
  auto Yt = [&](double t) { return H - B - (t - ymin) / (ymax - ymin) * (H - T - B); };
  std::ostringstream os;
  os << "<svg id=\"" << xmlEscape(opt.id) << "\" class=\"chart\" xmlns=\"http://www.w3.org/2000/svg\" width=\""
     << W << "\" height=\"" << H << "\" font-family=\"sans-serif\" font-size=\"11\">\n"
     << "<text x=\"" << W / 2 << "\" y=\"17\" text-anchor=\"middle\" font-size=\"13\">"
     << xmlEscape(opt.title) << "</text>\n";
  // Grid and tick labels.
  std::vector<double> yt;
  if (opt.log_y) {
    for (double d = std::ceil(ymin); d <= ymax + 1e-9; d += 1) yt.push_back(d);
    if (yt.size() < 2) yt = niceTicks(ymin, ymax, 3);
  } else {
    yt = niceTicks(ymin, ymax);
  }
  for (double t : yt) {
    const std::string label = opt.log_y ? num(std::pow(10.0, t)) : num(t);
    os << "<line x1=\"" << L << "\" y1=\"" << px(Yt(t)) << "\" x2=\"" << W - R << "\" y2=\""
       << px(Yt(t)) << "\" stroke=\"#eee\"/><text x=\"" << L - 4 << "\" y=\"" << px(Yt(t) + 4)
       << "\" text-anchor=\"end\">" << label << "</text>\n";
  }
  for (double t : niceTicks(xmin, xmax)) {
    os << "<line x1=\"" << px(X(t)) << "\" y1=\"" << H - B << "\" x2=\"" << px(X(t)) << "\" y2=\""
       << H - B + 4 << "\" stroke=\"black\"/><text x=\"" << px(X(t)) << "\" y=\"" << H - B + 15
       << "\" text-anchor=\"middle\">" << num(t) << "</text>\n";
  }
  os << "<line x1=\"" << L << "\" y1=\"" << H - B << "\" x2=\"" << W - R << "\" y2=\"" << H - B
     << "\" stroke=\"black\"/><line x1=\"" << L << "\" y1=\"" << T << "\" x2=\"" << L
     << "\" y2=\"" << H - B << "\" stroke=\"black\"/>\n"
     << "<text x=\"" << (L + W - R) / 2 << "\" y=\"" << H - 6 << "\" text-anchor=\"middle\">"
     << xmlEscape(opt.x_label) << "</text>\n"
     << "<text x=\"12\" y=\"" << (T + H - B) / 2 << "\" transform=\"rotate(-90 12 "
     << (T + H - B) / 2 << ")\" text-anchor=\"middle\">" << xmlEscape(opt.y_label) << "</text>\n";
  if (opt.hline > 0 || (!opt.log_y && opt.hline == 0)) {
    os << "<line class=\"hline\" x1=\"" << L << "\" y1=\"" << px(Y(opt.hline)) << "\" x2=\""
       << W - R << "\" y2=\"" << px(Y(opt.hline))
       << "\" stroke=\"#d62728\" stroke-dasharray=\"6,4\"/><text x=\"" << W - R - 4 << "\" y=\""
       << px(Y(opt.hline) - 4) << "\" text-anchor=\"end\" fill=\"#d62728\">"
       << xmlEscape(opt.hline_label) << "</text>\n";
  }
  double legend_y = T + 4;
  for (const auto& s : series) {
    std::string pts;
    for (const auto& [x, y] : s.points) {
      if (!std::isfinite(x) || !std::isfinite(y) || (opt.log_y && y <= 0)) continue;
      pts += px(X(x)) + "," + px(Y(y)) + " ";
      if (s.markers) {
        os << "<circle cx=\"" << px(X(x)) << "\" cy=\"" << px(Y(y)) << "\" r=\"2.5\" fill=\""
           << s.color << "\"><title>" << xmlEscape(s.name) << " " << num(y) << " at " << num(x)
           << "</title></circle>\n";
      }
    }
    if (s.line && !pts.empty()) {
      os << "<polyline class=\"series\" points=\"" << pts << "\" fill=\"none\" stroke=\""
         << s.color << "\" stroke-width=\"1.5\"/>\n";
    }
    if (series.size() > 1 || !s.name.empty()) {
      os << "<rect x=\"" << W - R - 150 << "\" y=\"" << px(legend_y - 8) << "\" width=\"10\" height=\"3\" fill=\""
         << s.color << "\"/><text x=\"" << W - R - 136 << "\" y=\"" << px(legend_y - 3) << "\">"
         << xmlEscape(s.name) << "</text>\n";
      legend_y += 13;
    }
  }
  if (empty) {
    os << "<text x=\"" << W / 2 << "\" y=\"" << H / 2 << "\" text-anchor=\"middle\" fill=\"#888\">"
       << "no data</text>\n";
  }
  os << "</svg>\n";
  return os.str();
}

/// The task's "better" metric (Note [task]); reports before tasks: accuracy.
std::string bestMetric(const nlohmann::ordered_json& report) {
  return report.contains("best_metric") && report["best_metric"].is_string()
             ? report["best_metric"].get<std::string>()
             : std::string("accuracy");
}

/// The held-out figure in the summary line: "eval accuracy 98.61 %", "eval mse 0.0123".
std::string evalSummary(const nlohmann::ordered_json& report) {
  const auto best = bestMetric(report);
  const auto key = "eval_" + best;
  if (best == "accuracy") return "eval accuracy " + formatPct(jnum(report, key.c_str())) + " %";
  return "eval " + xmlEscape(best) + " " + num(jnum(report, key.c_str()));
}

/// Note [tokens per sample]: " (15040 tokens/s, 2048 tokens per step)" for a run
/// whose samples are tokens; "" otherwise.
std::string tokensSummary(const nlohmann::ordered_json& report) {
  if (!report.contains("tokens_per_s")) return "";
  return " (" + num(jnum(report, "tokens_per_s")) + " tokens/s, " +
         num(jnum(report, "tokens_per_step")) + " tokens per step)";
}

/// Note [mfu]: ", MFU 41.2 % (peak 989 TFLOP/s a device, table: ...)"; "" when unknown.
std::string mfuSummary(const nlohmann::ordered_json& report) {
  if (!report.contains("mfu")) return "";
  return ", MFU " + mfuText(jnum(report, "mfu")) + " (peak " + num(jnum(report, "peak_tflops")) +
         " TFLOP/s a device, " + xmlEscape(jtext(report, "peak_source")) + ")";
}

/// The search's candidates as a table: batch, levers, rate, MFU (from the run's
/// yardstick, Note [mfu]: the same model FLOPs and peak), peak memory, outcome.
std::string searchTable(const nlohmann::ordered_json& search, const nlohmann::ordered_json& report) {
  const double tokens = jnum(search, "tokens_per_sample");
  Yardstick y;  // the run's (Note [mfu]), over the search's ranks
  y.flops_per_sample = jnum(report, "flops_per_sample");
  y.peak_flops = jnum(report, "peak_tflops") * 1e12;
  y.ranks = static_cast<int64_t>(std::max(1.0, jnum(search, "world_size", 1)));
  bool levers = false;
  for (const auto& c : search["candidates"]) levers = levers || c.contains("levers");
  std::ostringstream os;
  os << "<table id=\"search-table\">\n<tr><th>per-GPU batch</th>"
     << (levers ? "<th>shard</th><th>recompute</th>" : "") << "<th>samples/s</th>"
     << (tokens > 0 ? "<th>tokens/s</th>" : "") << (y.known() ? "<th>MFU</th>" : "")
     << "<th>peak memory (MB)</th><th></th></tr>\n";
  for (const auto& c : search["candidates"]) {
    const bool failed = jbool(c, "failed");
    const double sps = jnum(c, "samples_per_s");
    os << "<tr><td class=\"num\">" << jtext(c, "per_gpu_batch") << "</td>";
    if (levers) {
      const auto& l = c.contains("levers") ? c["levers"] : nlohmann::ordered_json::object();
      os << "<td>" << xmlEscape(jtext(l, "shard")) << "</td><td>" << xmlEscape(jtext(l, "recompute"))
         << "</td>";
    }
    const auto cell = [&](const std::string& v) { os << "<td class=\"num\">" << (failed ? "" : v) << "</td>"; };
    cell(num(sps));
    if (tokens > 0) cell(num(sps * tokens));
    if (y.known()) cell(mfuText(y.mfu(sps)));
    cell(num(jnum(c, "peak_memory_mb")));
    os << "<td>"
       << (failed ? "failed: " + xmlEscape(jtext(c, "reason")) : jbool(c, "chosen") ? "chosen" : "")
       << "</td></tr>\n";
  }
  os << "</table>\n";
  return os.str();
}

std::string reportHtml(const nlohmann::ordered_json& report, const nlohmann::ordered_json& search,
                       const std::vector<MetricPoint>& metrics) {
  const bool searched = search.is_object() && search.contains("candidates");
  const auto& noise = report.contains("noise_scale") ? report["noise_scale"] : nlohmann::ordered_json();
  const double G = jnum(report, "global_batch");
  // Note [tokens per sample]: 0 unless the samples are token windows.
  const double tokens = report.contains("plan") ? jnum(report["plan"], "tokens_per_sample") : 0;
  std::ostringstream os;
  os << "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n"
     << "<title>batchdist run report</title>\n<style>" << kCss << "</style></head><body>\n";
  os << "<h1>batchdist run report</h1>\n<p class=\"sub\">" << jtext(report, "world_size")
     << " rank(s) on " << jtext(report, "hosts") << " host(s), backend "
     << xmlEscape(jtext(report, "backend")) << ", device " << xmlEscape(jtext(report, "device"))
     << ", torch " << xmlEscape(jtext(report, "torch_version")) << ", batchdist "
     << xmlEscape(jtext(report, "batchdist_version")) << "; " << jtext(report, "steps")
     << " steps in " << num(jnum(report, "wall_s")) << " s, "
     << (jbool(report, "completed") ? "completed"
                                    : "stopped early (" + xmlEscape(jtext(report, "stopped_by")) + ")")
     << (report.contains("validation_samples") && jnum(report, "validation_samples") == 0
           ? std::string("; no validation set, ")
           : "; " + evalSummary(report) + ", ")
     << num(jnum(report, "samples_per_s")) << " samples/s" << tokensSummary(report)
     << mfuSummary(report) << ".</p>\n";

  // The three numbers (docs/batch-search.md, "The three numbers").
  os << "<h2>The three numbers</h2>\n<div class=\"cards\">\n";
  os << "<div class=\"card\" id=\"card-throughput\"><div class=\"what\">throughput-optimal per-GPU "
        "batch</div>";
  if (searched) {
    os << "<div class=\"big\">" << jtext(search, "chosen") << "</div>" << xmlEscape(jtext(search, "why"));
  } else {
    os << "<div class=\"big\">" << jtext(report, "per_gpu_batch")
       << "</div>not searched: set by the config; <code>batch.per_gpu: auto</code> measures it";
  }
  os << "</div>\n<div class=\"card\" id=\"card-memory\"><div class=\"what\">memory limit</div>";
  if (searched) {
    double fit = 0, fail = 0;
    std::string reason;
    for (const auto& c : search["candidates"]) {
      const double m = jnum(c, "per_gpu_batch");
      if (jbool(c, "failed")) {
        if (fail == 0 || m < fail) fail = m, reason = jtext(c, "reason");
      } else {
        fit = std::max(fit, m);
      }
    }
    os << "<div class=\"big\">" << (fit > 0 ? num(fit) : std::string("none")) << "</div>largest per-GPU batch that fit";
    if (fail > 0) os << "; " << num(fail) << " failed (" << xmlEscape(reason) << ")";
    else os << "; none of those tried failed";
    if (jnum(search, "memory_budget_mb") > 0) os << "; budget " << num(jnum(search, "memory_budget_mb")) << " MB";
  } else {
    os << "<div class=\"big\">?</div>not searched";
  }
  const double peak = report.contains("memory") ? jnum(report["memory"], "peak_mb") : 0;
  if (peak > 0) os << "; training peak " << num(peak) << " MB";
  os << "</div>\n<div class=\"card\" id=\"card-noise\"><div class=\"what\">statistically efficient "
        "global batch</div>";
  const double bs = jnum(noise, "b_simple", -1);
  // The advice respects the data (dataCeiling, Note [goodput]): never a batch that
  // leaves an epoch fewer than batch.adapt_min_steps steps.
  const auto* plan = report.contains("plan") ? &report["plan"] : nullptr;
  const auto n = plan ? static_cast<int64_t>(jnum(*plan, "dataset_size")) : 0;
  const auto min_steps = report.contains("config") && report["config"].contains("batch")
                             ? static_cast<int64_t>(jnum(report["config"]["batch"], "adapt_min_steps", 8))
                             : int64_t{8};
  const int64_t cap = dataCeiling(n, min_steps);
  // A B_simple below 10 is quoted as noiseScaleText does (0.43, not ~0); on token
  // windows the big number, B_simple and G also in tokens.
  const auto big = [&](double v) {
    return "<div class=\"big\">~" + noiseScaleText(v) + "</div>" +
           (tokens > 0 ? noiseScaleText(v * tokens) + " tokens; " : std::string());
  };
  if (bs > 0 && cap > 0 && cap < std::round(bs)) {
    os << big(static_cast<double>(cap)) << "gradient noise scale B_simple ~" << noiseScaleText(bs)
       << tokensOf(bs, tokens) << ", capped by the data: " << n << " training samples / "
       << min_steps << " steps an epoch (batch.adapt_min_steps); this run's global batch " << num(G)
       << tokensOf(G, tokens) << " is " << formatFixed(G / bs, G / bs < 1 ? 2 : 1) << "x B_simple";
    if (G >= 4 * bs) os << " <span class=\"warn\">(samples are being wasted)</span>";
  } else if (bs > 0) {
    os << big(bs) << "gradient noise scale B_simple; this run's global batch " << num(G)
       << tokensOf(G, tokens) << " is " << formatFixed(G / bs, G / bs < 1 ? 2 : 1) << "x it";
    if (G >= 4 * bs) os << " <span class=\"warn\">(samples are being wasted)</span>";
  } else {
    os << "<div class=\"big\">?</div>" << (jbool(noise, "measured") ? "unknown: " : "not measured: ")
       << xmlEscape(jtext(noise, "why_not"));
  }
  os << "</div>\n</div>\n";

  // Diagnosis.
  os << "<h2>Diagnosis</h2>\n<ul class=\"diag\" id=\"diagnosis\">\n";
  bool any = false;
  if (report.contains("diagnosis") && report["diagnosis"].is_array()) {
    for (const auto& d : report["diagnosis"]) {
      if (!d.is_string()) continue;
      os << "<li>" << xmlEscape(d.get<std::string>()) << "</li>\n";
      any = true;
    }
  }
  if (!any) os << "<li>nothing stands out</li>\n";
  os << "</ul>\n";

  // Plan.
  os << "<h2>Plan</h2>\n<table id=\"plan\">\n";
  if (report.contains("plan") && report["plan"].is_object()) {
    for (const auto& [k, v] : report["plan"].items()) {
      os << "<tr><td>" << xmlEscape(k) << "</td><td class=\"num\">" << planText(k, v) << "</td></tr>\n";
    }
  }
  os << "</table>\n";

  // Search.
  os << "<h2>Batch search</h2>\n";
  if (searched) {
    os << svgSearch(search);
    bool intervals = false;
    for (const auto& c : search["candidates"]) {
      double lo, hi;
      intervals = intervals || findInterval(c, &lo, &hi);
    }
    const double search_tokens = jnum(search, "tokens_per_sample");
    os << "<p class=\"sub\">Blue: "
       << (search_tokens > 0 ? "tokens/s (samples/s x " + num(search_tokens) + ")"
                             : std::string("samples/s"))
       << " of all ranks (the slowest rank's x world size)"
       << (intervals ? ", with its interval" : "") << "; red: peak memory; x: failed. "
       << xmlEscape(jtext(search, "why")) << "</p>\n";
    os << searchTable(search, report);
  } else {
    os << "<p>The per-GPU batch was set by the config, not searched.</p>\n";
  }

  // Training curves.
  std::vector<std::pair<double, double>> loss, eval_loss, acc, lr, sps, sps_epoch, ns, ns_epoch;
  const auto best = bestMetric(report);  // acc: the task's best metric (accuracy in %)
  for (const auto& m : metrics) {
    const double x = static_cast<double>(m.step);
    if (m.epoch_end) {
      eval_loss.emplace_back(x, m.eval_loss);
      const double v = metricValue(m.eval_metrics, best, 0);
      acc.emplace_back(x, best == "accuracy" ? 100 * v : v);
      sps_epoch.emplace_back(x, m.samples_per_s);
      if (m.noise_scale > 0) ns_epoch.emplace_back(x, m.noise_scale);
    } else {
      loss.emplace_back(x, m.train_loss);
      lr.emplace_back(x, m.lr);
      sps.emplace_back(x, m.samples_per_s);
      if (m.noise_scale > 0) ns.emplace_back(x, m.noise_scale);
    }
  }
  os << "<h2>Training</h2>\n<div class=\"grid\">\n";
  ChartOptions o;
  o.x_label = "step";
  o.id = "plot-loss";
  o.title = "loss";
  o.y_label = "loss";
  os << svgLineChart(o, {{"train (rank 0's shard)", "#1f77b4", loss, true, false},
                         {"eval (per epoch)", "#d62728", eval_loss, true, true}});
  if (best != "loss") {  // a language model's best metric is the loss chart's eval line
    o.id = "plot-" + best;
    o.title = "held-out " + best;
    o.y_label = best == "accuracy" ? "accuracy (%)" : best;
    os << svgLineChart(o, {{"eval (per epoch)", "#2ca02c", acc, true, true}});
  }
  o.id = "plot-lr";
  o.title = "learning rate";
  o.y_label = "lr";
  os << svgLineChart(o, {{"", "#9467bd", lr, true, false}});
  o.id = "plot-throughput";
  o.title = "samples/s (all ranks)";
  o.y_label = "samples/s";
  if (tokens > 0) {  // Note [tokens per sample]: a language model's rate is in tokens
    for (auto* series : {&sps, &sps_epoch}) {
      for (auto& point : *series) point.second *= tokens;
    }
    o.title = "tokens/s (all ranks; samples/s x " + num(tokens) + ")";
    o.y_label = "tokens/s";
  }
  os << svgLineChart(o, {{"per interval", "#1f77b4", sps, true, false},
                         {"per epoch", "#ff7f0e", sps_epoch, false, true}});
  os << "</div>\n";

  // Time.
  os << "<h2>Where the time goes (rank 0)</h2>\n";
  if (report.contains("time_breakdown")) os << svgTime(report["time_breakdown"]);
  os << systemSection(report);  // Note [system metrics]: a row of charts per host

  // Noise scale.
  os << "<h2>Gradient noise scale</h2>\n";
  if (jbool(noise, "measured")) {
    o.id = "plot-noise";
    o.title = "B_simple (log scale) and the global batch";
    o.y_label = "samples";
    o.log_y = true;
    o.hline = G;
    o.hline_label = "global batch " + num(G) + tokensOf(G, tokens);
    o.width = 720;
    o.height = 300;
    os << svgLineChart(o, {{"smoothed (EMA)", "#1f77b4", ns, true, false},
                           {"per epoch", "#ff7f0e", ns_epoch, false, true}});
    os << "<p>B_simple = tr(&Sigma;)/|G|&sup2; (McCandlish et al. 2018), from the squared gradient "
          "norms at batch "
       << jtext(noise, "per_rank_batch") << " (each rank's, or each micro-batch's on one rank) and "
       << jtext(noise, "global_batch") << " (the step's), " << jtext(noise, "steps")
       << " steps. Smoothed at the end: |G|&sup2; " << num(jnum(noise, "grad_sq")) << ", tr(&Sigma;) "
       << num(jnum(noise, "trace")) << ". A global batch well above B_simple wastes samples (about "
          "1 + B/B_simple times the minimal number); well below it, a larger batch would take "
          "fewer steps for nearly the same samples.";
    if (bs <= 0) os << " <b>Unknown at the end</b>: " << xmlEscape(jtext(noise, "why_not")) << ".";
    os << "</p>\n";
  } else {
    os << "<p id=\"noise-missing\">Not measured: " << xmlEscape(jtext(noise, "why_not")) << ".</p>\n";
  }

  // The adaptive global batch: only when G changed (or the report has a history),
  // so a fixed-G run's page is unchanged.
  const auto changes = globalBatchChanges(report, metrics);
  if (!changes.empty()) {
    const double last_step = metrics.empty() ? 0.0 : static_cast<double>(metrics.back().step);
    os << adaptSection(report, changes, ns, last_step);
  }

  os << "<p class=\"sub\">Files: report.json (everything on this page), metrics.jsonl (one line per "
        "logging interval and epoch), search.json / search.svg (the search), model.pt.</p>\n"
     << "</body></html>\n";
  return os.str();
}

}  // namespace batchdist::worker
