#pragma once
// A rank's heartbeat to `batchdist elastic`'s supervisor (launcher/elastic.h).
//
// Note [heartbeat]
// ~~~~~~~~~~~~~~~~
// The supervisor must tell a host that went silent (power, link, kernel) from a
// slow step, without waiting for dist.timeout_s, and it must know how far the
// job got (the steps a relaunch loses). So every rank sends one UDP datagram
// every elastic.heartbeat_s to the address the supervisor put in
// BATCHDIST_HEARTBEAT ("ip:port", with BATCHDIST_ATTEMPT, the attempt's number):
//
//   batchdist-heartbeat 1 attempt=A rank=R pid=P phase=train step=S checkpoint=C
//   per_gpu=m accum=a global=G collectives=N
//
// from a thread of its own, so a rank busy in a long step or blocked in a
// collective still beats; one stopped (SIGSTOP), killed or cut off does not.
// `step` is the optimizer steps done (a resumed run starts at its checkpoint's),
// `checkpoint` the step of the newest checkpoint written (-1: none yet): the
// supervisor's "lost steps" is the last step seen less the checkpoint it resumes
// from. `collectives` is how many collectives the rank has started
// (collective::collectivesStarted()): in a hang every rank has done the same
// steps (a step needs them all), but the ranks waiting in a collective have
// started more than the one that hangs outside it, so the supervisor names that
// one (launcher/elastic/monitor.cc). UDP, not the rendezvous store: the store lives on rank 0, which may be
// the rank that is lost, and a datagram never blocks the sender. A rank without
// BATCHDIST_HEARTBEAT (every run but an elastic one) sends nothing.

#include <cstdint>
#include <string>

namespace batchdist::worker::heartbeat {

/// Starts the sender when BATCHDIST_HEARTBEAT is set (once; later calls do
/// nothing). Throws ConfigError for a malformed address.
void startFromEnvironment(int rank);
/// Stops the sender after one last beat (phase "done" or what was set).
void stop();

/// What the next beats say. Cheap (atomics); callable before start().
/// "setup", "search", "train", "finish" (the report and the model), "done": a literal.
void setPhase(const char* phase);
void setStep(int64_t step);
void setCheckpoint(int64_t step);
void setBatch(int64_t per_gpu, int64_t accum, int64_t global);

/// One beat's text (the wire format above), for the sender and the tests.
std::string message(int attempt, int rank, int pid, const char* phase, int64_t step,
                    int64_t checkpoint, int64_t per_gpu, int64_t accum, int64_t global,
                    uint64_t collectives);

}  // namespace batchdist::worker::heartbeat
