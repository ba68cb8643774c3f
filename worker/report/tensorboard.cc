#include "worker/report/tensorboard.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "worker/common/util.h"

namespace batchdist::worker {

std::vector<Scalar> metricScalars(const MetricPoint& m) {
  if (m.epoch_end) {
    std::vector<Scalar> v{{"eval/loss", m.eval_loss}};
    for (const auto& x : m.eval_metrics) {
      // Note [task]; a language model's `loss` metric is eval/loss itself.
      if (x.name != "loss") v.push_back({"eval/" + x.name, x.value});
    }
    v.push_back({"train/epoch_loss", m.train_loss});
    v.push_back({"train/epoch_samples_per_s", m.samples_per_s});
    if (m.tokens_per_sample > 0) {  // Note [tokens per sample]
      v.push_back({"train/epoch_tokens_per_s", m.samples_per_s * static_cast<double>(m.tokens_per_sample)});
    }
    if (m.mfu >= 0) v.push_back({"train/epoch_mfu", m.mfu});  // Note [mfu]
    return v;
  }
  const double total = m.time.total();
  std::vector<Scalar> v{{"train/loss", m.train_loss},
                        {"train/lr", m.lr},
                        {"train/samples_per_s", m.samples_per_s},
                        {"batch/global", static_cast<double>(m.global_batch)},
                        {"batch/per_gpu", static_cast<double>(m.per_gpu)},
                        {"batch/accum", static_cast<double>(m.accum)},
                        {"time/data_wait", shareOf(m.time.data_wait, total)},
                        {"time/compute", shareOf(m.time.compute, total)},
                        {"time/communication", shareOf(m.time.comm, total)},
                        {"time/skew", shareOf(m.time.skew, total)},
                        {"memory/peak_mb", m.peak_memory_mb}};
  if (m.noise_scale > 0) v.emplace_back("noise/B_simple", m.noise_scale);
  for (std::size_t i = 0; i < kSystemMetrics; ++i) {  // Note [system metrics]: the ones read
    if (!std::isnan(m.system.value[i])) {
      v.emplace_back(std::string("system/") + systemMetricInfo(static_cast<SystemMetric>(i)).key,
                     m.system.value[i]);
    }
  }
  if (m.tokens_per_sample > 0) {  // Note [tokens per sample]
    const auto tokens = static_cast<double>(m.tokens_per_sample);
    v.emplace_back("train/tokens_per_s", m.samples_per_s * tokens);
    v.emplace_back("batch/global_tokens", static_cast<double>(m.global_batch) * tokens);
  }
  if (m.mfu >= 0) v.emplace_back("train/mfu", m.mfu);  // Note [mfu]
  return v;
}

std::vector<std::pair<int64_t, std::vector<Scalar>>> searchScalars(const SearchResult& r) {
  std::vector<std::pair<int64_t, std::vector<Scalar>>> out;
  if (r.cached) return out;
  for (const auto& c : r.candidates) {
    if (c.failed) continue;
    out.push_back({c.per_gpu, {{"search/samples_per_s", c.global_sps},
                               {"search/peak_memory_mb", c.peak_mb}}});
    if (r.tokens_per_sample > 0) {  // Note [tokens per sample]
      out.back().second.emplace_back("search/tokens_per_s",
                                     c.global_sps * static_cast<double>(r.tokens_per_sample));
    }
  }
  // Measured in the walk's order (doubling, then the boundary); TensorBoard draws
  // a series in the order written, so by batch size.
  std::stable_sort(out.begin(), out.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  return out;
}

void writeSearchEvents(const std::string& dir, const SearchResult& r) {
  const auto series = searchScalars(r);
  if (series.empty()) return;
  EventFileWriter w(dir, 0);
  for (const auto& [per_gpu, values] : series) w.scalars(per_gpu, values);
}

}  // namespace batchdist::worker
