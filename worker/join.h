#pragma once
// Joining the job's process group: what a run does first (worker/run.cc), and what
// the library's DataParallel does (launcher/data_parallel.cc).

#include <ATen/core/Tensor.h>

#include <memory>
#include <string>

#include "collective/communicator.h"
#include "worker/rank_place.h"

namespace batchdist::worker {

/// The job's process group, joined: the communicator and the rendezvous store's
/// address.
struct ProcessGroupJoin {
  std::unique_ptr<collective::Communicator> comm;
  std::string store_address;
};

/// Joins the job's process group: the rendezvous over MPI (MPI_COMM_WORLD, every
/// rank at once), then c10d's `backend` (dist.backend's values; auto resolves) on
/// `device` (made the current CUDA device first), each collective bounded by
/// `timeout_s`, over `interface` ("": the host's). Collective.
ProcessGroupJoin joinProcessGroup(const RankPlace& place, const at::Device& device,
                                  const std::string& backend, double timeout_s,
                                  const std::string& interface);

}  // namespace batchdist::worker
