// Note [step profiler].
#include "worker/train/observe/profiler.h"

#include <ATen/record_function.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <set>

#include "common/error.h"
#include "common/host.h"
#include "common/profiler_compat.h"
#include "worker/common/files.h"
#include "worker/search/stats.h"

namespace batchdist::worker {
namespace fs = std::filesystem;
namespace prof = torch::autograd::profiler;
using torch::profiler::impl::ActivityType;

namespace {

torch::profiler::impl::ProfilerConfig profilerConfig(const ProfileConfig& c) {
  return torch::profiler::impl::ProfilerConfig(torch::profiler::impl::ProfilerState::KINETO,
                                               c.shapes, c.memory, c.stack);
}

std::set<ActivityType> activities(bool cuda) {
  std::set<ActivityType> a{ActivityType::CPU};
  if (cuda) a.insert(ActivityType::CUDA);
  return a;
}

/// The collected events as the writer takes them (the path without Kineto).
std::vector<TraceEvent> traceEvents(const prof::ProfilerResult& result) {
  std::vector<TraceEvent> out;
  out.reserve(result.events().size());
  for (const auto& e : result.events()) {
    TraceEvent t;
    t.name = e.name();
    t.start_us = compat::eventStartUs(e);
    t.duration_us = compat::eventDurationUs(e);
    t.thread = e.startThreadId();
    if (t.name == "[memory]") {
      t.instant = true;
      t.category = "cpu_instant_event";
    } else {
      t.category = e.scope() == static_cast<uint8_t>(at::RecordScope::USER_SCOPE) ? "user_annotation"
                                                                                  : "cpu_op";
    }
    if (e.hasShapes() && !e.shapes().empty()) {
      auto dims = nlohmann::ordered_json::array();
      for (const auto& s : e.shapes()) dims.push_back(s);
      t.args["Input Dims"] = dims;
    }
    out.push_back(std::move(t));
  }
  return out;
}

/// Kineto's own trace of `result` (LibTorch 2.x), or null where save() writes
/// nothing (built without Kineto).
nlohmann::ordered_json kinetoTrace(prof::ProfilerResult& result, const std::string& tmp) {
  try {
    result.save(tmp);
  } catch (const std::exception&) {
    // "not built with Kineto" on some builds: the events are written instead.
  }
  std::error_code ec;
  if (!fs::exists(tmp, ec) || fs::file_size(tmp, ec) == 0) {
    fs::remove(tmp, ec);
    return nullptr;
  }
  std::ifstream in(tmp);
  auto j = nlohmann::ordered_json::parse(in, nullptr, /*allow_exceptions=*/false);
  fs::remove(tmp, ec);
  if (j.is_discarded() || !j.is_object()) {
    throw Error(strCat("profile: Kineto's trace in ", tmp, " is not a JSON object"));
  }
  return j;
}

/// A gradient bucket's collective (collective::bucketTraceName).
bool isCollectiveName(const std::string& name) {
  return name.rfind("batchdist/", 0) == 0 && name.find(" bucket ") != std::string::npos;
}

bool isCollective(const nlohmann::ordered_json& e) {
  return e.is_object() && e.value("ph", "") == "X" && isCollectiveName(e.value("name", ""));
}

/// Note [trace ranges]: a collective's range may outlive the range it began in
/// (launched in backward, done in the gradient sync) and overlap the next
/// bucket's, so as slices of the launching thread they would not nest, which
/// Perfetto and TensorBoard's profiler plugin reject. They become async events
/// ("b" and "e", an id each), drawn on tracks of their own.
void collectivesAsAsync(nlohmann::ordered_json& trace) {
  auto& events = trace["traceEvents"];
  auto out = nlohmann::ordered_json::array();
  int64_t id = 0;
  for (auto& e : events) {
    if (!isCollective(e)) {
      out.push_back(std::move(e));
      continue;
    }
    nlohmann::ordered_json begin{{"ph", "b"}, {"cat", "batchdist_collective"}, {"name", e["name"]},
                                 {"id", ++id}, {"pid", e["pid"]}, {"tid", e["tid"]}, {"ts", e["ts"]}};
    nlohmann::ordered_json end = begin;
    end["ph"] = "e";
    end["ts"] = e["ts"].get<double>() + e["dur"].get<double>();
    out.push_back(std::move(begin));
    out.push_back(std::move(end));
  }
  events = std::move(out);
}

/// Whole microseconds (the 1.13 events') can end a range 1 us after the range
/// holding it: each range is cut at its parent's end, so ranges on a thread nest.
void nestPerThread(std::vector<TraceEvent>& events) {
  std::stable_sort(events.begin(), events.end(), [](const TraceEvent& a, const TraceEvent& b) {
    if (a.thread != b.thread) return a.thread < b.thread;
    if (a.start_us != b.start_us) return a.start_us < b.start_us;
    return a.duration_us > b.duration_us;
  });
  std::vector<uint64_t> ends;  // open ranges of the current thread
  uint64_t thread = 0;
  for (auto& e : events) {
    if (e.instant || isCollectiveName(e.name)) continue;  // async: collectivesAsAsync
    if (e.thread != thread) ends.clear();
    thread = e.thread;
    while (!ends.empty() && ends.back() <= e.start_us) ends.pop_back();
    if (!ends.empty()) e.duration_us = std::min(e.duration_us, ends.back() - e.start_us);
    ends.push_back(e.start_us + e.duration_us);
  }
}

}  // namespace

nlohmann::ordered_json ProfileOutcome::json() const {
  nlohmann::ordered_json j;
  j["file"] = file;
  j["steps"] = steps;
  j["kineto"] = kineto;
  if (traced_step_s >= 0) j["traced_step_seconds"] = traced_step_s;
  if (other_step_s >= 0) j["other_step_seconds"] = other_step_s;
  if (!error.empty()) j["error"] = error;
  return j;
}

nlohmann::ordered_json chromeTrace(const std::vector<TraceEvent>& events, int pid) {
  auto list = nlohmann::ordered_json::array();
  for (const auto& e : events) {
    nlohmann::ordered_json j;
    j["ph"] = e.instant ? "i" : "X";
    j["cat"] = e.category;
    j["name"] = e.name;
    j["pid"] = pid;
    j["tid"] = e.thread;
    j["ts"] = e.start_us;
    if (e.instant) {
      j["s"] = "t";
    } else {
      j["dur"] = e.duration_us;
    }
    if (!e.args.empty()) j["args"] = e.args;
    list.push_back(std::move(j));
  }
  nlohmann::ordered_json trace;
  trace["schemaVersion"] = 1;
  trace["displayTimeUnit"] = "ms";
  trace["traceEvents"] = std::move(list);
  return trace;
}

StepProfiler::StepProfiler(const ProfileConfig& cfg, std::string dir, std::string backend, int rank,
                           int world, bool cuda)
    : cfg_(cfg), dir_(std::move(dir)), backend_(std::move(backend)), rank_(rank), world_(world),
      cuda_(cuda) {}

StepProfiler::~StepProfiler() {
  if (!enabled_) return;
  step_range_.reset();
  try {
    prof::disableProfiler();  // an exception ends the run: nothing is written
  } catch (const std::exception&) {
  }
}

void StepProfiler::beginStep(int64_t step) {
  const int64_t i = index_++;
  if (!outcome_.error.empty()) return;  // it failed to start: the run goes on without
  try {
    schedule(i);
  } catch (const std::exception& e) {
    outcome_.error = strCat("the profiler did not start: ", firstLine(e.what()));
    failed_now_ = true;
    return;
  }
  if (!enabled_) return;
  outcome_.steps.push_back(step);
  step_range_ = std::make_unique<at::RecordFunction>(at::RecordScope::USER_SCOPE);
  if (step_range_->isActive()) step_range_->before(strCat("ProfilerStep#", step));
}

void StepProfiler::schedule(int64_t i) {
  if (i == cfg_.wait && cfg_.warmup > 0 && !prepared_) {
    prof::prepareProfiler(profilerConfig(cfg_), activities(cuda_));
    prepared_ = true;
  }
  if (i == cfg_.wait + cfg_.warmup) {
    if (!prepared_) prof::prepareProfiler(profilerConfig(cfg_), activities(cuda_));
    prof::enableProfiler(profilerConfig(cfg_), activities(cuda_));
    enabled_ = true;
  }
}

bool StepProfiler::endStep(bool last) {
  if (failed_now_) {  // say it once, at the step it failed in
    failed_now_ = false;
    return true;
  }
  if (!enabled_) return false;
  step_range_.reset();  // ends the step's range
  if (!last && static_cast<int64_t>(outcome_.steps.size()) < cfg_.active) return false;
  write();
  return true;
}

bool StepProfiler::finish() { return endStep(/*last=*/true); }

ProfileOutcome StepProfiler::outcomeWithCost(const std::vector<double>& step_seconds) const {
  ProfileOutcome o = outcome_;
  const auto from = static_cast<std::size_t>(cfg_.wait + cfg_.warmup);
  const std::size_t to = from + o.steps.size();
  std::vector<double> traced, other;
  for (std::size_t i = 1; i < step_seconds.size(); ++i) {  // the first: set-up, not the profiler
    (i >= from && i < to ? traced : other).push_back(step_seconds[i]);
  }
  if (from == 0 && !step_seconds.empty() && to > 0) traced.push_back(step_seconds[0]);
  if (!traced.empty()) o.traced_step_s = median(traced);
  if (!other.empty()) o.other_step_s = median(other);
  return o;
}

void StepProfiler::write() {
  enabled_ = false;
  const std::string host = hostName();
  const fs::path path = fs::path(dir_) / strCat(host, "_rank", rank_, ".pt.trace.json");
  try {
    auto result = prof::disableProfiler();
    fs::create_directories(dir_);
    auto trace = kinetoTrace(*result, path.string() + ".kineto.tmp");
    outcome_.kineto = !trace.is_null();
    if (trace.is_null()) {
      auto events = traceEvents(*result);
      nestPerThread(events);
      trace = chromeTrace(events, static_cast<int>(getpid()));
    }
    collectivesAsAsync(trace);
    trace["distributedInfo"] = {{"backend", backend_}, {"rank", rank_}, {"world_size", world_}};
    trace["batchdist"] = {{"host", host}, {"rank", rank_}, {"steps", outcome_.steps},
                          {"kineto", outcome_.kineto}};
    writeFileAtomic(path.string(), trace.dump());
    outcome_.file = path.string();
  } catch (const std::exception& e) {
    // The trace is an extra: the run goes on, the report says why it is missing.
    outcome_.error = strCat("could not write ", path.string(), ": ", firstLine(e.what()));
  }
}

}  // namespace batchdist::worker
