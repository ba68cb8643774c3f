// batchdist::searchBatch (include/batchdist/batchdist.h): the launcher's
// coordinated batch search (worker/search/search.h) with a program's own step as
// the measurer. Note [search agreement] holds as for the launcher's step: a rank
// whose step fails before it reached dp.sync() sends its gradients as zeros
// (Reducer::finish() after a failed backward) and, for the rest of the
// candidate, calls sync() in place of the step, so every rank makes the same
// allreduces whatever its step did.

#include <iostream>
#include <stdexcept>

#include "batchdist/batchdist.h"
#include "common/error.h"
#include "launcher/api_job.h"
#include "launcher/job.h"
#include "worker/common/console.h"
#include "worker/common/util.h"
#include "worker/search/output.h"
#include "worker/search/search.h"
#include "worker/train/memory.h"
#include "worker/train/step_timing.h"

namespace batchdist {
namespace {

constexpr const char* kSearch = "batchdist::searchBatch";

class ProgramStepMeasurer final : public worker::Measurer {
 public:
  ProgramStepMeasurer(DataParallelAccess::Impl& dp, const StepFunction& step, const worker::Config& cfg)
      : dp_(dp), step_(step), cfg_(cfg), probe_(dp.device, cfg.search) {}

  worker::Measurement measure(int64_t per_gpu, int64_t accum, const worker::Levers& /*base*/,
                              const worker::TimingRule& rule, int64_t extra_warmup) override {
    worker::Measurement out;
    worker::CandidateRun run;
    run.warm = cfg_.search.warmup_steps + extra_warmup;
    run.samples_per_step = per_gpu * accum;
    run.step = [&](int64_t, worker::Measurement& m) { step(per_gpu, accum, m); };
    worker::timeCandidate(*dp_.comm, probe_, rule, run, out);
    dp_.reducer->zeroGrad();
    probe_.emptyCache();
    return out;
  }
  double memoryBudgetMb() const override { return probe_.budgetMb(); }
  std::string deviceName() const override { return probe_.name(); }
  std::string recomputeUnsupported() const override { return "the program's own step"; }

 private:
  /// One call of the program's step; a rank that failed (now or earlier in the
  /// candidate) makes the step's one sync() with zeros instead.
  void step(int64_t per_gpu, int64_t accum, worker::Measurement& out) {
    if (out.fail == worker::FailKind::kNone) {
      const int64_t before = dp_.syncs;
      try {
        step_(per_gpu, accum);
        if (dp_.syncs == before + 1) return;
        out.fail = worker::FailKind::kError;
        out.detail = strCat("the step function called DataParallel::sync() ", dp_.syncs - before,
                            " times; a step calls it once");
        if (dp_.syncs > before) return;
      } catch (const std::exception& e) {
        out.fail = worker::isOutOfMemory(e) ? worker::FailKind::kOutOfMemory : worker::FailKind::kError;
        if (out.fail == worker::FailKind::kError) {
          const std::string what = e.what();
          out.detail = what.substr(0, what.find('\n'));
        }
        dp_.reducer->zeroGrad();
        probe_.emptyCache();
        if (dp_.syncs > before) return;  // it failed after the step's sync: the others are past it
      }
    }
    dp_.reducer->zeroGrad();
    dp_.sync({});
  }

  DataParallelAccess::Impl& dp_;
  const StepFunction& step_;
  const worker::Config& cfg_;
  worker::DeviceProbe probe_;
};

/// The settings' search keys, checked as a run checks them.
worker::Config searchConfig(int64_t n, const Settings& settings) {
  const auto bad = [](const std::string& what) {
    throw std::invalid_argument(strCat(kSearch, ": ", what));
  };
  if (n <= 0) bad(strCat("the data set has ", n, " samples"));
  auto cfg = configOf(settings, kSearch);
  if (cfg.batch.global_auto) bad("batch.global: auto is the launcher's run's alone; give a number or leave it unset");
  if (cfg.batch.adapt != worker::BatchAdapt::kOff) bad("batch.adapt is the launcher's run's alone");
  if (worker::configLevers(cfg) != worker::Levers{}) {
    bad("dist.shard and model.recompute are the launcher's levers; the program's step has none");
  }
  return cfg;
}

/// The module's parameters and buffers, copied; put back at destruction.
class StateSnapshot {
 public:
  explicit StateSnapshot(torch::nn::Module& module) : module_(module) {
    for (const auto& t : tensors()) saved_.push_back(t.detach().clone());
  }
  ~StateSnapshot() {
    torch::NoGradGuard no_grad;
    const auto now = tensors();
    for (std::size_t i = 0; i < now.size() && i < saved_.size(); ++i) now[i].copy_(saved_[i]);
  }
  StateSnapshot(const StateSnapshot&) = delete;
  StateSnapshot& operator=(const StateSnapshot&) = delete;

 private:
  std::vector<torch::Tensor> tensors() const {
    auto all = module_.parameters();
    for (auto& b : module_.buffers()) all.push_back(b);
    return all;
  }
  torch::nn::Module& module_;
  std::vector<torch::Tensor> saved_;
};

BatchChoice choiceOf(const worker::SearchResult& r) {
  BatchChoice c;
  c.per_gpu = r.chosen;
  c.accumulation = r.chosen_accum;
  c.global = r.chosen * r.chosen_accum * r.world_size;
  for (const auto& cand : r.candidates) {
    if (worker::isChosen(r, cand)) c.samples_per_s = cand.global_sps;
  }
  c.why = r.why;
  return c;
}

}  // namespace

BatchChoice searchBatch(DataParallel& dp, int64_t dataset_size, const StepFunction& step,
                        const Settings& settings) {
  auto& d = DataParallelAccess::of(dp);
  if (!step) throw std::invalid_argument(strCat(kSearch, ": the step function is empty"));
  const auto cfg = searchConfig(dataset_size, settings);
  const bool show = d.comm->rank() == 0 && cfg.train.progress != worker::ProgressMode::kOff;
  worker::Console console(show, worker::ProgressStyle::kLines);
  ProgramStepMeasurer measurer(d, step, cfg);
  const StateSnapshot state(*d.module);  // the trial steps do not reach the module
  try {
    worker::BatchSearch search(cfg, *d.comm, measurer, dataset_size, d.has_batchnorm,
                               [] { return launcher::stopSignal() != 0; });
    const auto result = search.run(&console);
    if (show) std::cout << worker::searchTable(result) << std::flush;
    return choiceOf(result);
  } catch (const worker::SearchStopped&) {
    BatchChoice stopped;
    stopped.stopped = true;
    return stopped;
  } catch (const ConfigError& e) {
    throw std::invalid_argument(e.what());  // its cfg.source names kSearch
  } catch (const Error& e) {
    throw std::runtime_error(strCat(kSearch, ": ", e.what()));
  }
}

}  // namespace batchdist
