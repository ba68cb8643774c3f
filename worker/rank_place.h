#pragma once
// Where this rank sits in the job: what the launcher learns from MPI, and what a
// run (worker/run.h) and the process-group join (worker/join.h) take.

#include <functional>
#include <string>

namespace batchdist::worker {

/// Where this rank sits in the job (the launcher learns it from MPI).
struct RankPlace {
  int rank = 0;
  int size = 1;
  int local_rank = 0;
  int local_size = 1;
  int host_count = 1;
  std::string host;
  /// Rank 0 runs the function and every rank gets its result; an error on rank 0
  /// is thrown on every rank (DataContext::from_rank0). Empty: run it here.
  std::function<std::string(const std::function<std::string()>&)> from_rank0;
  /// "[rank R/N host H]", the prefix of every per-rank message.
  std::string tag() const {
    return "[rank " + std::to_string(rank) + "/" + std::to_string(size) + " host " + host + "]";
  }
};

}  // namespace batchdist::worker
