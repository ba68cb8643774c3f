// batchdist::EqualShards (include/batchdist/batchdist.h): the launcher's plan and
// sharder (Note [equal shards], worker/plan/plan.h) for a program's own loop, from
// the program's settings read as a run reads them (configOf in api.cc).

#include <stdexcept>

#include "batchdist/batchdist.h"
#include "common/error.h"
#include "launcher/api_job.h"
#include "worker/common/util.h"
#include "worker/plan/plan.h"

namespace batchdist {

struct EqualShards::Impl {
  worker::Plan plan;
  worker::Sharder sharder;
  int rank = 0;
};

namespace {

constexpr const char* kShards = "batchdist::EqualShards";

/// The settings' batch keys, checked as a run checks them.
worker::Config shardConfig(int64_t n, const Settings& settings) {
  auto cfg = ownLoopConfig(kShards, n, settings);
  if (cfg.batch.global_auto || cfg.batch.per_gpu_auto) {
    invalidArgument(kShards, "batch.global and batch.per_gpu are numbers here: searchBatch() finds "
                             "the per-GPU batch (set batch.per_gpu to its choice)");
  }
  if (cfg.batch.global == 0 && cfg.batch.per_gpu == 0) {
    invalidArgument(kShards, "set batch.global (or batch.per_gpu)");
  }
  return cfg;
}

worker::Plan shardPlan(const worker::Config& cfg, const DataParallelAccess::Impl& dp, int64_t n) {
  try {
    return worker::makePlan(cfg, dp.comm->size(), n, dp.has_batchnorm);
  } catch (const Error& e) {
    throw std::invalid_argument(e.what());  // its cfg.source names kShards
  }
}

void checkStep(const worker::Plan& p, int64_t step, int64_t k) {
  if (step < 0 || step >= p.steps_per_epoch || k < 0 || k >= p.accum) {
    throw std::out_of_range(strCat(kShards, ": micro-batch ", k, " of step ", step, "; an epoch has ",
                                   p.steps_per_epoch, " steps of ", p.accum, " micro-batches"));
  }
}

}  // namespace

EqualShards::EqualShards(const DataParallel& dp, int64_t dataset_size, const Settings& settings) {
  const auto& d = DataParallelAccess::of(dp);
  const auto cfg = shardConfig(dataset_size, settings);
  const auto plan = shardPlan(cfg, d, dataset_size);
  impl_ = std::make_unique<Impl>(
      Impl{plan, worker::Sharder(plan, static_cast<uint64_t>(cfg.train.seed)), d.comm->rank()});
}

EqualShards::~EqualShards() = default;
EqualShards::EqualShards(EqualShards&&) noexcept = default;
EqualShards& EqualShards::operator=(EqualShards&&) noexcept = default;

int64_t EqualShards::globalBatch() const { return impl_->plan.global; }
int64_t EqualShards::perGpu() const { return impl_->plan.per_gpu; }
int64_t EqualShards::accumulation() const { return impl_->plan.accum; }
int64_t EqualShards::stepsPerEpoch() const { return impl_->plan.steps_per_epoch; }
int64_t EqualShards::droppedPerEpoch() const { return impl_->plan.samples_dropped; }
int64_t EqualShards::paddedPerEpoch() const { return impl_->plan.samples_padded; }

void EqualShards::setEpoch(int64_t epoch) {
  if (epoch < 0) invalidArgument(kShards, strCat("epoch ", epoch, " is negative"));
  impl_->sharder.setEpoch(epoch);
}

MicroBatch EqualShards::micro(int64_t step, int64_t k) const {
  checkStep(impl_->plan, step, k);
  auto mb = impl_->sharder.micro(step, k, impl_->rank);
  return {std::move(mb.indices), std::move(mb.weights)};
}

int64_t EqualShards::realSamples(int64_t step) const {
  checkStep(impl_->plan, step, 0);
  return impl_->sharder.realSamples(step);
}

double EqualShards::lossScale(int64_t step) const {
  return static_cast<double>(impl_->plan.world_size) / static_cast<double>(realSamples(step));
}

}  // namespace batchdist
