#pragma once
// Communicator over MPI for host tensors (dist.backend: mpi).
//
// Note [mpi backend]: the job already runs under mpirun, so Open MPI's own
// transports are there for the taking: shared memory between the ranks of a host
// (no TCP loopback, no progress thread, no context switch per message) and the
// fabric between hosts. Collectives are MPI's non-blocking ones, polled with
// MPI_Test until done or the communicator's timeout (then CollectiveError with the
// stall report, as for c10d: Note [stall report]). MPI was initialised with
// MPI_THREAD_FUNNELED, so every call must come from the thread that made the
// communicator; on the CPU the autograd engine runs the reducer's hooks on the
// thread that called backward(), which is that thread. A call from another thread
// is refused with a CollectiveError instead of corrupting MPI's state.
// With no progress thread, a non-blocking collective moves only inside MPI calls:
// left alone during backward, the buckets started from hooks would wait for
// finish() and nothing would overlap. The reducer therefore calls
// PendingWork::progress() (one MPI_Test per bucket in flight) from every autograd
// hook; on bench/overlap.sh that cut the exposed communication from 0.57 to 0.22
// of the non-overlapped path's (docs/performance.md).

#include <c10/util/intrusive_ptr.h>
#include <mpi.h>

#include <memory>
#include <string>

#include "collective/communicator.h"

namespace c10d {
class Store;
}

namespace batchdist::collective {

/// Whether MPI is initialised in this process (the job was started by mpirun).
bool mpiAvailable();

/// MPI's text for error code `code` (MPI_Error_string).
std::string mpiErrorText(int code);

/// For calls on a communicator whose error handler is MPI_ERRORS_RETURN (Note
/// [mpi errors]): throws CollectiveError "`call` failed: <MPI's text>" unless `rc`
/// is MPI_SUCCESS.
void checkMpi(int rc, const std::string& call);

/// Before MPI_Init: Open MPI's non-blocking allreduce (libnbc) takes, for fewer
/// than 4 ranks or any in-place call (ours are), the binomial algorithm: reduce
/// to rank 0, then broadcast, one after the other. The ring does the two halves at
/// once: for 80 KB on 2 ranks 26 us against 43-117 us, for 1.6 MB 180 us against
/// 390-1700 us (docs/performance.md). Selects the ring
/// (OMPI_MCA_coll_libnbc_iallreduce_algorithm=1) unless the environment already
/// chooses; every rank runs this same code, so all agree, as collectives must.
void preferRingAllreduce();

/// A communicator over a duplicate of `parent` (collective over it); `store` (may
/// be null) is used for the stall report only. Throws ConfigError if MPI is not
/// initialised or `device` is not the CPU.
std::unique_ptr<Communicator> createMpiCommunicator(const c10::intrusive_ptr<c10d::Store>& store,
                                                    at::Device device,
                                                    std::chrono::milliseconds timeout,
                                                    MPI_Comm parent = MPI_COMM_WORLD);

}  // namespace batchdist::collective
