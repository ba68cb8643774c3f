#include "worker/search/output.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iomanip>
#include <sstream>
#include <stdexcept>

#include "common/error.h"
#include "worker/common/console.h"
#include "worker/common/util.h"

namespace batchdist::worker {

namespace {

nlohmann::ordered_json candidateJson(const Candidate& c, bool chosen, int64_t tokens_per_sample,
                                     bool levers) {
  nlohmann::ordered_json j{{"per_gpu_batch", c.per_gpu},
          {"accum_steps", c.accum},
          {"global_batch", c.global},
          {"failed", c.failed},
          {"reason", c.reason},
          {"samples_per_s", c.global_sps},
          {"rank_samples_per_s_min", c.min_rank_sps},
          {"rank_samples_per_s_max", c.max_rank_sps},
          {"ci_low", c.sps_low},
          {"ci_high", c.sps_high},
          {"relative_to_best", c.relative},
          {"round_samples_per_s", c.round_sps},
          {"peak_memory_mb", c.peak_mb},
          {"rank_peak_memory_mb", c.rank_peak_mb},
          {"measurements", c.measurements},
          {"timed_steps", c.timed_steps},
          {"step_seconds", c.step_seconds},
          {"chosen", chosen}};
  if (tokens_per_sample > 0) {  // Note [tokens per sample]
    j["tokens_per_s"] = c.global_sps * static_cast<double>(tokens_per_sample);
  }
  // Note [memory by part]; Note [lever search]: the levers when the search weighed them.
  j["memory_parts_mb"] = {{"parameters", c.parts.parameters_mb},
                          {"gradients", c.parts.gradients_mb},
                          {"optimizer_state", c.parts.optimizer_state_mb},
                          {"rest", c.restMb()}};
  if (levers) j["levers"] = leversJson(c.levers);
  if (!c.trace.empty()) j["trace"] = c.trace;  // Note [search traces]
  return j;
}

nlohmann::ordered_json outcomeJson(const LeverOutcome& o) {
  return {{"levers", leversJson(o.levers)},
          {"fixed_mb", o.fixed_mb},
          {"rest_intercept_mb", o.intercept_mb},
          {"rest_per_sample_mb", o.per_sample_mb},
          {"fitted", o.fitted},
          {"predicted_max_per_gpu", o.predicted_max},
          {"predicted_peak_mb", o.predicted_peak_mb},
          {"measured_max_per_gpu", o.measured_max},
          {"timed", o.timed},
          {"verdict", o.verdict}};
}

LeverOutcome outcomeFromJson(const nlohmann::json& j) {
  LeverOutcome o;
  o.levers = leversFromJson(j.at("levers"));
  o.fixed_mb = j.value("fixed_mb", 0.0);
  o.intercept_mb = j.value("rest_intercept_mb", 0.0);
  o.per_sample_mb = j.value("rest_per_sample_mb", 0.0);
  o.fitted = j.value("fitted", false);
  o.predicted_max = j.value("predicted_max_per_gpu", int64_t{0});
  o.predicted_peak_mb = j.value("predicted_peak_mb", 0.0);
  o.measured_max = j.value("measured_max_per_gpu", int64_t{0});
  o.timed = j.value("timed", false);
  o.verdict = j.value("verdict", std::string());
  return o;
}

Candidate candidateFromJson(const nlohmann::json& c) {
  Candidate k;
  k.per_gpu = c.at("per_gpu_batch").get<int64_t>();
  k.accum = c.at("accum_steps").get<int64_t>();
  k.global = c.at("global_batch").get<int64_t>();
  k.failed = c.at("failed").get<bool>();
  k.reason = c.at("reason").get<std::string>();
  k.global_sps = c.at("samples_per_s").get<double>();
  k.min_rank_sps = c.at("rank_samples_per_s_min").get<double>();
  k.max_rank_sps = c.at("rank_samples_per_s_max").get<double>();
  k.peak_mb = c.at("peak_memory_mb").get<double>();
  k.measurements = c.value("measurements", int64_t{1});
  k.sps_low = c.value("ci_low", 0.0);
  k.sps_high = c.value("ci_high", 0.0);
  k.relative = c.value("relative_to_best", 0.0);
  k.round_sps = c.value("round_samples_per_s", std::vector<double>{});
  k.timed_steps = c.value("timed_steps", int64_t{0});
  k.step_seconds = c.value("step_seconds", std::vector<double>{});
  k.rank_peak_mb = c.value("rank_peak_memory_mb", std::vector<double>{});
  if (c.contains("levers")) k.levers = leversFromJson(c.at("levers"));
  k.trace = c.value("trace", std::string());
  if (c.contains("memory_parts_mb")) {
    const auto& p = c.at("memory_parts_mb");
    k.parts = {p.value("parameters", 0.0), p.value("gradients", 0.0), p.value("optimizer_state", 0.0)};
  }
  return k;
}

}  // namespace

nlohmann::ordered_json searchJson(const SearchResult& r) {
  auto cands = nlohmann::ordered_json::array();
  const int64_t tokens = r.tokens_per_sample;
  const bool levers = !r.levers.empty();
  for (const auto& c : r.candidates) cands.push_back(candidateJson(c, isChosen(r, c), tokens, levers));
  auto range = nlohmann::ordered_json::array();
  for (const auto& c : r.adapt_range) range.push_back(candidateJson(c, false, tokens, levers));
  nlohmann::ordered_json j{{"chosen", r.chosen},
          {"chosen_accum", r.chosen_accum},
          {"why", r.why},
          {"rule", r.rule},
          {"rounds", r.rounds},
          {"cached", r.cached},
          {"objective", toString(r.objective)},
          {"tolerance", r.tolerance},
          {"memory_budget_mb", r.memory_budget_mb},
          {"device", r.device},
          {"world_size", r.world_size},
          {"timed_steps", r.timed_steps},
          {"seconds", r.seconds},
          {"candidates", cands}};
  if (!range.empty()) j["adapt_range"] = range;
  if (tokens > 0) j["tokens_per_sample"] = tokens;
  if (levers) {  // Note [lever search]
    j["chosen_levers"] = leversJson(r.chosen_levers);
    auto outcomes = nlohmann::ordered_json::array();
    for (const auto& o : r.levers) outcomes.push_back(outcomeJson(o));
    j["levers"] = outcomes;
  }
  return j;
}

SearchResult searchFromJson(const nlohmann::json& j) {
  SearchResult r;
  r.chosen = j.at("chosen").get<int64_t>();
  r.chosen_accum = j.at("chosen_accum").get<int64_t>();
  r.why = j.at("why").get<std::string>();
  r.rule = j.value("rule", std::string());
  r.rounds = j.value("rounds", int64_t{0});
  const auto objective = parseEnum<Objective>(j.at("objective").get<std::string>());
  if (!objective) throw std::invalid_argument("unknown objective");
  r.objective = *objective;
  r.tolerance = j.at("tolerance").get<double>();
  r.memory_budget_mb = j.at("memory_budget_mb").get<double>();
  r.device = j.at("device").get<std::string>();
  r.world_size = j.at("world_size").get<int64_t>();
  r.tokens_per_sample = j.value("tokens_per_sample", int64_t{0});
  for (const auto& c : j.at("candidates")) r.candidates.push_back(candidateFromJson(c));
  if (j.contains("adapt_range")) {
    for (const auto& c : j.at("adapt_range")) r.adapt_range.push_back(candidateFromJson(c));
  }
  if (j.contains("chosen_levers")) r.chosen_levers = leversFromJson(j.at("chosen_levers"));
  if (j.contains("levers")) {
    for (const auto& o : j.at("levers")) r.levers.push_back(outcomeFromJson(o));
  }
  return r;
}

std::string searchTable(const SearchResult& r) {
  // Note [tokens per sample]: token samples add a tokens/s column after samples/s.
  const bool tokens = r.tokens_per_sample > 0;
  // Note [lever search]: a levers column and the fixed parts when the search weighed them.
  const bool levers = !r.levers.empty();
  std::ostringstream os;
  os << "  per-GPU  accum  global" << (levers ? "  levers                       " : "")
     << "   samples/s" << (tokens ? "     tokens/s" : "")
     << "   95 % interval          vs best  steps   peak MB" << (levers ? "  fixed MB" : "")
     << "  result\n";
  for (const auto& c : r.candidates) {
    char head[200], tail[320], rate[32] = "", fixed[32] = "";
    char column[40] = "";
    if (levers) std::snprintf(column, sizeof column, "  %-29s", leversText(c.levers).c_str());
    std::snprintf(head, sizeof head, "  %7lld  %5lld  %6lld%s  %10.0f",
                  static_cast<long long>(c.per_gpu), static_cast<long long>(c.accum),
                  static_cast<long long>(c.global), column, c.global_sps);
    if (levers) std::snprintf(fixed, sizeof fixed, "  %8.0f", c.parts.fixedMb());
    if (tokens) {
      std::snprintf(rate, sizeof rate, "  %11.0f",
                    c.global_sps * static_cast<double>(r.tokens_per_sample));
    }
    char low[24] = "-", high[24] = "-";  // none from too few steps (Note [adaptive timing])
    if (c.sps_low > 0) {
      std::snprintf(low, sizeof low, "%.0f", c.sps_low);
      std::snprintf(high, sizeof high, "%.0f", c.sps_high);
    }
    std::snprintf(tail, sizeof tail, "   %10s..%-10s %6.1f %%  %5lld  %8.0f%s  %s%s\n",
                  low, high, 100 * c.relative, static_cast<long long>(c.timed_steps),
                  c.peak_mb, fixed, c.failed ? c.reason.c_str() : "ok",
                  isChosen(r, c) ? "  <- chosen" : "");
    os << head << rate << tail;
  }
  os << "  chosen per-GPU batch " << r.chosen << " x accum " << r.chosen_accum
     << (levers ? strCat(" under ", leversText(r.chosen_levers)) : std::string()) << ": " << r.why
     << (r.cached ? " [cached]" : "") << "\n";
  if (levers) {
    os << "  memory model (Note [lever search]): peak = fixed (parameters + gradients + optimizer "
          "state) + rest a + b x per-GPU\n";
    for (const auto& o : r.levers) {
      os << "    " << leversText(o.levers) << ": fixed " << formatFixed(o.fixed_mb, 0) << " MB"
         << (o.fitted ? strCat(", rest ", formatFixed(o.intercept_mb, 0), " + ",
                               formatFixed(o.per_sample_mb, 2), " x m MB")
                      : std::string())
         << "; " << o.verdict << "\n";
    }
  }
  if (tokens) {
    const int64_t global = r.chosen * r.chosen_accum * r.world_size;
    os << "  tokens: " << r.tokens_per_sample << " per sample (model.seq_len); the chosen global "
       << "batch " << global << " is " << global * r.tokens_per_sample << " tokens per step\n";
  }
  if (!r.rule.empty()) os << "  rule: " << r.rule << "\n";
  if (!r.cached) {
    os << "  cost: " << r.timed_steps << " timed steps per rank, " << formatFixed(r.seconds, 1)
       << " s\n";
  }
  return os.str();
}

std::string searchSvg(const SearchResult& r) {
  const double W = 720, H = 420, L = 70, R = 70, T = 40, B = 50;
  double xmin = 1e300, xmax = 0, smax = 1, mmax = std::max(1.0, r.memory_budget_mb);
  for (const auto& c : r.candidates) {
    xmin = std::min(xmin, std::log2(static_cast<double>(c.per_gpu)));
    xmax = std::max(xmax, std::log2(static_cast<double>(c.per_gpu)));
    smax = std::max(smax, std::min(c.sps_high, 1.5 * c.global_sps));
    smax = std::max(smax, c.global_sps);
    mmax = std::max(mmax, c.peak_mb);
  }
  if (r.candidates.empty()) xmin = 0, xmax = 1;
  if (xmax - xmin < 1e-9) xmin -= 0.5, xmax += 0.5;
  auto X = [&](int64_t m) {
    return L + (std::log2(static_cast<double>(m)) - xmin) / (xmax - xmin) * (W - L - R);
  };
  auto Ys = [&](double v) { return H - B - v / (smax * 1.1) * (H - T - B); };
  auto Ym = [&](double v) { return H - B - v / (mmax * 1.1) * (H - T - B); };
  std::ostringstream os;
  os << std::fixed << std::setprecision(1);
  os << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << W << "\" height=\"" << H
     << "\" font-family=\"sans-serif\" font-size=\"12\">\n"
     << "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
     << "<text x=\"" << W / 2 << "\" y=\"20\" text-anchor=\"middle\" font-size=\"14\">batch search: "
     << r.world_size << " rank(s), " << xmlEscape(r.device) << ", objective "
     << toString(r.objective) << "</text>\n"
     << "<line x1=\"" << L << "\" y1=\"" << H - B << "\" x2=\"" << W - R << "\" y2=\"" << H - B
     << "\" stroke=\"black\"/>\n"
     << "<line x1=\"" << L << "\" y1=\"" << T << "\" x2=\"" << L << "\" y2=\"" << H - B
     << "\" stroke=\"#1f77b4\"/>\n"
     << "<line x1=\"" << W - R << "\" y1=\"" << T << "\" x2=\"" << W - R << "\" y2=\"" << H - B
     << "\" stroke=\"#d62728\"/>\n"
     << "<text x=\"" << W / 2 << "\" y=\"" << H - 12
     << "\" text-anchor=\"middle\">per-GPU batch (log scale)</text>\n"
     << "<text x=\"16\" y=\"" << H / 2 << "\" transform=\"rotate(-90 16 " << H / 2
     << ")\" text-anchor=\"middle\" fill=\"#1f77b4\">samples/s (all ranks)</text>\n"
     << "<text x=\"" << W - 14 << "\" y=\"" << H / 2 << "\" transform=\"rotate(90 " << W - 14 << " "
     << H / 2 << ")\" text-anchor=\"middle\" fill=\"#d62728\">peak memory (MB)</text>\n"
     << "<text x=\"" << L - 6 << "\" y=\"" << Ys(smax) << "\" text-anchor=\"end\" fill=\"#1f77b4\">"
     << std::setprecision(0) << smax << "</text>\n"
     << "<text x=\"" << W - R + 6 << "\" y=\"" << Ym(mmax) << "\" fill=\"#d62728\">" << mmax
     << "</text>\n"
     << std::setprecision(1);
  auto sorted = r.candidates;
  std::sort(sorted.begin(), sorted.end(),
            [](const Candidate& a, const Candidate& b) { return a.per_gpu < b.per_gpu; });
  std::string sps_pts, mem_pts;
  double last_label = -1e9;
  for (const auto& c : sorted) {
    if (X(c.per_gpu) - last_label >= 30) {  // labels of clustered sizes would overlap
      os << "<text x=\"" << X(c.per_gpu) << "\" y=\"" << H - B + 16
         << "\" text-anchor=\"middle\">" << c.per_gpu << "</text>\n";
      last_label = X(c.per_gpu);
    }
    if (c.failed) {
      os << "<text x=\"" << X(c.per_gpu) << "\" y=\"" << H - B - 4
         << "\" text-anchor=\"middle\" fill=\"#d62728\" font-weight=\"bold\">x<title>" << xmlEscape(c.reason)
         << "</title></text>\n";
      continue;
    }
    if (c.levers != r.candidates.front().levers) {  // Note [lever search]: other levers, unjoined
      os << "<circle cx=\"" << X(c.per_gpu) << "\" cy=\"" << Ys(c.global_sps)
         << "\" r=\"4\" fill=\"none\" stroke=\"#9467bd\"><title>" << xmlEscape(leversText(c.levers))
         << "</title></circle>\n";
      continue;
    }
    sps_pts += strCat(X(c.per_gpu), ",", Ys(c.global_sps), " ");
    if (c.peak_mb > 0) mem_pts += strCat(X(c.per_gpu), ",", Ym(c.peak_mb), " ");
    os << "<circle cx=\"" << X(c.per_gpu) << "\" cy=\"" << Ys(c.global_sps)
       << "\" r=\"3\" fill=\"#1f77b4\"/>\n";
    if (c.sps_high > c.sps_low && c.sps_low > 0) {  // the 95 % interval of the estimate
      os << "<line x1=\"" << X(c.per_gpu) << "\" y1=\"" << Ys(c.sps_low) << "\" x2=\""
         << X(c.per_gpu) << "\" y2=\"" << Ys(std::min(c.sps_high, 1.5 * c.global_sps))
         << "\" stroke=\"#1f77b4\" stroke-width=\"1\"/>\n";
    }
    if (c.peak_mb > 0) {
      os << "<rect x=\"" << X(c.per_gpu) - 3 << "\" y=\"" << Ym(c.peak_mb) - 3
         << "\" width=\"6\" height=\"6\" fill=\"#d62728\"/>\n";
    }
  }
  os << "<polyline points=\"" << sps_pts << "\" fill=\"none\" stroke=\"#1f77b4\" stroke-width=\"2\"/>\n";
  if (!mem_pts.empty()) {
    os << "<polyline points=\"" << mem_pts
       << "\" fill=\"none\" stroke=\"#d62728\" stroke-width=\"1.5\"/>\n";
  }
  if (r.memory_budget_mb > 0) {
    os << "<line x1=\"" << L << "\" y1=\"" << Ym(r.memory_budget_mb) << "\" x2=\"" << W - R
       << "\" y2=\"" << Ym(r.memory_budget_mb)
       << "\" stroke=\"#d62728\" stroke-dasharray=\"6,4\"/>\n"
       << "<text x=\"" << L + 4 << "\" y=\"" << Ym(r.memory_budget_mb) - 4
       << "\" fill=\"#d62728\">memory budget " << std::setprecision(0) << r.memory_budget_mb
       << " MB</text>\n"
       << std::setprecision(1);
  }
  for (const auto& c : sorted) {
    if (!isChosen(r, c) || c.failed) continue;
    os << "<circle cx=\"" << X(c.per_gpu) << "\" cy=\"" << Ys(c.global_sps)
       << "\" r=\"8\" fill=\"none\" stroke=\"green\" stroke-width=\"2.5\"/>\n"
       << "<text x=\"" << X(c.per_gpu) << "\" y=\"" << Ys(c.global_sps) - 12
       << "\" text-anchor=\"middle\" fill=\"green\">chosen: " << c.per_gpu << "</text>\n";
  }
  os << "</svg>\n";
  return os.str();
}

}  // namespace batchdist::worker
