#include "worker/common/console.h"

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <unistd.h>

#include "common/error.h"
#include "worker/common/util.h"

namespace batchdist::worker {

std::string formatFixed(double v, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", digits, v);
  return buf;
}

std::string joined(const std::vector<std::string>& items) {
  std::string out;
  for (const auto& s : items) out += (out.empty() ? "" : ", ") + s;
  return out;
}

std::string tokenRate(double samples_per_s, int64_t tokens_per_sample) {
  if (tokens_per_sample <= 0) return "";
  const double rate = samples_per_s * static_cast<double>(tokens_per_sample);
  return strCat(" (", std::isfinite(rate) ? static_cast<int64_t>(std::llround(rate)) : 0,
                " tokens/s)");
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

bool procFdIsTerminal(long pid, int fd) {
  std::error_code ec;
  const auto target = std::filesystem::read_symlink(strCat("/proc/", pid, "/fd/", fd), ec);
  if (ec) return false;
  const std::string t = target.string();
  return t.rfind("/dev/pts/", 0) == 0 || t.rfind("/dev/tty", 0) == 0 || t == "/dev/console";
}

namespace {

/// The name of process `pid` (/proc/PID/comm), "" when unreadable.
std::string processName(long pid) {
  std::ifstream in(strCat("/proc/", pid, "/comm"));
  std::string name;
  std::getline(in, name);
  return name;
}

bool isOpenMpiLauncher(const std::string& name) {
  for (const char* n : {"mpirun", "mpiexec", "orterun", "prterun", "orted", "prted"}) {
    if (name == n) return true;
  }
  return false;
}

}  // namespace

ProgressStyle progressForStdout() {
  if (isatty(STDOUT_FILENO) == 0) return ProgressStyle::kLines;
  const long parent = static_cast<long>(getppid());
  if (isOpenMpiLauncher(processName(parent))) {
    return procFdIsTerminal(parent, STDOUT_FILENO) ? ProgressStyle::kBar : ProgressStyle::kLines;
  }
  return ProgressStyle::kBar;
}

void Console::line(const std::string& s) {
  if (!enabled_) return;
  if (pending_) std::cout << "\r\033[K";
  pending_ = false;
  std::cout << s << std::endl;
}

void Console::status(const std::string& s, bool interval_end) {
  if (!enabled_) return;
  const double t = monotonicSeconds();
  switch (mode_) {
    case ProgressStyle::kBar:
      if (t - last_ < 0.2) return;  // a terminal needs no more than 5 updates a second
      std::cout << "\r\033[K" << s << std::flush;
      pending_ = true;
      last_ = t;
      return;
    case ProgressStyle::kLines:
      if (!interval_end || t - last_ < kLinesEverySeconds) return;
      std::cout << s << std::endl;
      last_ = t;
      return;
    case ProgressStyle::kOff:
      return;
  }
}

}  // namespace batchdist::worker
