#include "launcher/job.h"

#include <unistd.h>

#include <atomic>
#include <csignal>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <iostream>
#include <sstream>

#include "common/error.h"
#include "worker/common/heartbeat.h"
#include "worker/common/util.h"

namespace batchdist::launcher {
namespace {

std::atomic<int> g_stop_signal{0};

extern "C" void onStopSignal(int sig) { g_stop_signal.store(sig); }

}  // namespace

void installStopHandlers() {
  struct sigaction sa {};
  sa.sa_handler = onStopSignal;
  sa.sa_flags = SA_RESETHAND | SA_RESTART;
  sigemptyset(&sa.sa_mask);
  for (int sig : {SIGTERM, SIGUSR1, SIGINT}) sigaction(sig, &sa, nullptr);
}

int stopSignal() { return g_stop_signal.load(); }

[[noreturn]] void abortJob(MpiScope& mpi, int code) {
  if (g_stop_signal.load() != 0 && mpi.size() > 1) {
    std::cout.flush();
    std::cerr.flush();
    std::_Exit(code);
  }
  mpi.abort(code);
}

double secondsSinceProcessStart() {
  std::ifstream stat("/proc/self/stat");
  std::string line;
  if (!std::getline(stat, line)) return -1;
  const auto paren = line.rfind(')');  // the command name may hold spaces
  if (paren == std::string::npos) return -1;
  std::istringstream in(line.substr(paren + 1));
  std::string field;
  for (int i = 3; i <= 21; ++i) in >> field;  // state .. itrealvalue
  unsigned long long start_ticks = 0;
  if (!(in >> start_ticks)) return -1;
  timespec now{};
  clock_gettime(CLOCK_BOOTTIME, &now);
  return now.tv_sec + now.tv_nsec * 1e-9 - start_ticks / static_cast<double>(sysconf(_SC_CLK_TCK));
}

worker::RankPlace placeOf(MpiScope& mpi) {
  worker::RankPlace place;
  place.rank = mpi.rank();
  place.size = mpi.size();
  place.local_rank = mpi.localRank();
  place.local_size = mpi.localSize();
  place.host_count = mpi.hostCount();
  place.host = mpi.host();
  place.from_rank0 = [&mpi](const std::function<std::string()>& fn) { return mpi.fromRank0(fn); };
  return place;
}

int prepare(const worker::RunRequest& req, const worker::RankPlace& place, MpiScope& mpi,
            worker::RunSetup& setup) {
  const int code = mpi.agree([&] { setup = worker::prepareRun(req, place); });
  if (code != 0) return code;
  return mpi.agree([&] { worker::prepareData(req, place, setup); });
}

int runTrainJob(worker::RunRequest req, MpiScope& mpi) {
  // From the start, so that a signal during set-up or the batch search is not
  // fatal: the search stops after the current candidate, training after the
  // current step (rank 0 still writes the report and the model).
  installStopHandlers();
  req.stop_signal = [] { return g_stop_signal.load(); };
  const worker::RankPlace place = placeOf(mpi);
  try {
    worker::heartbeat::startFromEnvironment(place.rank);  // Note [heartbeat]: elastic runs only
  } catch (const Error& e) {  // the same environment on every rank: every rank says it
    std::cerr << strCat(mpi.tag(), " error: ", e.what(), "\n") << std::flush;
    return e.exitCode();
  }
  worker::RunSetup setup;
  const double setup_started = secondsSinceProcessStart();
  if (const int code = prepare(req, place, mpi, setup); code != 0) return code;
  req.setup_s = secondsSinceProcessStart() - setup_started;
  try {
    const int code = worker::executeRun(req, place, setup);
    worker::heartbeat::setPhase("done");
    worker::heartbeat::stop();
    return code;
  } catch (const Error& e) {
    // One write per message: the ranks' lines do not interleave under mpirun.
    std::cerr << strCat(mpi.tag(), " error: ", e.what(), "\n") << std::flush;
    abortJob(mpi, e.exitCode());
  } catch (const std::exception& e) {
    std::string what = e.what();
    std::cerr << strCat(mpi.tag(), " error: ", what.substr(0, what.find("\nException raised from")),
                        "\n")
              << std::flush;
    abortJob(mpi, 1);
  }
}

worker::RunRequest runRequest(const std::string& config, const std::vector<std::string>& sets,
                              const RunOptions& options) {
  worker::RunRequest req;
  req.config_path = config;
  req.sets = sets;
  req.output = options.output;
  req.report = options.report;
  req.quiet = options.quiet;
  req.research = options.research;
  req.resume = options.resume;
  req.search_only = options.search_only;
  return req;
}

}  // namespace batchdist::launcher
