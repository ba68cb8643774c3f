#include "launcher/elastic/child.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>

#include "common/error.h"

extern char** environ;

namespace batchdist::launcher::elastic {

Child::Child(const std::vector<std::string>& argv, const std::vector<std::string>& env,
             std::function<void(const std::string&)> on_line) {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) throw Error(strCat("cannot create a pipe: ", std::strerror(errno)));
  // Everything the child needs is made before fork(): only async-signal-safe calls after it.
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  // `env` replaces what this process has under the same names.
  std::vector<char*> envp;
  for (auto it = env.rbegin(); it != env.rend(); ++it) envp.push_back(const_cast<char*>(it->c_str()));
  for (char** e = environ; *e != nullptr; ++e) {
    bool overridden = false;
    for (const auto& x : env) {
      const auto eq = x.find('=');
      overridden = overridden || std::strncmp(*e, x.c_str(), eq + 1) == 0;
    }
    if (!overridden) envp.push_back(*e);
  }
  envp.push_back(nullptr);
  const pid_t pid = fork();
  if (pid < 0) throw Error(strCat("cannot fork: ", std::strerror(errno)));
  if (pid == 0) {
    setsid();
    dup2(fds[1], STDOUT_FILENO);
    dup2(fds[1], STDERR_FILENO);
    const int devnull = open("/dev/null", O_RDONLY);
    if (devnull >= 0) dup2(devnull, STDIN_FILENO);
    execvpe(args[0], args.data(), envp.data());
    const char msg[] = "batchdist elastic: cannot run ";
    (void)!write(STDERR_FILENO, msg, sizeof msg - 1);
    (void)!write(STDERR_FILENO, args[0], std::strlen(args[0]));
    (void)!write(STDERR_FILENO, "\n", 1);
    _exit(127);
  }
  close(fds[1]);
  pid_ = pid;
  out_fd_ = fds[0];
  reader_ = std::thread([fd = out_fd_, done = done_, on_line = std::move(on_line)] {
    std::string pending;
    char buf[4096];
    for (;;) {
      const ssize_t n = read(fd, buf, sizeof buf);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      pending.append(buf, static_cast<size_t>(n));
      for (size_t nl; (nl = pending.find('\n')) != std::string::npos;) {
        on_line(pending.substr(0, nl));
        pending.erase(0, nl + 1);
      }
    }
    if (!pending.empty()) on_line(pending);
    close(fd);
    *done = true;
  });
}

Child::~Child() {
  if (pid_ > 0 && !status_) end(0);
  if (reader_.joinable()) reader_.detach();
}

std::optional<int> Child::poll() {
  if (status_) return status_;
  int st = 0;
  const pid_t r = waitpid(pid_, &st, WNOHANG);
  if (r == pid_) {
    status_ = st;
    finishReader();
  }
  return status_;
}

void Child::signal(int sig) const {
  if (pid_ > 0 && !status_) kill(pid_, sig);
}

int Child::end(double grace_s) {
  if (status_) return *status_;
  kill(-pid_, SIGTERM);
  kill(pid_, SIGCONT);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(grace_s);
  while (!poll() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  if (!status_) {
    kill(-pid_, SIGKILL);
    int st = 0;
    waitpid(pid_, &st, 0);
    status_ = st;
    finishReader();
  }
  // What mpirun started on this host and left behind in its group goes too.
  kill(-pid_, SIGKILL);
  return *status_;
}

void Child::finishReader() {
  // The rest of the output; a process mpirun left behind may hold the pipe open:
  // then the reader is left to finish on its own (its callback owns what it uses).
  for (int i = 0; i < 100 && !*done_; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  if (!reader_.joinable()) return;
  if (*done_) {
    reader_.join();
  } else {
    reader_.detach();
  }
}

std::string describeStatus(int status) {
  if (WIFEXITED(status)) return strCat("exited with status ", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    return strCat("killed by signal ", WTERMSIG(status), " (", strsignal(WTERMSIG(status)), ")");
  }
  return "ended";
}

}  // namespace batchdist::launcher::elastic
