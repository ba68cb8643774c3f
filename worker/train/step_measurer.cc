#include "worker/train/step_measurer.h"

#include <torch/torch.h>

#include <algorithm>
#include <vector>

#include "collective/torch_compat.h"
#include "worker/common/util.h"
#include "worker/model/model.h"
#include "worker/plan/plan.h"
#include "worker/train/memory.h"
#include "worker/train/trainer.h"

namespace batchdist::worker {
namespace {

class TrainStepMeasurer : public Measurer {
 public:
  TrainStepMeasurer(const Config& cfg, collective::Communicator& comm, const DataSplit& data,
                    at::Device device)
      : cfg_(cfg), comm_(comm), data_(data), device_(device) {
    // A throwaway model: the training run starts from a fresh, identical one.
    has_bn_ = modelHasBatchNorm(cfg_.model, cfg_.base_dir);
    const auto first = makePlan(cfg_, comm_.size(), data_.train.size(), has_bn_,
                                std::max<int64_t>(2, cfg_.search.min));
    trainer_ = std::make_unique<Trainer>(cfg_, comm_, data_, device_, first);
    if (device_.is_cuda()) {
      total_mb_ = compat::cudaTotalBytes(device_.index()) / (1 << 20);
      budget_mb_ = cfg_.search.memory_fraction * total_mb_;
      name_ = compat::cudaDeviceName(device_.index());
    } else {
      budget_mb_ = static_cast<double>(cfg_.search.memory_limit_mb);
      name_ = "cpu";
    }
  }

  double memoryBudgetMb() const override { return budget_mb_; }
  std::string deviceName() const override { return name_; }

  Measurement measure(int64_t per_gpu, int64_t accum, int64_t extra_warmup) override {
    Measurement out;
    Config cfg = cfg_;
    cfg.batch.global = 0;
    cfg.batch.global_auto = false;
    cfg.batch.accum = accum;
    const auto plan = makePlan(cfg, comm_.size(), data_.train.size(), has_bn_, per_gpu);
    trainer_->setPlan(plan);
    Sharder sharder(plan, static_cast<uint64_t>(cfg.train.seed));
    const int64_t warm = cfg.search.warmup_steps + extra_warmup;
    const int64_t total = warm + cfg.search.timed_steps;
    std::vector<MicroBatch> jobs;
    for (int64_t i = 0; i < total; ++i) {
      for (auto& j : trainer_->jobs(sharder, i % plan.steps_per_epoch, 1)) jobs.push_back(std::move(j));
    }
    trainer_->loader().start(std::move(jobs), 0);
    // Note [sync batchnorm]: measured without it, so that a rank running out of
    // memory mid-forward cannot strand the others in a BatchNorm allreduce.
    setSyncBatchNormEnabled(false);
    resetPeak();
    // Each timed step is timed alone and the median taken: one step delayed by
    // the scheduler (or a peer's) does not move the estimate.
    std::vector<double> step_secs;
    for (int64_t i = 0; i < total; ++i) {
      if (i >= warm) synchronize();
      const double t = monotonicSeconds();
      const int64_t step = i % plan.steps_per_epoch;
      if (out.fail == FailKind::kNone) {
        try {
          trainer_->computeGradients(sharder.realSamples(step));
        } catch (const std::exception& e) {
          out.fail = isOutOfMemory(e) ? FailKind::kOutOfMemory : FailKind::kError;
          if (out.fail == FailKind::kError) {
            const std::string what = e.what();
            out.detail = what.substr(0, what.find('\n'));
          }
          trainer_->clearGradients();
          if (device_.is_cuda()) compat::cudaEmptyCache();
        }
      }
      // Always: the gradient allreduce keeps every rank in step (Note [search agreement]).
      trainer_->syncGradients();
      if (out.fail == FailKind::kNone) trainer_->applyUpdate(plan.lr);
      if (i >= warm) {
        synchronize();
        step_secs.push_back(monotonicSeconds() - t);
      }
    }
    out.peak_mb = peakMb();
    if (out.fail == FailKind::kNone && !step_secs.empty()) {
      std::sort(step_secs.begin(), step_secs.end());
      const std::size_t n = step_secs.size();
      const double median =
          n % 2 ? step_secs[n / 2] : 0.5 * (step_secs[n / 2 - 1] + step_secs[n / 2]);
      out.timed_steps = static_cast<int64_t>(n);
      out.samples_per_s = static_cast<double>(per_gpu * accum) / std::max(median, 1e-9);
      if (budget_mb_ > 0 && out.peak_mb > budget_mb_) out.fail = FailKind::kOverBudget;
    }
    trainer_->clearGradients();
    trainer_->takeTime();
    setSyncBatchNormEnabled(true);
    if (device_.is_cuda()) compat::cudaEmptyCache();
    return out;
  }

 private:
  void resetPeak() {
    if (device_.is_cuda()) {
      compat::cudaResetPeak(device_.index());
    } else {
      resetPeakRss();
    }
  }
  double peakMb() const {
    return device_.is_cuda() ? compat::cudaPeakAllocatedBytes(device_.index()) / (1 << 20)
                             : peakRssMb();
  }
  void synchronize() const {
    if (device_.is_cuda()) torch::cuda::synchronize(device_.index());
  }

  const Config& cfg_;
  collective::Communicator& comm_;
  const DataSplit& data_;
  at::Device device_;
  std::unique_ptr<Trainer> trainer_;
  bool has_bn_ = false;
  double total_mb_ = 0;
  double budget_mb_ = 0;
  std::string name_;
};

}  // namespace

std::unique_ptr<Measurer> makeTrainStepMeasurer(const Config& cfg, collective::Communicator& comm,
                                                const DataSplit& data, at::Device device) {
  return std::make_unique<TrainStepMeasurer>(cfg, comm, data, device);
}
}  // namespace batchdist::worker
