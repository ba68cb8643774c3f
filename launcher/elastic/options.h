#pragma once
// What `batchdist elastic` is asked on its command line (launcher/cli.cc).

#include <string>

namespace batchdist::launcher {

struct ElasticOptions {
  std::string hosts_file;     ///< --hosts FILE: "HOST [slots=N]" per line, re-read while running
  std::string hosts_command;  ///< --hosts-command CMD: prints the same, run at each look
  int min_ranks = 1;          ///< --min-ranks: below it the job waits (elastic.wait_s), then gives up
  int max_ranks = 0;          ///< --max-ranks: 0 = no cap
  int slots_per_host = 1;     ///< --slots-per-host: ranks on a host whose line has no slots=
  int max_restarts = 10;      ///< --max-restarts: relaunches after failures (growth not counted)
  std::string mpirun = "mpirun";  ///< --mpirun PATH
  std::string mpirun_args;    ///< --mpirun-args "...": added to every mpirun (split at spaces)
};

}  // namespace batchdist::launcher
