#pragma once
// MPI lifetime as an RAII scope, and what the launcher learns from MPI.

#include <mpi.h>

#include <functional>
#include <string>
#include <vector>

namespace batchdist::launcher {

class MpiScope {
 public:
  /// MPI_Init_thread (FUNNELED); works under mpirun/srun and alone (singleton).
  MpiScope(int* argc, char*** argv);
  ~MpiScope();
  MpiScope(const MpiScope&) = delete;
  MpiScope& operator=(const MpiScope&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  int localRank() const { return local_rank_; }
  int localSize() const { return local_size_; }
  int hostCount() const { return host_count_; }
  const std::string& host() const { return host_; }
  /// "[rank R/N host H]", the prefix of every per-rank message.
  std::string tag() const;

  /// Note [same command]: ranks that run different verbs (`mpirun -np 1 batchdist
  /// train A : -np 1 batchdist search A`) or different batchdist versions would
  /// call different collectives with different sizes from the first set-up step
  /// on (MPI_ERR_TRUNCATE, then a corrupted heap). Catching that error is no cure:
  /// in Open MPI 4.1 a non-blocking collective that fails inside libnbc leaves
  /// its other internal requests writing into freed memory, and MPI_Test on it
  /// can itself crash (seen with dist.backend: mpi; open-mpi/ompi#2245). So the
  /// mismatch must never reach one: the first collective after MPI_Init, of a
  /// fixed size whatever the command, compares every rank's `verb` and
  /// `version` (each cut to kCommandField - 1 bytes) with rank 0's.
  /// Returns "" when all agree; else, on every rank, the same message naming the
  /// lowest rank that differs, both commands, and what to do. Collective.
  std::string commandMismatch(const std::string& verb, const std::string& version);
  static constexpr int kCommandField = 32;

  /// Runs `fn`, which must not use collectives, on every rank, and agrees on the
  /// outcome: if it threw on any rank, the lowest such rank prints its error and
  /// every rank returns that exit code (no abort needed: all ranks stop together).
  template <typename F>
  int agree(F&& fn);

  /// Rank 0 runs `fn` and every rank returns its result (MPI_Bcast): what one rank
  /// should read from a shared file system (a folder's listing, a tar index). An
  /// Error on rank 0 is thrown on every rank, with its exit code. Collective.
  /// Like every collective here, a failing MPI call throws CollectiveError (Note
  /// [mpi errors]).
  std::string fromRank0(const std::function<std::string()>& fn);

  /// Every rank's `mine`, in rank order, on rank 0 (empty elsewhere). Collective.
  std::vector<std::string> gatherToRank0(const std::string& mine);

  /// Ends every rank of the job with `code` (MPI_Abort when there are several).
  [[noreturn]] void abort(int code);

 private:
  int agreeOnError(int code, const std::string& message);

  int rank_ = 0;
  int size_ = 1;
  int local_rank_ = 0;
  int local_size_ = 1;
  int host_count_ = 1;
  std::string host_;
};

}  // namespace batchdist::launcher

#include "common/error.h"
#include <exception>

namespace batchdist::launcher {
template <typename F>
int MpiScope::agree(F&& fn) {
  int code = 0;
  std::string message;
  try {
    fn();
  } catch (const Error& e) {
    code = e.exitCode();
    message = e.what();
  } catch (const std::exception& e) {
    code = 1;
    message = e.what();
  }
  return agreeOnError(code, message);
}
}  // namespace batchdist::launcher
