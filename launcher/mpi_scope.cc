#include "launcher/mpi_scope.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <iostream>

#include "collective/mpi_comm.h"

namespace batchdist::launcher {

MpiScope::MpiScope(int* argc, char*** argv) {
  collective::preferRingAllreduce();  // Note [mpi backend]
  int provided = 0;
  MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
  MPI_Comm_size(MPI_COMM_WORLD, &size_);
  // Ranks that share memory share a host: local rank picks the GPU.
  MPI_Comm local;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &local);
  MPI_Comm_rank(local, &local_rank_);
  MPI_Comm_size(local, &local_size_);
  MPI_Comm_free(&local);
  int leader = local_rank_ == 0 ? 1 : 0;
  MPI_Allreduce(MPI_IN_PLACE, &leader, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  host_count_ = leader;
  char name[256] = {};
  gethostname(name, sizeof name - 1);
  host_ = name;
}

MpiScope::~MpiScope() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

std::string MpiScope::tag() const {
  return "[rank " + std::to_string(rank_) + "/" + std::to_string(size_) + " host " + host_ + "]";
}

int MpiScope::agreeOnError(int code, const std::string& message) {
  // Lowest failing rank reports; everyone learns the code.
  int mine[2] = {code != 0 ? rank_ : size_, code};
  int first = 0;
  MPI_Allreduce(&mine[0], &first, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  if (first == size_) return 0;
  int worst = 0;
  MPI_Allreduce(&mine[1], &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (rank_ == first) {
    std::cerr << tag() + " error: " + message + "\n" << std::flush;
  }
  return worst;
}

void MpiScope::abort(int code) {
  std::cout.flush();
  std::cerr.flush();
  if (size_ > 1) MPI_Abort(MPI_COMM_WORLD, code);
  MPI_Finalize();
  std::_Exit(code);
}

}  // namespace batchdist::launcher
