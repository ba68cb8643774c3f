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
#include "worker/model/program_model.h"
#include "worker/search/output.h"
#include "worker/search/search.h"
#include "worker/train/step/step_timing.h"

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
        worker::recordFailure(e, out);
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
  auto cfg = ownLoopConfig(kSearch, n, settings);
  if (cfg.batch.global_auto) {
    invalidArgument(kSearch, "batch.global: auto is the launcher's run's alone; give a number or leave it unset");
  }
  if (worker::configLevers(cfg) != worker::Levers{}) {
    invalidArgument(kSearch, "dist.shard and model.recompute are the launcher's levers; the program's step has none");
  }
  return cfg;
}

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

/// The search itself; batchdist's errors as the public API's exceptions.
BatchChoice runSearch(DataParallelAccess::Impl& d, worker::Measurer& measurer,
                      const worker::Config& cfg, int64_t dataset_size) {
  const bool show = d.comm->rank() == 0 && cfg.train.progress != worker::ProgressMode::kOff;
  worker::Console console(show, worker::ProgressStyle::kLines);
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

}  // namespace

BatchChoice searchBatch(DataParallel& dp, int64_t dataset_size, const StepFunction& step,
                        const Settings& settings) {
  auto& d = DataParallelAccess::of(dp);
  if (!step) invalidArgument(kSearch, "the step function is empty");
  const auto cfg = searchConfig(dataset_size, settings);
  ProgramStepMeasurer measurer(d, step, cfg);
  // The trial steps do not reach the module: its state is put back, also after an error.
  const worker::ModuleSnapshot state(*d.module);
  BatchChoice choice;
  try {
    choice = runSearch(d, measurer, cfg, dataset_size);
  } catch (...) {
    state.restore(*d.module);
    throw;
  }
  state.restore(*d.module);
  return choice;
}

}  // namespace batchdist
