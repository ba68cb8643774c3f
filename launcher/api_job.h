#pragma once
// The library's batchdist::Job inside: what api.cc and data_parallel.cc share.

#include "batchdist/batchdist.h"
#include "launcher/mpi_scope.h"
#include "worker/common/faults.h"

namespace batchdist {

struct Job::Impl {
  Impl(int* argc, char*** argv) : mpi(argc, argv) {}
  launcher::MpiScope mpi;
  worker::FaultPlan faults;  ///< Note [fault plan]: the tests' faults, as the command reads them
  int faults_code = 0;       ///< 2: the environment's faults are malformed
};

}  // namespace batchdist
