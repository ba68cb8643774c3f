#pragma once
// metrics.jsonl written as the run goes (Note [streamed metrics]).

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>

#include "worker/train/result.h"

namespace batchdist::worker {

// Note [streamed metrics]
// ~~~~~~~~~~~~~~~~~~~~~~~
// A job killed by its time limit (SIGKILL after the grace period, or kill -9) must
// still leave its metrics. So rank 0 appends each point to OUTPUT/metrics.jsonl as
// it is made: the whole line in one write(2) to a file opened O_APPEND, so a kill
// loses at most the line being written and never leaves half of an earlier one.
// (A write that reached the kernel survives the process; only a machine crash can
// lose it, and a checkpoint fsyncs its own files.)
//
// A resumed run continues the same file: it keeps the lines up to the step it
// resumes from and drops the rest (the killed run's steps after its checkpoint,
// which the resumed run makes again, and a torn last line), so steps never go
// back and every line parses. A fresh run starts the file empty. A file that
// cannot be written costs the run a warning, not the run.

/// The task's metrics as eval_<name> keys of `o` (Note [task]), e.g. eval_accuracy:
/// metrics.jsonl's epoch lines and report.json (its history too) name them alike.
void addEvalMetrics(const Metrics& metrics, nlohmann::ordered_json& o);

/// One line of metrics.jsonl (with its newline).
std::string metricsLine(const MetricPoint& m);

/// Rank 0's metrics.jsonl, appended as training goes.
class MetricsLog {
 public:
  /// Opens `path`: emptied when `resumed_step` < 0, else cut back to its complete
  /// lines with step <= resumed_step. Warns on stderr (and writes nothing) when the
  /// file cannot be written.
  MetricsLog(std::string path, int64_t resumed_step);
  ~MetricsLog();
  MetricsLog(const MetricsLog&) = delete;
  MetricsLog& operator=(const MetricsLog&) = delete;

  /// Appends one line; after a failed write, warns once and writes no more.
  void append(const MetricPoint& m);
  /// Lines kept from the run this one resumed.
  int64_t keptLines() const { return kept_; }

 private:
  void fail(const std::string& why);
  std::string path_;
  int fd_ = -1;
  int64_t kept_ = 0;
};

/// The lines of metrics.jsonl text that a run resumed at `resumed_step` keeps:
/// complete lines (ending in a newline) that parse as an object with "step" <= resumed_step.
std::string keptMetricLines(const std::string& text, int64_t resumed_step, int64_t* kept);

}  // namespace batchdist::worker
