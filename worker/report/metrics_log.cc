#include "worker/report/metrics_log.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <iostream>

#include <nlohmann/json.hpp>

#include "common/error.h"
#include "worker/common/files.h"
#include "worker/common/util.h"

namespace batchdist::worker {

void addEvalMetrics(const Metrics& metrics, nlohmann::ordered_json& o) {
  for (const auto& x : metrics) o["eval_" + x.name] = x.value;
}

std::string metricsLine(const MetricPoint& m) {
  const double total = m.time.total();
  nlohmann::ordered_json j{{"kind", m.epoch_end ? "epoch" : "step"},
                           {"step", m.step},
                           {"epoch", m.epoch},
                           {"seconds", m.seconds},
                           {"train_loss", m.train_loss},
                           {"lr", m.lr},
                           {"samples_per_s", m.samples_per_s},
                           {"data_wait_fraction", shareOf(m.time.data_wait, total)},
                           {"compute_fraction", shareOf(m.time.compute, total)},
                           {"comm_fraction", shareOf(m.time.comm, total)},
                           {"skew_fraction", shareOf(m.time.skew, total)},
                           {"noise_scale", m.noise_scale > 0 ? nlohmann::ordered_json(m.noise_scale)
                                                             : nlohmann::ordered_json()},
                           {"global_batch", m.global_batch},
                           {"per_gpu_batch", m.per_gpu},
                           {"accum", m.accum},
                           {"peak_memory_mb", m.peak_memory_mb}};
  if (m.tokens_per_sample > 0) {  // Note [tokens per sample]
    j["tokens_per_s"] = m.samples_per_s * static_cast<double>(m.tokens_per_sample);
    j["tokens_per_step"] = m.global_batch * m.tokens_per_sample;
  }
  if (m.mfu >= 0) j["mfu"] = m.mfu;  // Note [mfu]
  if (m.progress >= 0) j["progress"] = m.progress;  // batch.adapt: G0-equivalent steps
  addSystemMetrics(m.system, j);  // Note [system metrics]: the ones read
  if (m.epoch_end) {
    j["eval_loss"] = m.eval_loss;
    addEvalMetrics(m.eval_metrics, j);
  }
  // Non-finite losses are written as null (JSON has no NaN), never as bad text.
  return j.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace) + "\n";
}

std::string keptMetricLines(const std::string& text, int64_t resumed_step, int64_t* kept) {
  std::string out;
  *kept = 0;
  std::size_t at = 0;
  while (at < text.size()) {
    const auto end = text.find('\n', at);
    if (end == std::string::npos) break;  // torn by a kill: dropped
    const auto line = text.substr(at, end - at);
    at = end + 1;
    const auto j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!j.is_object() || !j.contains("step") || !j["step"].is_number_integer()) continue;
    if (j["step"].get<int64_t>() > resumed_step) break;  // made again by the resumed run
    out += line + "\n";
    ++*kept;
  }
  return out;
}

MetricsLog::MetricsLog(std::string path, int64_t resumed_step) : path_(std::move(path)) {
  try {
    std::string keep;
    if (resumed_step >= 0 && std::filesystem::is_regular_file(path_)) {
      keep = keptMetricLines(readFileBounded(path_, kMaxStreamBytes, "metrics file"), resumed_step,
                             &kept_);
    }
    writeFileAtomic(path_, keep);
  } catch (const std::exception& e) {
    fail(e.what());
    return;
  }
  fd_ = ::open(path_.c_str(), O_WRONLY | O_APPEND | O_CLOEXEC);
  if (fd_ < 0) fail(strCat("cannot open ", path_, ": ", std::strerror(errno)));
}

MetricsLog::~MetricsLog() {
  if (fd_ >= 0) ::close(fd_);
}

void MetricsLog::append(const MetricPoint& m) {
  if (fd_ < 0) return;
  const std::string line = metricsLine(m);
  // One write for the whole line (O_APPEND): a kill loses at most this line.
  const ssize_t n = ::write(fd_, line.data(), line.size());
  if (n != static_cast<ssize_t>(line.size())) {
    fail(n < 0 ? strCat("cannot write ", path_, ": ", std::strerror(errno))
               : strCat("cannot write ", path_, ": short write"));
  }
}

void MetricsLog::fail(const std::string& why) {
  std::cerr << strCat("batchdist: warning: metrics.jsonl is not written from here on: ", why, "\n")
            << std::flush;
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

}  // namespace batchdist::worker
