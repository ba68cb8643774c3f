// main() for the multi-rank GoogleTest binary, started by mpirun with N ranks.
// Every rank runs every test; only rank 0 prints, and a failure on any rank
// fails the run (the exit code is agreed over MPI).
#include <gtest/gtest.h>
#include <mpi.h>

#include "collective/mpi_comm.h"
#include "common/stdlib_guard.h"

int main(int argc, char** argv) {
  batchdist::ensureSystemStdlib();  // Note [libstdc++ first]
  batchdist::collective::preferRingAllreduce();  // as batchdist does (Note [mpi backend])
  MPI_Init(&argc, &argv);
  ::testing::InitGoogleTest(&argc, argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
  }
  int failed = RUN_ALL_TESTS() != 0 ? 1 : 0;
  int any = 0;
  MPI_Allreduce(&failed, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (failed) fprintf(stderr, "rank %d: tests failed\n", rank);
  MPI_Finalize();
  return any;
}
