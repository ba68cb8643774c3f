#pragma once
// Rank 0's console: progress, one-line events, and the number formats they use.

#include <cstdint>
#include <string>
#include <vector>

namespace batchdist::worker {

// Note [progress output]
// ~~~~~~~~~~~~~~~~~~~~~~
// A progress bar rewritten in place (`\r`, `\e[K`) suits a terminal and ruins a log
// file: `mpirun ... | tee log` and a Slurm output file would get every rewrite,
// escape codes included. `train.progress` picks: `bar` (in place), `lines` (one
// plain line per metrics interval, at most one every kLinesEverySeconds, the first
// always), `off` (events only), or `auto` [default]: `bar` when rank 0's output
// reaches a terminal, else `lines`.
//
// "Reaches a terminal" is not isatty(1) under mpirun: Open MPI gives each rank a
// pseudo-terminal of its own whatever mpirun's output is, so every rank looks
// interactive. So a rank whose stdout is a terminal and whose parent is Open MPI's
// launcher (mpirun/orterun/prterun, or a node's orted/prted) asks about the
// parent's stdout instead (/proc/PPID/fd/1): a remote daemon's output is a socket
// and a redirected mpirun's a file or pipe, both `lines`. A parent we cannot read
// counts as not a terminal: a log without escape codes is the safer mistake.

/// How long a `lines` progress waits after the previous one (the first is always printed).
constexpr double kLinesEverySeconds = 10.0;

/// How the progress is shown: `train.progress` once `auto` is resolved.
enum class ProgressStyle { kBar, kLines, kOff };

/// `train.progress: auto` for this process's stdout: bar or lines.
ProgressStyle progressForStdout();

/// Whether `fd` of process `pid` is a terminal, from /proc (false when unreadable).
bool procFdIsTerminal(long pid, int fd);

/// Rank-0 console output: events (`line`) and the progress (`status`) in one style.
class Console {
 public:
  Console(bool enabled, ProgressStyle mode) : enabled_(enabled), mode_(mode) {}
  bool enabled() const { return enabled_; }
  ProgressStyle mode() const { return mode_; }
  /// A line that stays.
  void line(const std::string& s);
  /// A progress update, offered every step; `interval_end` marks the end of a
  /// metrics interval (the only updates `lines` mode may print).
  void status(const std::string& s, bool interval_end);

 private:
  bool enabled_;
  ProgressStyle mode_;
  bool pending_ = false;
  double last_ = -1e9;
};

/// Fixed-point text with `digits` decimals.
std::string formatFixed(double v, int digits);

/// `items` as "a, b, c" ("" when there are none).
std::string joined(const std::vector<std::string>& items);

/// "1:02:03" / "2:03".
std::string formatDuration(double seconds);

/// " (12352 tokens/s)" beside a figure of `samples_per_s` when a sample is
/// `tokens_per_sample` tokens (Note [tokens per sample] in worker/plan/plan.h);
/// "" when it is 0 (samples are not tokens).
std::string tokenRate(double samples_per_s, int64_t tokens_per_sample);

}  // namespace batchdist::worker
