#include "worker/report.h"

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "collective/error.h"
#include "worker/json.h"

namespace batchdist::worker {

std::string runReport(const Config& cfg, const Plan& plan, const TrainResult& r,
                      const RunInfo& info) {
  std::vector<std::string> history;
  for (const auto& h : r.history) {
    history.push_back(json::Object()
                          .add("epoch", h.epoch + 1)
                          .add("train_loss", h.train_loss)
                          .add("eval_loss", h.eval_loss)
                          .add("eval_accuracy", h.eval_accuracy)
                          .add("samples_per_s", h.samples_per_s)
                          .add("seconds", h.seconds)
                          .str());
  }
  json::Object o;
  o.add("batchdist_version", BATCHDIST_VERSION)
      .add("torch_version", info.torch_version)
      .add("world_size", info.world_size)
      .add("backend", info.backend)
      .add("device", info.device)
      .add("data", info.data_origin)
      .add("per_gpu_batch", plan.per_gpu)
      .add("accum_steps", plan.accum)
      .add("global_batch", plan.global)
      .add("lr", plan.lr)
      .add("warmup_steps", plan.warmup_steps)
      .add("schedule", toString(plan.schedule))
      .add("epochs", r.epochs)
      .add("steps", r.steps)
      .add("samples", r.samples)
      .add("samples_per_s", r.samples_per_s)
      .add("train_loss", r.train_loss)
      .add("eval_loss", r.eval_loss)
      .add("eval_accuracy", r.eval_accuracy)
      .add("wall_s", r.wall_s)
      .raw("plan", planJson(plan))
      .raw("history", json::array(history));
  std::string s = o.str();
  if (!info.extra_json.empty()) s.insert(s.size() - 1, ", " + info.extra_json);
  s.insert(s.size() - 1, ", \"config\": " + resolvedJson(cfg));
  return s + "\n";
}

void writeFileAtomic(const std::string& path, const std::string& text) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path p(path);
  if (p.has_parent_path()) fs::create_directories(p.parent_path(), ec);
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) throw Error(strCat("cannot write ", path, ": ", std::strerror(errno)));
    out << text;
    out.flush();
    if (!out) throw Error(strCat("cannot write ", path, ": ", std::strerror(errno)));
  }
  fs::rename(tmp, p, ec);
  if (ec) throw Error(strCat("cannot write ", path, ": ", ec.message()));
}

}  // namespace batchdist::worker
