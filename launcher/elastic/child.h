#pragma once
// A child process in a process group (and session) of its own, its stdout and
// stderr merged into a pipe the supervisor reads line by line: mpirun for an
// attempt, or a host probe. Ending the group ends mpirun and whatever it
// started on this host.

#include <atomic>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace batchdist::launcher::elastic {

class Child {
 public:
  /// Starts `argv` with `env` ("NAME=value") added to this process's environment.
  /// Each output line goes to `on_line`, from a reader thread that may outlive
  /// the Child (a process left behind holds the pipe): it must own what it uses.
  /// Throws Error if it cannot start.
  Child(const std::vector<std::string>& argv, const std::vector<std::string>& env,
        std::function<void(const std::string&)> on_line);
  ~Child();  ///< kills the group if still running, then reaps it
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;

  int pid() const { return pid_; }
  /// The wait status once it has exited (waitpid WNOHANG), else nullopt.
  std::optional<int> poll();
  /// Sends `sig` to the child alone (mpirun forwards SIGUSR1 to the ranks).
  void signal(int sig) const;
  /// SIGTERM to the group, then SIGKILL after `grace_s`; reaps the child. Returns its status.
  int end(double grace_s);

 private:
  void finishReader();

  int pid_ = -1;
  int out_fd_ = -1;
  std::shared_ptr<std::atomic<bool>> done_ = std::make_shared<std::atomic<bool>>(false);
  std::optional<int> status_;
  std::thread reader_;
};

/// "exited with status 3", "killed by signal 9 (Killed)".
std::string describeStatus(int status);

}  // namespace batchdist::launcher::elastic
