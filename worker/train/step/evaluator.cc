#include "worker/train/step/evaluator.h"

#include <torch/torch.h>

#include <algorithm>
#include <numeric>
#include <utility>
#include <vector>

#include "collective/grad_sync.h"
#include "worker/common/util.h"
#include "worker/model/model.h"
#include "worker/plan/plan.h"
#include "worker/task/task.h"

namespace batchdist::worker {

Evaluator::Evaluator(collective::Communicator& comm, Model& model, const Task& task,
                     const Dataset& val, std::unique_ptr<Loader> loader, Transform transform,
                     at::Device device, Precision precision, int64_t eval_per_gpu)
    : comm_(comm),
      model_(model),
      task_(task),
      val_(val),
      loader_(std::move(loader)),
      transform_(std::move(transform)),
      device_(device),
      precision_(precision),
      eval_per_gpu_(eval_per_gpu) {}

Evaluator::~Evaluator() = default;

EvalResult Evaluator::evaluate(int64_t per_gpu) {
  const double started = monotonicSeconds();
  torch::NoGradGuard no_grad;
  // Note [parameter units]: the shards of the validation set are uneven, so the
  // whole model, not a gather per unit and batch.
  const WholeParameters whole(model_);
  // Every rank evaluates with rank 0's BatchNorm statistics (DDP's broadcast_buffers).
  collective::broadcastCoalesced(comm_, model_.buffers(), 0);
  model_.train(false);
  // Note [task]: the task's sums, then the validation sample count, in one allreduce.
  std::vector<double> sums(static_cast<std::size_t>(task_.sumCount()) + 1, 0.0);
  if (val_.size() > 0) {
    const auto [begin, end] = evalShard(val_.size(), comm_.size(), comm_.rank());
    const int64_t chunk = eval_per_gpu_ > 0 ? eval_per_gpu_ : task_.evalChunk(per_gpu);
    std::vector<MicroBatch> chunks;
    for (int64_t b = begin; b < end; b += chunk) {
      MicroBatch m;
      for (int64_t i = b; i < std::min(end, b + chunk); ++i) m.indices.push_back(i);
      m.weights.assign(m.indices.size(), 1.0f);
      chunks.push_back(std::move(m));
    }
    if (loader_) loader_->start(chunks, 0);
    for (int64_t b = begin; b < end; b += chunk) {
      const int64_t e = std::min(end, b + chunk);
      torch::Tensor x, target;
      if (loader_) {
        x = loader_->next().x;  // decoded, normalised, on the device
        target = val_.targets(torch::arange(b, e, torch::kLong));
      } else {
        // Token windows: int64 ids of the file's views (Note [tokens]); a
        // program's examples read once (Note [program data]).
        std::vector<int64_t> idx(static_cast<std::size_t>(e - b));
        std::iota(idx.begin(), idx.end(), b);
        auto [bx, bt] = val_.batch(idx);
        x = transform_.apply(bx.to(device_), 0);
        target = bt;
      }
      target = target.to(device_);
      task_.forwardEvalSums(model_, x, target, {device_, precision_}, sums);  // Note [task]
      sums.back() += static_cast<double>(e - b);
    }
  }
  const auto total = comm_.allreduce(sums, collective::ReduceOp::kSum);
  EvalResult r;
  r.samples = static_cast<int64_t>(total.back());
  // Without validation samples the metrics are 0 (named all the same).
  r.metrics = task_.metrics(total, std::max(1.0, total.back()));
  if (r.samples > 0) r.loss = total[0] / total.back();
  seconds_ += monotonicSeconds() - started;
  ++count_;
  return r;
}

}  // namespace batchdist::worker
