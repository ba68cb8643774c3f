#include "worker/common/console.h"

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <iostream>

#include "worker/common/util.h"

namespace batchdist::worker {

std::string formatFixed(double v, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", digits, v);
  return buf;
}

std::string formatDuration(double s) {
  if (!std::isfinite(s) || s < 0) return "?";
  const auto total = static_cast<int64_t>(std::llround(s));
  char buf[32];
  if (total >= 3600) {
    std::snprintf(buf, sizeof buf, "%lld:%02lld:%02lld", static_cast<long long>(total / 3600),
                  static_cast<long long>(total / 60 % 60), static_cast<long long>(total % 60));
  } else {
    std::snprintf(buf, sizeof buf, "%lld:%02lld", static_cast<long long>(total / 60),
                  static_cast<long long>(total % 60));
  }
  return buf;
}

void Console::line(const std::string& s) {
  if (!enabled_) return;
  if (pending_) std::cout << "\r\033[K";
  pending_ = false;
  std::cout << s << std::endl;
}

void Console::status(const std::string& s) {
  if (!enabled_) return;
  const double t = monotonicSeconds();
  if (tty_) {
    if (t - last_plain_ < 0.2) return;  // a terminal needs no more than 5 updates a second
    std::cout << "\r\033[K" << s << std::flush;
    pending_ = true;
    last_plain_ = t;
  } else if (t - last_plain_ >= 5.0) {
    std::cout << s << std::endl;
    last_plain_ = t;
  }
}

}  // namespace batchdist::worker
