#include "worker/run_report.h"

#include <csignal>
#include <cstring>
#include <filesystem>
#include <iostream>

#include "collective/torch_compat.h"
#include "worker/common/files.h"
#include "worker/common/util.h"
#include "worker/model/model.h"
#include "worker/report/diagnose.h"
#include "worker/report/html.h"
#include "worker/report/report.h"
#include "worker/search/output.h"
#include "worker/train/observe/system_metrics.h"

namespace batchdist::worker {
namespace fs = std::filesystem;

namespace {

/// What ran, and where: the fields every report opens with.
RunInfo runInfo(const RankPlace& place, const RunSetup& s, collective::Communicator& comm) {
  RunInfo info;
  info.world_size = place.size;
  info.hosts = place.host_count;
  info.backend = comm.backendName();
  info.device = s.device.str();
  info.torch_version = compat::torchVersion();
  info.data_origin = s.data.origin;
  info.cpu_blas = s.blas.name;
  return info;
}

/// The report's figures of a finished (or stopped) training run.
RunInfo trainedRunInfo(const RankPlace& place, const RunSetup& s, const RunDecision& d,
                       collective::Communicator& comm, const TrainResult& result, int sig,
                       const std::string& model_path, const Yardstick& yardstick,
                       bool model_channels_last) {
  RunInfo info = runInfo(place, s, comm);
  info.yardstick = yardstick;
  info.validation_samples = s.data.val.size();
  info.train_samples = s.data.train.size();
  info.classes = s.data.train.classes;
  info.model_path = model_path;
  info.channels_last = model_channels_last;
  if (!result.completed) {
    info.stopped_by = result.failure.empty() ? strCat("SIG", sigabbrev_np(sig ? sig : SIGTERM))
                                             : std::string("out of memory");
  }
  info.search = d.searched;
  if (d.resumed) {
    info.resumed_path = d.resumed->checkpoint.path;
    info.resumed_step = d.resumed->checkpoint.manifest.step;
    info.resumed_world = d.resumed->checkpoint.manifest.plan.world_size;
  }
  const auto name = s.device.is_cuda() ? compat::cudaDeviceName(s.device.index()) : "cpu";
  info.diagnosis = diagnose(d.cfg, result, s.device.is_cuda(), name, info.train_samples,
                            d.plan.tokens_per_sample, &yardstick);
  if (d.searched && !d.searched->data_bound.empty()) {
    info.diagnosis.push_back(d.searched->data_bound);
  }
  return info;
}

/// report.json (and --report), then report.html from the documents as written.
void writeReports(const RunRequest& req, const Config& cfg, const Plan& plan,
                  const TrainResult& result, const RunInfo& info,
                  const std::optional<SearchResult>& searched) {
  // Paths from the command line (--output, the config's directory) may hold bytes
  // that are not UTF-8; the report must still be written once the run is done.
  // The split training ended with (Note [oom back-off]: it may have backed off).
  const auto report_json = runReport(cfg, plan, result, info);
  const auto report =
      report_json.dump(2, ' ', false, nlohmann::ordered_json::error_handler_t::replace) + "\n";
  writeFileAtomic((fs::path(req.output) / "report.json").string(), report);
  if (!req.report.empty()) writeFileAtomic(req.report, report);
  // The page reads the documents (the search's as search.json has it), so what it
  // shows is what the files hold; invalid UTF-8 is replaced as in the report.
  const auto page_report = nlohmann::ordered_json::parse(report);
  const auto page_search =
      searched ? nlohmann::ordered_json::parse(searchJson(*searched).dump(
                     -1, ' ', false, nlohmann::ordered_json::error_handler_t::replace))
               : nlohmann::ordered_json();
  writeFileAtomic((fs::path(req.output) / "report.html").string(),
                  reportHtml(page_report, page_search, result.metrics));
}

/// The closing "system:" line: the metrics over the run, or that a run shorter
/// than report.sample_s took no sample (it said nothing); "" without metrics.
std::string systemLine(const TrainResult& result, double sample_s) {
  if (const auto text = systemText(acrossRanks(result.system)); !text.empty()) {
    const auto n = result.system.size();
    return strCat("system", n > 1 ? strCat(" (the ", n, " ranks' mean; memory and temperature: "
                                           "the highest)")
                                  : std::string(),
                  ": ", text);
  }
  int64_t taken = 0;
  for (const auto& x : result.system) taken += x.run.samples;
  if (result.system.empty() || taken > 0) return "";
  return strCat("system: no sample was taken: training ended before the first one (every ", sample_s,
                " s, report.sample_s)");
}

/// Rank 0's closing lines: where the time went, the diagnosis, the noise scale, the outcome.
void summaryLines(const RunRequest& req, const RunSetup& s, const RunDecision& d,
                  const Trainer& trainer, const TrainResult& result, const RunInfo& info,
                  Console& console) {
  const auto& t = result.time;
  const double tt = std::max(1e-9, t.total());
  console.line(strCat("time: data wait ", formatFixed(100 * t.data_wait / tt, 1), " %, compute ",
                      formatFixed(100 * t.compute / tt, 1), " %, communication ",
                      formatFixed(100 * t.comm / tt, 1), " %, waiting for slower ranks ",
                      formatFixed(100 * t.skew / tt, 1), " % of step time (rank 0)"));
  if (const auto line = systemLine(result, d.cfg.report.sample_s); !line.empty()) console.line(line);
  for (const auto& f : info.diagnosis) console.line("diagnosis: " + f);
  if (result.noise.b_simple > 0) {
    // Note [tokens per sample]: on token windows B_simple and G in tokens too.
    const int64_t tokens = trainer.plan().tokens_per_sample;
    const double b = result.noise.b_simple;
    console.line(strCat("gradient noise scale: B_simple ~ ", noiseScaleText(b), " samples (",
                        tokens > 0 ? strCat(noiseScaleText(b * static_cast<double>(tokens)),
                                            " tokens, ")
                                   : std::string(),
                        "smoothed), global batch ", trainer.plan().global,
                        tokens > 0 ? strCat(" (", trainer.plan().tokensPerStep(), " tokens)")
                                   : std::string()));
  }
  console.line(strCat(result.completed ? "done: " : "stopped early: ", result.steps,
                      " steps, ",
                      result.progress >= 0
                          ? strCat(formatFixed(result.progress, 1), " at G0 = ", d.plan.global,
                                   " (batch.adapt), ")
                          : std::string(),
                      s.data.val.size() > 0
                          ? strCat(trainer.task().describe(result.eval_metrics), ", ")
                          : std::string("no validation set, "),
                      static_cast<int64_t>(result.samples_per_s), " samples/s",
                      tokenRate(result.samples_per_s, trainer.plan().tokens_per_sample),
                      trainer.yardstick().known()
                          ? strCat(", MFU ", mfuText(trainer.yardstick().mfu(result.samples_per_s)))
                          : std::string(),
                      ", ", formatDuration(result.wall_s), "; wrote ", req.output,
                      "/report.json, report.html, metrics.jsonl and model.pt"));
}

}  // namespace

/// Rank 0's artifacts and summary lines after training.
void finishRun(const RunRequest& req, const RankPlace& place, const RunSetup& s,
               const RunDecision& d, collective::Communicator& comm, Trainer& trainer,
               const TrainResult& result, int sig, Console& console) {
  const std::string model_path = (fs::path(req.output) / "model.pt").string();
  writeFileAtomic(model_path, trainer.model().serialize());
  const RunInfo info = trainedRunInfo(place, s, d, comm, result, sig, model_path, trainer.yardstick(),
                                      trainer.model().channelsLast());
  writeReports(req, d.cfg, trainer.plan(), result, info, d.searched);
  summaryLines(req, s, d, trainer, result, info, console);
}

/// Rank 0's report of a run stopped during the batch search (nothing trained, so
/// no model, metrics or page): report.json, and --report when given.
void finishStoppedSearch(const RunRequest& req, const RankPlace& place, const RunSetup& s,
                         const Config& cfg, collective::Communicator& comm,
                         int64_t last_per_gpu, double seconds, int sig) {
  RunInfo info = runInfo(place, s, comm);
  info.stopped_by = strCat("SIG", sigabbrev_np(sig ? sig : SIGTERM));
  const auto report =
      searchStoppedReport(cfg, info, last_per_gpu, seconds)
          .dump(2, ' ', false, nlohmann::ordered_json::error_handler_t::replace) +
      "\n";
  writeFileAtomic((fs::path(req.output) / "report.json").string(), report);
  if (!req.report.empty()) writeFileAtomic(req.report, report);
}

}  // namespace batchdist::worker
