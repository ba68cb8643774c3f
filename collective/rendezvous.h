#pragma once
// Rendezvous: rank 0 opens a c10d TCPStore on a free port and its address reaches
// the other ranks by MPI_Bcast, so no MASTER_ADDR/MASTER_PORT is needed.

#include <c10/util/intrusive_ptr.h>
#include <mpi.h>

#include <chrono>
#include <string>
#include <vector>

namespace c10d {
class Store;
}

namespace batchdist::collective {

/// An IPv4 interface that is up.
struct NetInterface {
  std::string name;
  std::string address;
  bool loopback = false;
};

/// Interfaces of this host that are up and have an IPv4 address.
std::vector<NetInterface> listInterfaces();

/// This rank's address for the rendezvous and Gloo. `interface` (dist.interface,
/// else env BATCHDIST_IFNAME) wins; otherwise loopback when every rank is on this
/// host, else the first non-loopback interface. Throws ConfigError naming the
/// interfaces this host has when the named one does not exist.
std::string chooseAddress(const std::string& interface, bool all_ranks_local,
                          std::string* chosen_interface = nullptr);

struct RendezvousOptions {
  std::string interface;  ///< dist.interface (may be empty)
  std::chrono::milliseconds timeout{std::chrono::minutes(5)};
  bool all_ranks_local = true;  ///< every rank runs on this host
};

struct Rendezvous {
  c10::intrusive_ptr<c10d::Store> store;
  std::string address;        ///< this rank's address (for Gloo)
  std::string interface;      ///< interface name if one was named, else empty
  std::string store_address;  ///< "host:port" of rank 0's store
};

/// Collective over `comm`: every rank must call it. Returns a store connected to
/// rank 0's server. Throws CollectiveError naming the address when a rank cannot
/// connect within the timeout.
Rendezvous rendezvousOverMpi(MPI_Comm comm, const RendezvousOptions& opts);

}  // namespace batchdist::collective
