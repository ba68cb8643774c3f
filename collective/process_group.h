#pragma once
// Communicator over a c10d backend; the one factory that picks the backend.

#include <c10/util/intrusive_ptr.h>

#include <string>

#include "collective/communicator.h"

namespace c10d {
class Store;
}

namespace batchdist::collective {

/// How to build a Communicator.
struct BackendOptions {
  std::string backend = "auto";  ///< auto | gloo | mpi | nccl (dist.backend)
  at::Device device = at::kCPU;  ///< where this rank computes
  std::chrono::milliseconds timeout{std::chrono::minutes(5)};
  std::string interface;  ///< network interface for Gloo (empty: use `address`)
  std::string address;    ///< this rank's IPv4 address for Gloo when no interface is named
  bool one_host = false;  ///< every rank of the job is on this host (auto may pick mpi)
};

/// After collective #seq timed out on this rank: names the ranks that never
/// reached a collective, agreed by every rank that reports, from their keys in the
/// rendezvous store (Note [stall report]); "" without a store. Blocks for up to
/// about timeout + 2 x clamp(timeout / 10, 5 s, 30 s) + 20 s.
std::string stallReport(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                        uint64_t seq, std::chrono::milliseconds timeout);

/// Where a pending collective comes from, for the message when it fails: what it
/// is ("gloo allreduce"), this rank of `size`, the timeout, the rendezvous store
/// (null: none) and the collective's number on this rank (Note [stall report]).
/// One per work of every backend (C10dWork, MpiWork).
struct WorkOrigin {
  std::string what;
  int rank = 0;
  int size = 1;
  std::chrono::milliseconds timeout{0};
  c10::intrusive_ptr<c10d::Store> store;
  uint64_t seq = 0;
  /// "WHAT #SEQ", the collective as a failure names it.
  std::string label() const { return what + " #" + std::to_string(seq); }
  /// stallReport() for this collective.
  std::string stall() const { return stallReport(store, rank, size, seq, timeout); }
};

/// `ranks` (ascending) with their hosts, short at any count: "ranks 17, 40-41
/// (host a); rank 3 (host b)"; at most a few hosts and ranges are spelled out.
std::string describeRanks(const std::vector<int>& ranks, const std::vector<std::string>& hosts);

/// Backends compiled into this build, e.g. {"gloo", "mpi"} or {"gloo", "mpi", "nccl"}.
std::vector<std::string> availableBackends();

/// Maps dist.backend to a concrete backend for `device`: auto -> nccl on CUDA
/// (when compiled); on the CPU, mpi when `one_host` (several ranks, all on this
/// host, MPI initialised: Note [mpi backend]), gloo otherwise. Throws ConfigError
/// naming the backends this build has for an unknown or unavailable name, or
/// nccl on a CPU device.
std::string resolveBackend(const std::string& requested, const at::Device& device,
                           bool one_host = false);

/// Joins the process group through `store`; blocks until all `size` ranks joined
/// or the timeout expired (CollectiveError).
std::unique_ptr<Communicator> createCommunicator(const c10::intrusive_ptr<c10d::Store>& store,
                                                 int rank, int size, const BackendOptions& opts);

}  // namespace batchdist::collective
