#include "worker/train/observe/host_cpu.h"

#include <time.h>

#include <fstream>
#include <sstream>
#include <vector>

namespace batchdist::worker {

std::optional<HostCpuTimes> parseProcStat(const std::string& text) {
  std::istringstream in(text.substr(0, text.find('\n')));
  std::string label;
  if (!(in >> label) || label != "cpu") return std::nullopt;
  std::vector<double> ticks;
  for (double v = 0; in >> v;) ticks.push_back(v);
  if (ticks.size() < 4) return std::nullopt;  // user nice system idle, at least
  HostCpuTimes t;
  // guest and guest_nice (fields 9 and 10) are already in user and nice.
  for (std::size_t i = 0; i < std::min<std::size_t>(ticks.size(), 8); ++i) t.total += ticks[i];
  const double idle = ticks[3] + (ticks.size() > 4 ? ticks[4] : 0);
  t.busy = t.total - idle;
  return t;
}

std::optional<HostCpuTimes> hostCpuTimes() {
  std::ifstream f("/proc/stat");
  std::string line;
  if (!f || !std::getline(f, line)) return std::nullopt;
  return parseProcStat(line);
}

double processCpuSeconds() {
  timespec ts{};
  if (clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts) != 0) return -1;
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

}  // namespace batchdist::worker
