#include "worker/common/faults.h"

#include <algorithm>
#include <charconv>
#include <limits>
#include <sstream>
#include <system_error>

#include "common/error.h"

namespace batchdist::worker {
namespace {

/// The variable's value; empty when unset (Note [fault plan]: empty is unset).
std::string lookUp(const std::function<const char*(const char*)>& getenv_fn, const char* name) {
  const char* v = getenv_fn(name);
  return v ? std::string(v) : std::string();
}

/// `text` as a whole number (all of it) of at least `min`; else an Error naming
/// `var`: "VAR: 'text' is not WHAT" (std::atoll would read garbage as 0).
int64_t wholeNumber(const char* var, const std::string& text, const std::string& what,
                    int64_t min = std::numeric_limits<int64_t>::min()) {
  int64_t v = 0;
  const char* end = text.data() + text.size();
  const auto [at, ec] = std::from_chars(text.data(), end, v);
  if (ec != std::errc() || at != end || v < min) {
    throw Error(strCat(var, ": '", text, "' is not ", what));
  }
  return v;
}

/// One BATCHDIST_FAULT_OOM item, "R:S[:N][:forward]".
OomFault parseOomItem(const std::string& item) {
  std::vector<int64_t> v;
  std::stringstream parts(item);
  std::string part;
  bool ok = true;
  bool forward = false;
  while (std::getline(parts, part, ':')) {
    if (part == "forward" && v.size() >= 2) {
      forward = true;
      continue;
    }
    std::size_t used = 0;
    try {
      v.push_back(std::stoll(part, &used));
    } catch (const std::exception&) {
      ok = false;
    }
    ok = ok && used == part.size() && !forward;  // "forward" comes last
  }
  OomFault f;
  f.rank = v.size() > 0 ? v[0] : -1;
  f.step = v.size() > 1 ? v[1] : 0;
  f.tries = v.size() > 2 ? v[2] : 1;
  f.forward = forward;
  if (!ok || v.size() < 2 || v.size() > 3 || f.rank < 0 || f.step < 1 || f.tries < 1) {
    throw Error(strCat("BATCHDIST_FAULT_OOM: '", item, "' is not RANK:STEP[:TRIES][:forward] "
                       "(STEP 1-based; e.g. 1:5 makes rank 1 fail its first try of step 5 in "
                       "backward, 1:5:1:forward in forward)"));
  }
  return f;
}

/// BATCHDIST_FAULT_OOM="R:S[:N][:forward],...": every rank's entries (empty items skipped).
std::vector<OomFault> parseOomFaults(const std::string& list_text) {
  std::vector<OomFault> out;
  std::stringstream list(list_text);
  std::string item;
  while (std::getline(list, item, ',')) {
    if (!item.empty()) out.push_back(parseOomItem(item));
  }
  return out;
}

CheckpointKill parseCheckpointKill(const std::string& text) {
  for (const auto point : {CheckpointKill::kAfterFiles, CheckpointKill::kAfterRename}) {
    if (text == checkpointKillName(point)) return point;
  }
  throw Error(strCat("BATCHDIST_FAULT_CHECKPOINT: '", text,
                     "' is not a point of the checkpoint write: after_files or after_rename"));
}

/// BATCHDIST_FAULT_CHECKPOINT and BATCHDIST_FAULT_CHECKPOINT_STEP.
CheckpointFault parseCheckpointFault(const std::function<const char*(const char*)>& getenv_fn) {
  CheckpointFault f;
  if (const auto point = lookUp(getenv_fn, "BATCHDIST_FAULT_CHECKPOINT"); !point.empty()) {
    f.point = parseCheckpointKill(point);
  }
  if (const auto step = lookUp(getenv_fn, "BATCHDIST_FAULT_CHECKPOINT_STEP"); !step.empty()) {
    f.step = wholeNumber("BATCHDIST_FAULT_CHECKPOINT_STEP", step,
                         "a step (1-based: e.g. 8 kills the checkpoint written after step 8)", 1);
  }
  return f;
}

/// BATCHDIST_FAULT_HANG="R:S".
HangFault parseHangFault(const std::string& text) {
  HangFault f;
  if (text.empty()) return f;
  const auto colon = text.find(':');
  const std::string what = "RANK:STEP (STEP 1-based; e.g. 3:20 makes rank 3 hang before step 20)";
  if (colon == std::string::npos) throw Error(strCat("BATCHDIST_FAULT_HANG: '", text, "' is not ", what));
  f.rank = wholeNumber("BATCHDIST_FAULT_HANG", text.substr(0, colon), what, 0);
  f.step = wholeNumber("BATCHDIST_FAULT_HANG", text.substr(colon + 1), what, 1);
  return f;
}

/// A delay in microseconds; a negative one is no delay.
int64_t parseMicros(const std::function<const char*(const char*)>& getenv_fn, const char* var,
                    const char* example) {
  const auto text = lookUp(getenv_fn, var);
  if (text.empty()) return 0;
  const auto what = strCat("a whole number of microseconds (e.g. ", example, ")");
  return std::max<int64_t>(0, wholeNumber(var, text, what));
}

}  // namespace

const char* checkpointKillName(CheckpointKill point) {
  switch (point) {
    case CheckpointKill::kNone: return "none";
    case CheckpointKill::kAfterFiles: return "after_files";
    case CheckpointKill::kAfterRename: return "after_rename";
  }
  return "?";
}

bool CheckpointFault::killsAt(CheckpointKill reached, int64_t global_step) const {
  return point != CheckpointKill::kNone && point == reached && (step == 0 || step == global_step);
}

bool FaultPlan::empty() const {
  return oom.empty() && slow_update_us == 0 && slow_read_us == 0 && adapt_figures_rank < 0 &&
         checkpoint.point == CheckpointKill::kNone && checkpoint.step == 0 && version.empty() &&
         hang.rank < 0;
}

std::vector<std::pair<int64_t, bool>> FaultPlan::oomTries(int64_t rank) const {
  std::vector<std::pair<int64_t, bool>> out;
  for (const auto& f : oom) {
    for (int64_t i = 0; i < f.tries && f.rank == rank; ++i) out.emplace_back(f.step, f.forward);
  }
  return out;
}

FaultPlan faultPlanFromEnvironment(const std::function<const char*(const char*)>& getenv_fn) {
  FaultPlan plan;
  plan.oom = parseOomFaults(lookUp(getenv_fn, "BATCHDIST_FAULT_OOM"));
  plan.slow_update_us = parseMicros(getenv_fn, "BATCHDIST_FAULT_SLOW_UPDATE_US",
                                    "2000 makes this rank's optimizer update 2 ms slower");
  plan.slow_read_us = parseMicros(getenv_fn, "BATCHDIST_FAULT_SLOW_READ_US",
                                  "2000 makes every sample read 2 ms slower");
  if (const auto r = lookUp(getenv_fn, "BATCHDIST_FAULT_ADAPT_FIGURES"); !r.empty()) {
    plan.adapt_figures_rank = wholeNumber(
        "BATCHDIST_FAULT_ADAPT_FIGURES", r,
        "a rank (e.g. 1 starts rank 1 with an empty throughput table)", 0);
  }
  plan.checkpoint = parseCheckpointFault(getenv_fn);
  plan.version = lookUp(getenv_fn, "BATCHDIST_FAULT_VERSION");
  plan.hang = parseHangFault(lookUp(getenv_fn, "BATCHDIST_FAULT_HANG"));
  return plan;
}

}  // namespace batchdist::worker
