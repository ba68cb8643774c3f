#pragma once
// What every batch-search measurer shares, whatever its step is (the launcher's
// training step, worker/train/step/step_measurer.cc, or a program's own step,
// launcher/search_call.cc): the device's memory probe, and the warm-up, the
// agreement and the adaptive timing of one candidate (Note [search warm-up],
// Note [adaptive timing] in worker/search/search.h).

#include <c10/core/Device.h>

#include <cstdint>
#include <exception>
#include <functional>
#include <string>

#include "collective/communicator.h"
#include "worker/config/config.h"
#include "worker/search/search.h"

namespace batchdist::worker {

/// Peak memory, budget and synchronisation of the device a candidate runs on:
/// CUDA's allocator (budget search.memory_fraction of the device) or the
/// process's resident memory (budget search.memory_limit_mb, 0 = none).
class DeviceProbe {
 public:
  DeviceProbe(at::Device device, const SearchConfig& search);
  double budgetMb() const { return budget_mb_; }
  /// e.g. "NVIDIA H100 80GB HBM3" or "cpu".
  const std::string& name() const { return name_; }
  void resetPeak() const;
  double peakMb() const;
  /// Waits for the device's queued work (nothing on the CPU).
  void synchronize() const;
  /// Gives the CUDA allocator's cached blocks back (nothing on the CPU).
  void emptyCache() const;

 private:
  at::Device device_;
  double budget_mb_ = 0;
  std::string name_;
};

/// `e`, thrown by a candidate's step on this rank, as out's failure: out of
/// memory, or an error with the first line of its message.
void recordFailure(const std::exception& e, Measurement& out);

/// One candidate as a measurer runs it.
struct CandidateRun {
  int64_t warm = 0;              ///< untimed steps first (Note [search warm-up])
  int64_t samples_per_step = 0;  ///< per rank: per-GPU batch x accumulation
  bool decoded = false;          ///< loader threads decode the data (Note [data-bound search])
  /// Step `i` of the candidate. A rank whose step fails still makes the step's
  /// collectives (Note [search agreement]) and records the failure in the
  /// Measurement; it is called again for the remaining steps with the failure set.
  std::function<void(int64_t i, Measurement& out)> step;
  std::function<void()> after_warmup;  ///< between the untimed and the timed steps
};

/// One candidate on this rank: run.warm untimed steps, then (unless a rank failed
/// or went past its budget in them: agreed, Note [search warm-up]) timed steps
/// under `rule` (Note [adaptive timing]). Fills out.step_seconds, out.peak_mb,
/// the rates (when it did not fail) and, past the budget, out.fail. Collective.
void timeCandidate(collective::Communicator& comm, const DeviceProbe& probe,
                   const TimingRule& rule, const CandidateRun& run, Measurement& out);

}  // namespace batchdist::worker
