#pragma once
// `batchdist elastic CONFIG --hosts FILE`: runs the job as mpirun on the hosts
// that answer, watches it, and after a lost host goes on at the largest world
// with an equal split of the same global batch (Note [elastic split]), from the
// newest checkpoint; it grows back when hosts return.
//
// Note [elastic supervisor]
// ~~~~~~~~~~~~~~~~~~~~~~~~~
// Open MPI 4.1 has no ULFM (no MPIX_Comm_shrink): a job that lost a rank cannot
// go on in place, so recovery is a relaunch, and what makes it cheap is that a
// resumed run keeps G, the lr schedule and the sample order on any world (Note
// [checkpoint]). Who watches what:
//   - mpirun, the supervisor's child in a session of its own: a rank that exits
//     or is killed ends it; its "process rank R ... on node H exited on signal"
//     line names the rank, and so the host, to blame.
//   - the ranks' heartbeats (Note [heartbeat]), UDP to the supervisor: a rank
//     silent for elastic.heartbeat_timeout_s (SIGSTOP, a cut link, a dead
//     kernel) is lost without waiting for dist.timeout_s; all ranks beating but
//     no step done for elastic.stall_s is a hang. They also say how far the job
//     got, its newest checkpoint and its batch split.
//   - the hosts: before every launch each is asked to start a process through
//     mpirun's own launch path (probe.h); a lost host rejoins once it has
//     answered for elastic.readmit_s, a host new in the list at once.
// What kills what: the supervisor ends an attempt by SIGTERM to mpirun's process
// group (SIGKILL after a grace), and mpirun's daemons end their ranks when it
// goes; ranks on a host that is cut off cannot be reached and are left to
// dist.timeout_s. Before the next launch the supervisor waits (bounded) until no
// rank of the ended attempt on a host it reuses still beats. A planned change
// (a host returns or joins, one leaves the list, or the supervisor is asked to
// stop) is SIGUSR1 to mpirun, which passes it to the ranks: the job's stop
// wish, a checkpoint at the next step boundary, no step lost.

#include "launcher/cli.h"

namespace batchdist::launcher {

/// Runs the elastic job; returns the exit code: 0 when it finished, 2 for bad
/// input (config, host list, options; or the job's own exit 2), 1 when it gave
/// up (fewer than --min-ranks for elastic.wait_s, or --max-restarts reached),
/// 128 + signal when it was asked to stop.
int runElastic(const CliOptions& cli);

}  // namespace batchdist::launcher
