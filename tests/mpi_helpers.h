#pragma once
// Helpers for tests that run under mpirun: sub-groups of ranks with their own
// c10d process group, built exactly as the launcher builds its own.

#include <mpi.h>

#include <chrono>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>

#include "collective/mpi_comm.h"
#include "collective/process_group.h"
#include "collective/rendezvous.h"
#include "collective/torch_compat.h"
#include "scratch_dir.h"

namespace batchdist::mpitest {

inline int worldRank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}
inline int worldSize() {
  int s = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &s);
  return s;
}

/// One scratch directory for every rank of this job: rank 0 makes it
/// (testsupport::scratchDir: no other job has it, as mpi_tests_np2/3/4 run at
/// once, Note [scratch dirs]; removed when rank 0 exits) and sends its path to
/// the others. Collective over MPI_COMM_WORLD.
inline std::filesystem::path sharedScratchDir(const std::string& prefix) {
  std::string path;
  if (worldRank() == 0) path = testsupport::scratchDir(prefix).string();
  int size = static_cast<int>(path.size());
  MPI_Bcast(&size, 1, MPI_INT, 0, MPI_COMM_WORLD);
  path.resize(static_cast<std::size_t>(size));
  MPI_Bcast(path.data(), size, MPI_CHAR, 0, MPI_COMM_WORLD);
  return path;
}

/// Runs fn(comm) on ranks 0..group-1 of MPI_COMM_WORLD, which form their own
/// process group over `backend` (gloo or mpi); the other ranks skip it.
/// Collective over MPI_COMM_WORLD.
/// `timeout`: every collective's (dist.timeout_s in a real run).
inline void inGroup(int group, const std::function<void(collective::Communicator&)>& fn,
                    const std::string& backend = "gloo",
                    std::chrono::milliseconds timeout = std::chrono::seconds(60)) {
  const int rank = worldRank();
  MPI_Comm sub;
  MPI_Comm_split(MPI_COMM_WORLD, rank < group ? 0 : MPI_UNDEFINED, rank, &sub);
  if (sub != MPI_COMM_NULL) {
    collective::RendezvousOptions ro;
    ro.timeout = timeout;
    const auto rv = collective::rendezvousOverMpi(sub, ro);
    collective::BackendOptions bo;
    bo.backend = "gloo";
    bo.address = rv.address;
    bo.timeout = ro.timeout;
    int sub_rank = 0;
    MPI_Comm_rank(sub, &sub_rank);
    auto comm = backend == "mpi"
                    ? collective::createMpiCommunicator(rv.store, at::kCPU, ro.timeout, sub)
                    : collective::createCommunicator(rv.store, sub_rank, group, bo);
    fn(*comm);
    comm->barrier();
    MPI_Comm_free(&sub);
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

}  // namespace batchdist::mpitest
