#pragma once
// CPU time of this process and of the host (Note [system metrics]).

#include <optional>
#include <string>

namespace batchdist::worker {

/// The host's CPU time over all its cores, in clock ticks since boot.
struct HostCpuTimes {
  double busy = 0;   ///< all but idle and iowait
  double total = 0;
};

/// The first line of /proc/stat ("cpu  user nice system idle iowait irq softirq
/// steal ..."); nullopt when it is not one.
std::optional<HostCpuTimes> parseProcStat(const std::string& text);

/// /proc/stat now; nullopt when it cannot be read.
std::optional<HostCpuTimes> hostCpuTimes();

/// This process's CPU seconds (all threads, user and system).
double processCpuSeconds();

}  // namespace batchdist::worker
