#include "worker/join.h"

#include <mpi.h>

#include <chrono>

#include "collective/process_group.h"
#include "collective/rendezvous.h"
#include "collective/torch_compat.h"

namespace batchdist::worker {

ProcessGroupJoin joinProcessGroup(const RankPlace& place, const at::Device& device,
                                  const std::string& backend, double timeout_s,
                                  const std::string& interface) {
  if (device.is_cuda()) compat::setCudaDevice(device.index());
  const auto timeout = std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000));
  collective::RendezvousOptions ro;
  ro.interface = interface;
  ro.timeout = timeout;
  ro.all_ranks_local = place.host_count == 1;
  const auto rv = collective::rendezvousOverMpi(MPI_COMM_WORLD, ro);
  collective::BackendOptions bo;
  bo.backend = backend;
  bo.device = device;
  bo.timeout = timeout;
  bo.interface = rv.interface;
  bo.address = rv.address;
  bo.one_host = place.host_count == 1 && place.size > 1;
  return {collective::createCommunicator(rv.store, place.rank, place.size, bo), rv.store_address};
}

}  // namespace batchdist::worker
