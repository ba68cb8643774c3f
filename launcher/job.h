#pragma once
// One rank's training job under MPI: what `batchdist train` and `batchdist search`
// run, and what the library's batchdist::Job::train runs for a program
// (launcher/include/batchdist/batchdist.h): one function, so the command and the
// library give the same guarantees and the same messages.

#include <string>

#include "batchdist/batchdist.h"
#include "launcher/mpi_scope.h"
#include "worker/run.h"

namespace batchdist::launcher {

/// From now on SIGTERM (Slurm's time limit, scancel, preemption), SIGUSR1 (sbatch
/// --signal=USR1@T) and SIGINT ask for a clean stop: every rank finishes the same
/// step, rank 0 writes the model and the report, and the job exits 128 + signal.
/// A second signal of the same kind acts as usual (SA_RESETHAND).
void installStopHandlers();
/// The stop signal received (SIGTERM, SIGUSR1, SIGINT), or 0.
int stopSignal();

/// Ends the whole job after this rank's error (its message already printed). A
/// rank that has already received SIGTERM (mpirun ending the job sends it, after
/// SIGCONT to stopped ranks) just exits: an MPI_Abort while mpirun tears the job
/// down only adds Open MPI's notices to the log.
[[noreturn]] void abortJob(MpiScope& mpi, int code);

/// Where this rank sits, from MPI.
worker::RankPlace placeOf(MpiScope& mpi);

/// The set-up, agreed over MPI in two steps (every rank exits with the same code,
/// the lowest failing rank says why): config, device and outputs, then the data,
/// which every rank reaches together so that rank 0's listing can be broadcast.
int prepare(const worker::RunRequest& req, const worker::RankPlace& place, MpiScope& mpi,
            worker::RunSetup& setup);

/// `train` and `search`: the stop handlers installed, the local set-up agreed
/// over MPI, then the run; a failure during it ends the whole job with one
/// message from the failing rank (abortJob). Returns the exit code
/// (worker::runExitCode; 2 for a bad config, from every rank). `req.stop_signal`
/// is set here.
int runTrainJob(worker::RunRequest req, MpiScope& mpi);

/// The request of a run of `config` (a file, or "" for the defaults) with the
/// keys `sets` ("key=value") and the command line's `options`: what the
/// batchdist command and the library's Job::train hand to runTrainJob.
worker::RunRequest runRequest(const std::string& config, const std::vector<std::string>& sets,
                              const RunOptions& options);

/// Seconds since this process started (the kernel's start time, in clock ticks
/// since boot, against CLOCK_BOOTTIME); -1 if /proc cannot tell.
double secondsSinceProcessStart();

}  // namespace batchdist::launcher
