// Note [heartbeat]: a UDP sender thread.
#include "worker/common/heartbeat.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <mutex>
#include <thread>

#include "collective/communicator.h"
#include "common/error.h"

namespace batchdist::worker::heartbeat {
namespace {

struct State {
  std::atomic<const char*> phase{"setup"};
  std::atomic<int64_t> step{0};
  std::atomic<int64_t> checkpoint{-1};
  std::atomic<int64_t> per_gpu{0}, accum{0}, global{0};
  std::mutex mu;
  std::condition_variable cv;
  bool stopping = false;
  bool poke = false;  ///< beat now: the phase or the checkpoint changed
  std::thread thread;
  int fd = -1;
  sockaddr_in to{};
  int attempt = 0, rank = 0;
  double interval_s = 1;
};

// Never destroyed: a rank that exits without stop() (abortJob, exit()) must not
// meet a joinable std::thread in a static destructor.
State& state() {
  static State* s = new State;
  return *s;
}

void beat(State& s) {
  const std::string text = message(s.attempt, s.rank, static_cast<int>(getpid()), s.phase.load(),
                                   s.step.load(), s.checkpoint.load(), s.per_gpu.load(),
                                   s.accum.load(), s.global.load(),
                                   collective::collectivesStarted());
  // A datagram that cannot leave (no route while a link is down) is simply lost:
  // the supervisor's timeout is what notices.
  (void)sendto(s.fd, text.data(), text.size(), MSG_DONTWAIT, reinterpret_cast<sockaddr*>(&s.to),
               sizeof s.to);
}

void loop(State& s) {
  std::unique_lock lock(s.mu);
  while (!s.stopping) {
    lock.unlock();
    beat(s);
    lock.lock();
    s.cv.wait_for(lock, std::chrono::duration<double>(s.interval_s), [&] { return s.stopping || s.poke; });
    s.poke = false;
  }
}

double envSeconds(const char* name, double fallback) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return fallback;
  char* end = nullptr;
  const double x = std::strtod(v, &end);
  if (*end != '\0' || !(x >= 0.01 && x <= 3600)) {
    throw ConfigError(strCat(name, "=", v, ": expected seconds between 0.01 and 3600"));
  }
  return x;
}

}  // namespace

std::string message(int attempt, int rank, int pid, const char* phase, int64_t step,
                    int64_t checkpoint, int64_t per_gpu, int64_t accum, int64_t global,
                    uint64_t collectives) {
  return strCat("batchdist-heartbeat 1 attempt=", attempt, " rank=", rank, " pid=", pid,
                " phase=", phase, " step=", step, " checkpoint=", checkpoint, " per_gpu=", per_gpu,
                " accum=", accum, " global=", global, " collectives=", collectives);
}

void startFromEnvironment(int rank) {
  const char* target = std::getenv("BATCHDIST_HEARTBEAT");
  if (target == nullptr || *target == '\0') return;
  State& s = state();
  if (s.thread.joinable()) return;
  const std::string t = target;
  const auto colon = t.rfind(':');
  sockaddr_in to{};
  to.sin_family = AF_INET;
  const int port = colon == std::string::npos ? 0 : std::atoi(t.c_str() + colon + 1);
  if (colon == std::string::npos || port <= 0 || port > 65535 ||
      inet_pton(AF_INET, t.substr(0, colon).c_str(), &to.sin_addr) != 1) {
    throw ConfigError(strCat("BATCHDIST_HEARTBEAT=", t, ": expected IPv4:PORT (set by batchdist elastic)"));
  }
  to.sin_port = htons(static_cast<uint16_t>(port));
  const char* attempt = std::getenv("BATCHDIST_ATTEMPT");
  s.attempt = attempt ? std::atoi(attempt) : 0;
  s.rank = rank;
  s.to = to;
  s.interval_s = envSeconds("BATCHDIST_HEARTBEAT_S", 1.0);
  s.fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (s.fd < 0) throw Error(strCat("heartbeat: cannot open a UDP socket (errno ", errno, ")"));
  s.stopping = false;
  s.thread = std::thread([&s] { loop(s); });
}

void stop() {
  State& s = state();
  if (!s.thread.joinable()) return;
  {
    std::lock_guard lock(s.mu);
    s.stopping = true;
  }
  s.cv.notify_all();
  s.thread.join();
  beat(s);  // the last word: the phase and step it ended at
  close(s.fd);
  s.fd = -1;
}

namespace {
void poke(State& s) {
  {
    std::lock_guard lock(s.mu);
    s.poke = true;
  }
  s.cv.notify_all();
}
}  // namespace

void setPhase(const char* phase) {
  state().phase = phase;
  poke(state());
}
void setStep(int64_t step) { state().step = step; }
void setCheckpoint(int64_t step) {
  state().checkpoint = step;
  poke(state());
}
void setBatch(int64_t per_gpu, int64_t accum, int64_t global) {
  State& s = state();
  s.per_gpu = per_gpu;
  s.accum = accum;
  s.global = global;
}

}  // namespace batchdist::worker::heartbeat
