#include "launcher/elastic/probe.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>

#include "common/error.h"

namespace batchdist::launcher::elastic {

Probe::Probe(const std::string& host, const std::vector<std::string>& mpirun, double timeout_s,
             double now)
    : host_(host), deadline_(now + timeout_s) {
  auto argv = mpirun;
  for (const char* a : {"-np", "1", "--host"}) argv.emplace_back(a);
  argv.push_back(host + ":1");
  argv.emplace_back("true");
  auto last = last_line_;
  auto mu = std::make_shared<std::mutex>();
  child_ = std::make_unique<Child>(argv, std::vector<std::string>{}, [last, mu](const std::string& l) {
    std::lock_guard lock(*mu);
    // The first line that says something: the launch agent's (ssh's) own error
    // comes before Open MPI's help text.
    if (last->empty() && l.find_first_not_of("- ") != std::string::npos) *last = l;
  });
}

std::optional<bool> Probe::result(double now) {
  if (!child_) return why_.empty();
  if (const auto st = child_->poll()) {
    const bool ok = WIFEXITED(*st) && WEXITSTATUS(*st) == 0;
    if (!ok) why_ = strCat("could not start a process there (mpirun ", describeStatus(*st), ": ", *last_line_, ")");
    child_.reset();
    return ok;
  }
  if (now < deadline_) return std::nullopt;
  child_->end(1.0);
  child_.reset();
  why_ = "did not answer within elastic.probe_timeout_s";
  return false;
}

namespace {

/// Why `path` cannot be executed ("" when it can).
std::string notExecutable(const std::string& path) {
  struct stat st {};
  if (stat(path.c_str(), &st) != 0) return std::strerror(errno);
  if (S_ISDIR(st.st_mode)) return "is a directory";
  if (!S_ISREG(st.st_mode)) return "is not a regular file";
  if (access(path.c_str(), X_OK) != 0) return strCat("is not executable (", std::strerror(errno), ")");
  return "";
}

/// Throws ConfigError unless `mpirun` names an executable file, as execvp finds it.
void checkFound(const std::string& mpirun) {
  const std::string what = strCat("--mpirun ", mpirun, ": ");
  const std::string fix = "; give the path of Open MPI's mpirun (or put it on PATH)";
  if (mpirun.empty()) throw ConfigError("--mpirun: empty" + fix);
  if (mpirun.find('/') != std::string::npos) {
    if (const auto why = notExecutable(mpirun); !why.empty()) throw ConfigError(what + why + fix);
    return;
  }
  const char* env = std::getenv("PATH");
  std::string path = env ? env : "/usr/bin:/bin";
  for (std::size_t at = 0;;) {
    const auto colon = path.find(':', at);
    const std::string dir = path.substr(at, colon == std::string::npos ? colon : colon - at);
    if (notExecutable((dir.empty() ? "." : dir) + "/" + mpirun).empty()) return;
    if (colon == std::string::npos) break;
    at = colon + 1;
  }
  throw ConfigError(strCat(what, "not found on PATH (", path, ")", fix));
}

}  // namespace

void checkMpirun(const std::string& mpirun, double timeout_s) {
  checkFound(mpirun);
  auto first = std::make_shared<std::string>();
  auto mu = std::make_shared<std::mutex>();
  Child child({mpirun, "--version"}, {}, [first, mu](const std::string& l) {
    std::lock_guard lock(*mu);
    if (first->empty() && l.find_first_not_of("- ") != std::string::npos) *first = l;
  });
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  while (!child.poll() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  const auto status = child.poll();
  if (status && WIFEXITED(*status) && WEXITSTATUS(*status) == 0) return;
  const int st = status ? *status : child.end(1.0);
  std::lock_guard lock(*mu);
  throw ConfigError(strCat("--mpirun ", mpirun, ": '", mpirun, " --version' ",
                           status ? describeStatus(st) : strCat("did not answer within ", timeout_s, " s"),
                           first->empty() ? "" : ": " + *first,
                           "; it cannot start a job here: give the path of Open MPI's mpirun"));
}

namespace {

std::string interfaceAddress(const std::string& name) {
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) throw Error("cannot list the network interfaces");
  std::string found;
  for (ifaddrs* a = list; a != nullptr; a = a->ifa_next) {
    if (a->ifa_addr == nullptr || a->ifa_addr->sa_family != AF_INET || name != a->ifa_name) continue;
    char buf[INET_ADDRSTRLEN] = {};
    inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(a->ifa_addr)->sin_addr, buf, sizeof buf);
    found = buf;
    break;
  }
  freeifaddrs(list);
  if (found.empty()) throw ConfigError(strCat("dist.interface: no IPv4 address on '", name, "' here"));
  return found;
}

std::string routedAddress(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* res = nullptr;
  if (getaddrinfo(host.c_str(), "9", &hints, &res) != 0 || res == nullptr) {
    throw Error(strCat("cannot resolve host '", host, "' (IPv4)"));
  }
  const int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  sockaddr_in local{};
  socklen_t len = sizeof local;
  const bool ok = fd >= 0 && connect(fd, res->ai_addr, res->ai_addrlen) == 0 &&
                  getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0;
  freeaddrinfo(res);
  if (fd >= 0) close(fd);
  if (!ok) throw Error(strCat("no route to host '", host, "': ", std::strerror(errno)));
  char buf[INET_ADDRSTRLEN] = {};
  inet_ntop(AF_INET, &local.sin_addr, buf, sizeof buf);
  return buf;
}

}  // namespace

std::string heartbeatAddress(const std::string& interface, const std::vector<std::string>& hosts) {
  if (!interface.empty()) return interfaceAddress(interface);
  if (hosts.empty()) return "127.0.0.1";
  return routedAddress(hosts.front());
}

}  // namespace batchdist::launcher::elastic
