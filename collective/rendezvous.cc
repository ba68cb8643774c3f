#include "collective/rendezvous.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>

#include <cstdlib>
#include <cstring>

#include "common/error.h"
#include "collective/mpi_comm.h"
#include "collective/torch_compat.h"

namespace batchdist::collective {

std::vector<NetInterface> listInterfaces() {
  std::vector<NetInterface> out;
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return out;
  for (ifaddrs* it = list; it != nullptr; it = it->ifa_next) {
    if (it->ifa_addr == nullptr || it->ifa_addr->sa_family != AF_INET) continue;
    if (!(it->ifa_flags & IFF_UP)) continue;
    char buf[INET_ADDRSTRLEN] = {};
    auto* sin = reinterpret_cast<sockaddr_in*>(it->ifa_addr);
    inet_ntop(AF_INET, &sin->sin_addr, buf, sizeof buf);
    out.push_back({it->ifa_name, buf, (it->ifa_flags & IFF_LOOPBACK) != 0});
  }
  freeifaddrs(list);
  return out;
}

namespace {
std::string describe(const std::vector<NetInterface>& ifs) {
  std::string s;
  for (const auto& i : ifs) s += (s.empty() ? "" : ", ") + i.name + " (" + i.address + ")";
  return s.empty() ? "none with IPv4" : s;
}
}  // namespace

std::string chooseAddress(const std::string& interface, bool all_ranks_local,
                          std::string* chosen_interface) {
  std::string name = interface;
  if (name.empty()) {
    if (const char* env = std::getenv("BATCHDIST_IFNAME")) name = env;
  }
  const auto ifs = listInterfaces();
  if (!name.empty()) {
    for (const auto& i : ifs) {
      if (i.name == name) {
        if (chosen_interface) *chosen_interface = name;
        return i.address;
      }
    }
    throw ConfigError(strCat("dist.interface: no interface '", name,
                             "' with an IPv4 address on this host; it has: ", describe(ifs)));
  }
  if (all_ranks_local) return "127.0.0.1";
  for (const auto& i : ifs) {
    if (!i.loopback) return i.address;
  }
  throw ConfigError(strCat(
      "ranks run on several hosts but this host has no non-loopback IPv4 interface (",
      describe(ifs), "); set dist.interface or BATCHDIST_IFNAME"));
}

Rendezvous rendezvousOverMpi(MPI_Comm comm, const RendezvousOptions& opts) {
  int rank = 0;
  int size = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);

  Rendezvous r;
  r.address = chooseAddress(opts.interface, opts.all_ranks_local, &r.interface);
  if (!r.interface.empty()) {
    // Gloo and NCCL bootstrap on the same interface unless the user said otherwise.
    setenv("GLOO_SOCKET_IFNAME", r.interface.c_str(), 0);
    setenv("NCCL_SOCKET_IFNAME", r.interface.c_str(), 0);
  }

  char buf[256] = {};
  std::string error;
  if (rank == 0) {
    try {
      auto server = compat::makeTcpStore(r.address, 0, /*is_server=*/true, opts.timeout);
      r.store = server;
      r.store_address = strCat(r.address, ":", server->getPort());
    } catch (const std::exception& e) {
      error = e.what();
    }
    // An empty address tells the other ranks that rank 0 failed, so none waits.
    std::snprintf(buf, sizeof buf, "%s", error.empty() ? r.store_address.c_str() : "");
  }
  checkMpi(MPI_Bcast(buf, sizeof buf, MPI_CHAR, 0, comm), "MPI_Bcast of the rendezvous store address");
  if (rank == 0 && !error.empty()) {
    throw CollectiveError(strCat("rank 0 could not open the rendezvous store on ", r.address,
                                 ": ", firstLine(error)));
  }
  if (buf[0] == '\0') {
    throw CollectiveError(strCat("rank ", rank,
                                 ": rank 0 could not open the rendezvous store; see its error"));
  }
  if (rank != 0) {
    r.store_address = buf;
    const auto colon = r.store_address.rfind(':');
    const std::string host = r.store_address.substr(0, colon);
    const int port = std::atoi(r.store_address.c_str() + colon + 1);
    try {
      r.store = compat::makeTcpStore(host, static_cast<uint16_t>(port), false, opts.timeout);
    } catch (const std::exception& e) {
      throw CollectiveError(strCat(
          "rank ", rank, " could not reach the rendezvous store of rank 0 at ", r.store_address,
          " within ", opts.timeout.count() / 1000.0, " s (", firstLine(e.what()),
          "). Rank 0 publishes the address of dist.interface / BATCHDIST_IFNAME; pick an "
          "interface both hosts share. This host has: ",
          describe(listInterfaces())));
    }
  }
  return r;
}

}  // namespace batchdist::collective
