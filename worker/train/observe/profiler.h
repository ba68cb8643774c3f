#pragma once
// Profiler traces of a few training steps, one Chrome-trace JSON per rank.
//
// Note [step profiler]
// ~~~~~~~~~~~~~~~~~~~~
// The profile section schedules it as torch.profiler's schedule does, in steps
// of this run: `wait` steps untouched, `warmup` steps with the profiler prepared
// (Kineto's set-up, CUPTI's first-use cost, stays out of the traced steps), then
// `active` steps traced, each inside a "ProfilerStep#N" range (N: the global
// step, 1-based), with batchdist's phases as named ranges (Note [trace ranges]
// in common/trace.h). Only the active steps pay for it; the steps before and
// after run as without a profile section.
//
// Every rank writes OUTPUT/profile/<host>_rank<R>.pt.trace.json after its last
// active step: the layout of torch.profiler.tensorboard_trace_handler, which
// TensorBoard's PyTorch profiler plugin reads as one run, and a Chrome trace
// that Perfetto and chrome://tracing open. With Kineto (LibTorch 2.x) the file
// is Kineto's own trace (CPU operators, and on CUDA the kernels, memcpys and
// their launches); without it (Debian's 1.13) the profiler still collects the
// CPU operators and ranges, and they are written in the same format
// (writeChromeTrace). Either way the file gets "distributedInfo" (backend,
// rank, world size: the plugin's distributed view) and "batchdist" (the steps
// traced, the host). A run that ends before its last active step writes what it
// traced. Profiling is this rank's own business: no collective, nothing agreed.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "worker/config/config.h"

namespace at {
class RecordFunction;
}

namespace batchdist::worker {

/// What a profile wrote, for the report (rank 0's).
struct ProfileOutcome {
  std::string file;              ///< this rank's trace ("": none written)
  std::vector<int64_t> steps;    ///< the global steps traced
  bool kineto = false;           ///< Kineto's trace (else the CPU collection's)
  double traced_step_s = -1;     ///< median wall time of the traced steps (-1: none)
  double other_step_s = -1;      ///< ... of this run's other steps but its first (-1: none)
  std::string error;             ///< why no trace was written ("": none)
  nlohmann::ordered_json json() const;
};

/// One trace event as the writer takes it: a complete range ("X") or an instant ("i").
struct TraceEvent {
  std::string name;
  std::string category;  ///< "cpu_op", "user_annotation", "cpu_instant_event"
  uint64_t start_us = 0;
  uint64_t duration_us = 0;
  uint64_t thread = 0;
  bool instant = false;
  nlohmann::ordered_json args = nlohmann::ordered_json::object();
};

/// A Chrome trace ({"traceEvents": [...]}) of `events`, process `pid`.
nlohmann::ordered_json chromeTrace(const std::vector<TraceEvent>& events, int pid);

class StepProfiler {
 public:
  /// `dir`: where the trace goes (OUTPUT/profile); `backend`, `rank`, `world`
  /// for "distributedInfo"; `cuda`: trace the device's activity too.
  StepProfiler(const ProfileConfig& cfg, std::string dir, std::string backend, int rank, int world,
               bool cuda);
  ~StepProfiler();
  StepProfiler(const StepProfiler&) = delete;
  StepProfiler& operator=(const StepProfiler&) = delete;

  /// Before global step `step` (1-based), the run's next: the schedule moves on.
  void beginStep(int64_t step);
  /// After it: its range ends; after the last active step, or when `last` (the
  /// run's last step) the trace is written (true: written now, or the profiler
  /// failed to start in this step: outcome().error says why; the run goes on).
  bool endStep(bool last = false);
  /// The run ended: endStep() of its last step (a trace begun and not written is
  /// written now; a start that failed in a step never ended is said).
  bool finish();
  const ProfileOutcome& outcome() const { return outcome_; }
  /// The outcome with the cost in it: `step_seconds`, the wall time of each of
  /// this run's steps in order.
  ProfileOutcome outcomeWithCost(const std::vector<double>& step_seconds) const;

 private:
  /// The profiler prepared or enabled as run step `i` (0-based) begins.
  void schedule(int64_t i);
  void write();

  ProfileConfig cfg_;
  std::string dir_;
  std::string backend_;
  int rank_, world_;
  bool cuda_;
  int64_t index_ = 0;  ///< steps begun in this run
  bool prepared_ = false, enabled_ = false;
  bool failed_now_ = false;  ///< it failed to start in the current step: endStep says so
  std::unique_ptr<at::RecordFunction> step_range_;
  ProfileOutcome outcome_;
};

}  // namespace batchdist::worker
