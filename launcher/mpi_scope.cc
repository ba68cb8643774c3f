#include "launcher/mpi_scope.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <iostream>

#include "collective/mpi_comm.h"
#include "common/host.h"

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
  host_ = hostName();
  // Note [mpi errors]: from here on an MPI call that fails on MPI_COMM_WORLD
  // returns its error (checkMpi turns it into a CollectiveError, which main()
  // reports with this rank's tag) instead of Open MPI's default: print and abort
  // every rank. The calls above are the same in every batchdist version and verb.
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
}

MpiScope::~MpiScope() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

std::string MpiScope::tag() const {
  return "[rank " + std::to_string(rank_) + "/" + std::to_string(size_) + " host " + host_ + "]";
}

std::string MpiScope::commandMismatch(const std::string& verb, const std::string& version) {
  // One fixed-size record per rank: verb and version, each NUL-padded.
  std::vector<char> mine(2 * kCommandField, '\0');
  verb.copy(mine.data(), kCommandField - 1);
  version.copy(mine.data() + kCommandField, kCommandField - 1);
  std::vector<char> all(static_cast<std::size_t>(size_) * mine.size());
  collective::checkMpi(MPI_Allgather(mine.data(), static_cast<int>(mine.size()), MPI_CHAR,
                                     all.data(), static_cast<int>(mine.size()), MPI_CHAR,
                                     MPI_COMM_WORLD),
                       "MPI_Allgather of every rank's verb and version");
  const auto field = [&](int rank, int i) {
    return std::string(all.data() + static_cast<std::size_t>(rank) * mine.size() + i * kCommandField);
  };
  const auto command = [&](int rank) {
    return strCat("`batchdist ", field(rank, 0), "` of batchdist ", field(rank, 1));
  };
  int first = -1;
  int others = 0;
  for (int r = 1; r < size_; ++r) {
    if (field(r, 0) == field(0, 0) && field(r, 1) == field(0, 1)) continue;
    if (first < 0) first = r;
    else ++others;
  }
  if (first < 0) return "";
  return strCat("the ranks of this job run different commands: rank ", first, " runs ",
                command(first), ", rank 0 runs ", command(0),
                others > 0 ? strCat(" (", others, " more rank(s) differ from rank 0)") : "",
                ". Every rank must run the same verb of the same batchdist version: start them "
                "all as `batchdist ", field(0, 0), "` with one binary (the parts of an MPMD "
                "`mpirun ... : ...` may differ in their --set options, not in verb or binary)");
}

int MpiScope::agreeOnError(int code, const std::string& message) {
  // Lowest failing rank reports; everyone learns the code.
  int mine[2] = {code != 0 ? rank_ : size_, code};
  int first = 0;
  collective::checkMpi(MPI_Allreduce(&mine[0], &first, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD),
                       "MPI_Allreduce of the set-up's outcome");
  if (first == size_) return 0;
  int worst = 0;
  collective::checkMpi(MPI_Allreduce(&mine[1], &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD),
                       "MPI_Allreduce of the set-up's exit code");
  if (rank_ == first) {
    std::cerr << tag() + " error: " + message + "\n" << std::flush;
  }
  return worst;
}

std::string MpiScope::fromRank0(const std::function<std::string()>& fn) {
  long long head[2] = {0, 0};  // exit code (0: ok), bytes
  std::string text;
  if (rank_ == 0) {
    try {
      text = fn();
    } catch (const Error& e) {
      head[0] = e.exitCode();
      text = e.what();
    } catch (const std::exception& e) {
      head[0] = 1;
      text = e.what();
    }
    head[1] = static_cast<long long>(text.size());
  }
  if (size_ > 1) {
    collective::checkMpi(MPI_Bcast(head, 2, MPI_LONG_LONG, 0, MPI_COMM_WORLD),
                         "MPI_Bcast of rank 0's result size");
    if (head[1] < 0) {
      throw CollectiveError(strCat("MPI_Bcast of rank 0's result size gave ", head[1],
                                   " bytes: the ranks are not in the same step of the set-up"));
    }
    text.resize(static_cast<std::size_t>(head[1]));
    constexpr long long kChunk = 1 << 30;  // MPI counts are ints
    for (long long off = 0; off < head[1]; off += kChunk) {
      collective::checkMpi(MPI_Bcast(text.data() + off,
                                     static_cast<int>(std::min(kChunk, head[1] - off)), MPI_CHAR,
                                     0, MPI_COMM_WORLD),
                           "MPI_Bcast of rank 0's result");
    }
  }
  if (head[0] == 2) throw ConfigError(text);
  if (head[0] != 0) throw Error(text);
  return text;
}

std::vector<std::string> MpiScope::gatherToRank0(const std::string& mine) {
  int n = static_cast<int>(mine.size());
  std::vector<int> sizes(rank_ == 0 ? size_ : 0), offsets(sizes.size());
  collective::checkMpi(MPI_Gather(&n, 1, MPI_INT, sizes.data(), 1, MPI_INT, 0, MPI_COMM_WORLD),
                       "MPI_Gather of the sizes of every rank's result");
  std::string all;
  if (rank_ == 0) {
    int total = 0;
    for (int r = 0; r < size_; ++r) {
      offsets[r] = total;
      total += sizes[r];
    }
    all.resize(static_cast<std::size_t>(total));
  }
  collective::checkMpi(MPI_Gatherv(mine.data(), n, MPI_CHAR, all.data(), sizes.data(),
                                   offsets.data(), MPI_CHAR, 0, MPI_COMM_WORLD),
                       "MPI_Gatherv of every rank's result");
  std::vector<std::string> out;
  for (int r = 0; r < static_cast<int>(sizes.size()); ++r) out.push_back(all.substr(offsets[r], sizes[r]));
  return out;
}

void MpiScope::abort(int code) {
  std::cout.flush();
  std::cerr.flush();
  if (size_ > 1) MPI_Abort(MPI_COMM_WORLD, code);
  MPI_Finalize();
  std::_Exit(code);
}

}  // namespace batchdist::launcher
