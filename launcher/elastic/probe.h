#pragma once
// Which hosts answer: each host is asked to start a process through the same
// launch path the job takes (mpirun -np 1 --host H true: the launch agent, the
// daemon, its connection back), so a host that answers is one a relaunch can
// use. And the address the ranks send their heartbeats to.

#include <memory>
#include <string>
#include <vector>

#include "launcher/elastic/child.h"

namespace batchdist::launcher::elastic {

/// One host's probe in flight.
class Probe {
 public:
  Probe(const std::string& host, const std::vector<std::string>& mpirun, double timeout_s, double now);
  const std::string& host() const { return host_; }
  /// nullopt while undecided; true once it answered, false once it failed or timed out.
  std::optional<bool> result(double now);
  /// Why it failed (its output's first line, or the timeout).
  const std::string& why() const { return why_; }

 private:
  std::string host_;
  double deadline_;
  std::shared_ptr<std::string> last_line_ = std::make_shared<std::string>();
  std::unique_ptr<Child> child_;
  std::string why_;
};

/// Note [launcher checked first]: a launcher that can never start a process is
/// bad input, said at once (exit 2): before, every host's probe failed and the
/// supervisor waited elastic.wait_s for hosts that were never lost. Throws
/// ConfigError naming --mpirun unless `mpirun` is found (on PATH when it has no
/// '/'), is an executable regular file, and `mpirun --version` exits 0 within
/// `timeout_s`.
void checkMpirun(const std::string& mpirun, double timeout_s);

/// The IPv4 address of this host the ranks on `hosts` reach: that of
/// `interface` when given, else the one the kernel routes to the first host
/// from (127.0.0.1 for this host itself). Throws Error when neither works.
std::string heartbeatAddress(const std::string& interface, const std::vector<std::string>& hosts);

}  // namespace batchdist::launcher::elastic
