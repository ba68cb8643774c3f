#pragma once
// Rank 0's console: progress, one-line events, and the number formats they use.

#include <string>

namespace batchdist::worker {

/// Rank-0 console output: transient status lines on a terminal, plain lines otherwise.
class Console {
 public:
  Console(bool enabled, bool tty) : enabled_(enabled), tty_(tty) {}
  bool enabled() const { return enabled_; }
  /// A line that stays.
  void line(const std::string& s);
  /// A progress line: overwritten in place on a terminal, printed every few seconds otherwise.
  void status(const std::string& s);

 private:
  bool enabled_;
  bool tty_;
  bool pending_ = false;
  double last_plain_ = -1e9;
};

/// Fixed-point text with `digits` decimals.
std::string formatFixed(double v, int digits);

/// "1:02:03" / "2:03".
std::string formatDuration(double seconds);

}  // namespace batchdist::worker
