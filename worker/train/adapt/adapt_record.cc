#include "worker/train/adapt/adapt_record.h"

#include <cmath>

namespace batchdist::worker::adapt_record {

namespace {
double finite(double x, double unknown) { return std::isfinite(x) ? x : unknown; }
}  // namespace

nlohmann::ordered_json throughputJson(const std::vector<ThroughputPoint>& points) {
  auto out = nlohmann::ordered_json::array();
  for (const auto& p : points) {
    if (!std::isfinite(p.samples_per_s)) continue;
    out.push_back({{"per_gpu", p.per_gpu},
                   {"samples_per_s", p.samples_per_s},
                   {"uncertainty", finite(p.uncertainty, 0)}});
  }
  return out;
}

nlohmann::ordered_json segmentsJson(const std::vector<AdaptSegment>& segments) {
  auto out = nlohmann::ordered_json::array();
  for (const auto& g : segments) {
    out.push_back({{"begin_step", g.begin_step}, {"global", g.global}, {"gain", g.gain}});
  }
  return out;
}

nlohmann::ordered_json historyJson(const std::vector<BatchChange>& history) {
  auto out = nlohmann::ordered_json::array();
  for (const auto& c : history) {
    out.push_back({{"step", c.step},
                   {"global", c.global},
                   {"per_gpu", c.per_gpu},
                   {"accum", c.accum},
                   {"gain", c.gain},
                   {"noise_scale", c.noise_scale},
                   {"efficiency", c.efficiency},
                   {"why", c.why}});
  }
  return out;
}

nlohmann::ordered_json noiseJson(const NoiseScaleEstimator::State& n) {
  return {{"steps", n.steps},
          {"ema_g2", finite(n.ema_g2, 0)},
          {"ema_tr", finite(n.ema_tr, 0)},
          {"weight", finite(n.weight, 0)},
          {"window_steps", n.window_steps},
          {"window_g2", finite(n.window_g2, 0)},
          {"window_tr", finite(n.window_tr, 0)}};
}

std::vector<ThroughputPoint> throughputFrom(const nlohmann::ordered_json& j) {
  std::vector<ThroughputPoint> out;
  for (const auto& p : j) {
    if (p.is_array()) {  // [m, samples/s, uncertainty]; before the uncertainty, two
      out.push_back({p.at(0).get<int64_t>(), p.at(1).get<double>(),
                     p.size() > 2 ? p.at(2).get<double>() : 0.0});
    } else {
      out.push_back({p.at("per_gpu").get<int64_t>(), p.at("samples_per_s").get<double>(),
                     p.at("uncertainty").get<double>()});
    }
  }
  return out;
}

std::vector<AdaptSegment> segmentsFrom(const nlohmann::ordered_json& j) {
  std::vector<AdaptSegment> out;
  for (const auto& g : j) {
    if (g.is_array()) {  // [begin_step, global, gain]
      out.push_back({g.at(0).get<int64_t>(), g.at(1).get<int64_t>(), g.at(2).get<double>()});
    } else {
      out.push_back({g.at("begin_step").get<int64_t>(), g.at("global").get<int64_t>(),
                     g.at("gain").get<double>()});
    }
  }
  return out;
}

std::vector<BatchChange> historyFrom(const nlohmann::ordered_json& j) {
  std::vector<BatchChange> out;
  for (const auto& h : j) {
    if (h.is_array()) {  // [step, global, per_gpu, accum, gain, noise_scale, efficiency, why]
      out.push_back({h.at(0).get<int64_t>(), h.at(1).get<int64_t>(), h.at(2).get<int64_t>(),
                     h.at(3).get<int64_t>(), h.at(4).get<double>(), h.at(5).get<double>(),
                     h.at(6).get<double>(), h.at(7).get<std::string>()});
    } else {
      out.push_back({h.at("step").get<int64_t>(), h.at("global").get<int64_t>(),
                     h.at("per_gpu").get<int64_t>(), h.at("accum").get<int64_t>(),
                     h.at("gain").get<double>(), h.at("noise_scale").get<double>(),
                     h.at("efficiency").get<double>(), h.at("why").get<std::string>()});
    }
  }
  return out;
}

NoiseScaleEstimator::State noiseFrom(const nlohmann::ordered_json& n) {
  if (n.is_array()) {  // [steps, ema_g2, ema_tr, weight, window_steps, window_g2, window_tr]
    return {n.at(0).get<int64_t>(), n.at(1).get<double>(), n.at(2).get<double>(),
            n.at(3).get<double>(), n.at(4).get<int64_t>(), n.at(5).get<double>(),
            n.at(6).get<double>()};
  }
  return {n.at("steps").get<int64_t>(),       n.at("ema_g2").get<double>(),
          n.at("ema_tr").get<double>(),       n.at("weight").get<double>(),
          n.at("window_steps").get<int64_t>(), n.at("window_g2").get<double>(),
          n.at("window_tr").get<double>()};
}

}  // namespace batchdist::worker::adapt_record
