#pragma once
// The library's batchdist::Job and batchdist::DataParallel inside: what api.cc,
// data_parallel.cc, shards.cc and search_call.cc share.

#include <memory>
#include <vector>

#include "batchdist/batchdist.h"
#include "collective/communicator.h"
#include "collective/reducer.h"
#include "launcher/mpi_scope.h"
#include "worker/config/config.h"
#include "worker/common/faults.h"

namespace batchdist {

struct Job::Impl {
  Impl(int* argc, char*** argv) : mpi(argc, argv) {}
  launcher::MpiScope mpi;
  worker::FaultPlan faults;  ///< Note [fault plan]: the tests' faults, as the command reads them
  int faults_code = 0;       ///< 2: the environment's faults are malformed
};

struct DataParallel::Impl {
  torch::nn::Module* module = nullptr;
  at::Device device = at::kCPU;
  bool has_batchnorm = false;
  std::unique_ptr<collective::Communicator> comm;
  std::vector<torch::Tensor> params;  ///< those that require grad, in the module's order
  std::unique_ptr<collective::Reducer> reducer;
  int64_t syncs = 0;  ///< sync() calls so far (searchBatch: did a failed step reach it?)

  /// DataParallel::sync() (Note [step wishes]).
  StepWishes sync(const StepWishes& mine);
};

/// `settings` as a run reads them (the file, then the keys; without a file the
/// keys over the defaults); `source` ("batchdist::EqualShards") names them in
/// messages. Throws std::invalid_argument with the launcher's message.
worker::Config configOf(const Settings& settings, const std::string& source);

/// Throws std::invalid_argument "CALL: WHAT" (call: "batchdist::EqualShards").
[[noreturn]] void invalidArgument(const char* call, const std::string& what);

/// configOf() for an own-loop call (EqualShards, searchBatch) on a data set of
/// `dataset_size` samples: an empty one and batch.adapt (the launcher's run's
/// alone) are refused.
worker::Config ownLoopConfig(const char* call, int64_t dataset_size, const Settings& settings);

/// The own-loop calls' way into a DataParallel (searchBatch(), EqualShards).
struct DataParallelAccess {
  using Impl = DataParallel::Impl;
  static Impl& of(DataParallel& dp) { return *dp.impl_; }
  static const Impl& of(const DataParallel& dp) { return *dp.impl_; }
};

}  // namespace batchdist
