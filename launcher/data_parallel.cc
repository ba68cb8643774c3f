// batchdist::DataParallel (include/batchdist/batchdist.h): the launcher's gradient
// sync for a program's own loop. The process group is joined as a run joins it
// (worker::joinProcessGroup), the module's state is rank 0's
// (collective::broadcastCoalesced, as the trainer's), the gradients go through the
// overlapped reducer (Note [overlapped reducer]) and the wishes through its side
// channel (Note [step wishes]: a slot per wish, counting the ranks that ask).

#include <stdexcept>

#include "batchdist/batchdist.h"
#include "collective/grad_sync.h"
#include "collective/process_group.h"
#include "collective/reducer.h"
#include "common/error.h"
#include "launcher/api_job.h"
#include "launcher/job.h"
#include "worker/common/util.h"
#include "worker/join.h"
#include "worker/model/program_model.h"
#include "worker/train/step/step_engine.h"

namespace batchdist {

namespace {

/// The device of the module's first parameter or buffer (CPU for neither).
at::Device deviceOf(torch::nn::Module& module) {
  for (const auto& t : module.parameters()) return t.device();
  for (const auto& t : module.buffers()) return t.device();
  return at::kCPU;
}

void checkOptions(const DataParallelOptions& o, const at::Device& device) {
  const auto bad = [](const std::string& what) { invalidArgument("batchdist::DataParallel", what); };
  if (!(o.bucket_mb > 0)) bad(strCat("bucket_mb must be > 0, got ", o.bucket_mb));
  if (!(o.timeout_s > 0)) bad(strCat("timeout_s must be > 0, got ", o.timeout_s));
  try {
    collective::resolveBackend(o.backend, device);
  } catch (const Error& e) {
    bad(e.what());
  }
}

}  // namespace

DataParallel::DataParallel(Job& job, torch::nn::Module& module, const DataParallelOptions& options)
    : impl_(std::make_unique<Impl>()) {
  const at::Device device = deviceOf(module);
  checkOptions(options, device);
  impl_->module = &module;
  impl_->device = device;
  impl_->has_batchnorm = worker::moduleHasBatchNorm(module);
  for (const auto& p : module.parameters()) {
    if (p.requires_grad()) impl_->params.push_back(p);
  }
  if (impl_->params.empty()) {
    throw std::invalid_argument("batchdist::DataParallel: the module has no parameter that requires grad");
  }
  try {
    const auto place = launcher::placeOf(job.impl_->mpi);
    impl_->comm = worker::joinProcessGroup(place, device, options.backend, options.timeout_s,
                                           options.interface)
                      .comm;
    auto state = worker::moduleState(module);
    for (auto& t : state) t = t.detach();  // written in place by the broadcast
    collective::broadcastCoalesced(*impl_->comm, state, 0);
    const auto bucket_bytes = static_cast<std::size_t>(options.bucket_mb * 1024 * 1024);
    impl_->reducer = std::make_unique<collective::Reducer>(*impl_->comm, impl_->params, bucket_bytes);
  } catch (const Error& e) {
    throw std::runtime_error(strCat("batchdist::DataParallel: ", e.what()));
  }
  launcher::installStopHandlers();
}

DataParallel::~DataParallel() = default;

void DataParallel::zeroGrad() { impl_->reducer->zeroGrad(); }

void DataParallel::beforeBackward(bool last) {
  // An optimizer's zero_grad() (set_to_none in LibTorch 2.x) drops the gradients;
  // autograd would then make new ones outside the buckets.
  for (const auto& p : impl_->params) {
    if (!p.grad().defined()) {
      impl_->reducer->zeroGrad();
      break;
    }
  }
  impl_->reducer->beforeBackward(last);
}

StepWishes DataParallel::Impl::sync(const StepWishes& mine) {
  ++syncs;
  const bool stop = mine.stop || launcher::stopSignal() != 0;
  try {
    const auto all = worker::unpackWishes(
        reducer->sumGradients(worker::packWishes({stop, mine.checkpoint, false})));
    const double ranks = comm->size();
    if (ranks > 1) {
      torch::NoGradGuard no_grad;
      for (const auto& p : params) p.grad().div_(ranks);
    }
    return {all.stop, all.checkpoint};
  } catch (const Error& e) {
    throw std::runtime_error(strCat("batchdist::DataParallel: ", e.what()));
  }
}

StepWishes DataParallel::sync(const StepWishes& mine) { return impl_->sync(mine); }

int DataParallel::stopSignal() const { return launcher::stopSignal(); }

std::string DataParallel::backend() const { return impl_->comm->backendName(); }

}  // namespace batchdist
