#include "worker/train/step/step_measurer.h"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <iostream>
#include <set>
#include <string>
#include <vector>

#include "collective/torch_compat.h"
#include "worker/common/util.h"
#include "worker/model/model.h"
#include "worker/plan/plan.h"
#include "worker/search/stats.h"
#include "common/error.h"
#include "worker/train/step/memory.h"
#include "worker/train/observe/profiler.h"
#include "worker/train/step/step_timing.h"
#include "worker/train/step/step_engine.h"

namespace batchdist::worker {
namespace {

namespace fs = std::filesystem;

class TrainStepMeasurer : public Measurer {
 public:
  TrainStepMeasurer(const Config& cfg, collective::Communicator& comm, const DataSplit& data,
                    at::Device device, const FaultPlan* faults, const SearchTraceOptions* trace)
      : cfg_(cfg), comm_(comm), data_(data), device_(device), faults_(faults),
        probe_(device, cfg.search) {
    if (trace) trace_ = *trace;
    has_bn_ = modelHasBatchNorm(cfg_.model, cfg_.base_dir);
    // Note [lever search]: auto levers start concrete (none, off); measure() rebuilds.
    Levers start = configLevers(cfg_);
    if (start.shard == Shard::kAuto) start.shard = Shard::kNone;
    if (start.recompute == Recompute::kAuto) start.recompute = Recompute::kOff;
    build(start);
  }

  double memoryBudgetMb() const override { return probe_.budgetMb(); }
  double loaderSamplesPerSecond() const override {
    const auto s = engine_->loader().stageSeconds();
    const double busy = s.read + s.decode + s.transform;
    return busy > 0 ? s.samples * std::max<int64_t>(1, engine_->loader().workers()) / busy : 0.0;
  }
  int64_t loaderWorkers() const override { return engine_->loader().workers(); }
  std::string deviceName() const override { return probe_.name(); }
  std::string recomputeUnsupported() const override {
    return worker::recomputeUnsupported(cfg_.model);
  }
  std::string parametersUnsupported() const override {
    const auto no = worker::parametersUnsupported(cfg_);
    return no.key.empty() ? "" : strCat(no.key, ": ", no.why);
  }
  double unitWorkingMb() const override {
    return static_cast<double>(unitWorkingBytes(engine_->model().units(),
                                                cfg_.dist.reshard_after_forward)) / (1 << 20);
  }

  Measurement measure(int64_t per_gpu, int64_t accum, const Levers& levers, const TimingRule& rule,
                      int64_t extra_warmup) override {
    Measurement out;
    if (levers != engine_->levers()) extra_warmup += switchLevers(levers);
    Config cfg = cfg_;  // the candidate's own batch settings
    cfg.batch.global = 0;
    cfg.batch.global_auto = false;
    cfg.batch.accum = accum;
    cfg.batch.adapt = BatchAdapt::kOff;  // a candidate's own plan: its G is not an adaptive start
    const auto plan = makePlan(cfg, comm_.size(), data_.train.size(), has_bn_, per_gpu);
    engine_->setPlan(plan);
    Sharder sharder(plan, static_cast<uint64_t>(cfg.train.seed));
    // Decoded sources: the batches made ahead while the last candidate ran are
    // used up before timing, so the timed steps see the loader's steady rate.
    // Note [search traces]: one more warm-up step, the traced one.
    const std::string trace = traceName(per_gpu, accum, levers);
    const int64_t warm = cfg.search.warmup_steps + extra_warmup + (trace.empty() ? 0 : 1) +
                         (cfg.data.decoded() ? (cfg.data.prefetch + accum - 1) / accum : 0);
    const auto profiler = trace.empty() ? nullptr : traceProfiler(trace, warm);
    // Every step the rule allows is queued (index lists only; the loader makes at
    // most `prefetch` batches ahead), so no check point drains the pipeline.
    queueSteps(sharder, warm + rule.max_steps);
    // Note [sync batchnorm]: measured without it, so that a rank running out of
    // memory mid-forward cannot strand the others in a BatchNorm allreduce.
    const LocalBatchNorm local_bn(engine_->model());
    CandidateRun run;
    run.warm = warm;
    run.samples_per_step = per_gpu * accum;
    run.decoded = cfg.data.decoded();
    run.step = [&](int64_t i, Measurement& m) {
      if (profiler && i < warm) return tracedStep(*profiler, sharder, i, warm, m);
      step(sharder, i, m);
    };
    run.after_warmup = [&] { engine_->takeTime(); };  // the warm-up's
    candidate_failed_ = false;
    timeCandidate(comm_, probe_, rule, run, out);
    const auto parts = engine_->update().memory();  // Note [memory by part]
    out.parts = {parts.parameters_mb, parts.gradients_mb, parts.optimizer_state_mb};
    {
      const auto t = engine_->takeTime();
      double timed = 0;
      for (const double x : out.step_seconds) timed += x;
      out.data_wait_fraction = timed > 0 ? std::min(1.0, t.data_wait / timed) : 0.0;
    }
    engine_->clearGradients();
    engine_->takeTime();
    probe_.emptyCache();
    return out;
  }

 private:
  /// Note [lever switch]: the search measures every lever combination (Note
  /// [lever search]) on one step engine and one model. Recompute is a flag of
  /// the model's forward (Model::setRecompute); another sharding needs only
  /// another update strategy (StepEngine::setLevers: the old gradients, optimizer
  /// state and hooks freed first, so they do not count in the new peak; the new
  /// state starts empty, as in a new engine). The parameters stay whatever the
  /// steps so far made of them, identical on every rank as every strategy keeps
  /// them, which a timing does not mind. The first step after a switch allocates
  /// the new state and learns the ready order (Note [ready order]): one more
  /// warm-up step. Rebuilding the engine (model, broadcast, loader) took two and
  /// a model build: in a GPT's joint search (bench/lever_search.sh) a dozen
  /// switches. A model that cannot switch recompute (never asked: the search
  /// weighs recompute only where the model has blocks) is rebuilt.
  /// Collective: every rank switches to the same levers (Note [search agreement]).
  /// Returns the extra warm-up steps the switch costs.
  int64_t switchLevers(const Levers& to) {
    if (engine_->setLevers(to)) return 1;
    build(to);
    return 2;  // a fresh model and optimizer: as cold as the first candidate
  }

  /// A throwaway step engine under `levers` (the training run starts from a
  /// fresh, identical model). Collective: every rank builds with the same levers
  /// in the same order (Note [search agreement]). The last one is gone first, so
  /// that its memory does not count in the new one's peak.
  void build(const Levers& levers) {
    engine_.reset();
    probe_.emptyCache();
    const auto first = makePlan(cfg_, comm_.size(), data_.train.size(), has_bn_,
                                std::max<int64_t>(2, cfg_.search.min));
    // Note [fault plan]: the search times the real step, slow reads and updates included.
    engine_ = std::make_unique<StepEngine>(cfg_, comm_, data_, device_, first, faults_, levers);
  }

  /// Note [search traces]: the candidate's trace directory the first time it is
  /// measured; "" after that, and without search.profile.
  std::string traceName(int64_t per_gpu, int64_t accum, const Levers& levers) {
    if (trace_.dir.empty()) return "";
    const std::string name = searchTraceName(per_gpu, accum, levers);
    return traced_.insert(name).second ? name : "";
  }

  /// A profiler that traces the last of `warm` warm-up steps and prepares in
  /// the one before it (shapes, memory and stacks as the profile section asks).
  std::unique_ptr<StepProfiler> traceProfiler(const std::string& name, int64_t warm) const {
    ProfileConfig p = cfg_.profile;
    p.wait = std::max<int64_t>(0, warm - 2);
    p.warmup = warm >= 2 ? 1 : 0;
    p.active = 1;
    return std::make_unique<StepProfiler>(p, (fs::path(trace_.dir) / name).string(), trace_.backend,
                                          comm_.rank(), comm_.size(), device_.is_cuda());
  }

  /// Warm-up step `i` of `warm` under `profiler` (Note [search traces]).
  void tracedStep(StepProfiler& profiler, const Sharder& sharder, int64_t i, int64_t warm,
                  Measurement& out) {
    profiler.beginStep(i + 1);
    step(sharder, i, out);
    if (profiler.endStep(/*last=*/i + 1 == warm)) {
      const ProfileOutcome& o = profiler.outcome();
      if (o.error.empty()) {
        out.trace = o.file;
      } else {  // this rank's own: every rank says it; the search goes on
        std::cerr << strCat("rank ", comm_.rank(), ": search profile: warning: ", o.error, "\n")
                  << std::flush;
      }
    }
  }

  /// Queues the first `count` steps of the sharder's epoch (cycling) on the loader.
  void queueSteps(const Sharder& sharder, int64_t count) {
    std::vector<MicroBatch> jobs;
    const int64_t per_epoch = engine_->plan().steps_per_epoch;
    for (int64_t i = 0; i < count; ++i) {
      for (auto& j : engine_->jobs(sharder, i % per_epoch, 1)) jobs.push_back(std::move(j));
    }
    engine_->loader().start(std::move(jobs), 0);
  }

  /// One training step; a rank that fails still joins the gradient sum (Note
  /// [search agreement]) and records the failure in `out`. It fails as a run's
  /// step does (the update strategy told first: under dist.shard: parameters it
  /// makes the unit collectives the others make, Note [collective replay]), and
  /// the step's side channel tells every rank, so that from then on no rank
  /// computes for this candidate (its collectives would meet nobody's).
  void step(const Sharder& sharder, int64_t i, Measurement& out) {
    const int64_t s = i % engine_->plan().steps_per_epoch;
    bool failed = false;
    if (!candidate_failed_) {
      double loss = 0;
      try {
        failed = engine_->computeOrCatch(sharder.realSamples(s), {}, &loss) != ComputeOutcome::kOk;
        if (failed) out.fail = FailKind::kOutOfMemory;
      } catch (const std::exception& e) {  // not an out-of-memory: this rank's error
        recordFailure(e, out);
        engine_->update().backwardFailed();
        failed = true;
      }
      if (failed) probe_.emptyCache();
    }
    bool any = failed;
    engine_->syncGradients(nullptr, nullptr, &any);
    if (any) candidate_failed_ = true;
    if (!candidate_failed_) engine_->applyUpdate(engine_->plan().lr);
  }

  const Config& cfg_;
  collective::Communicator& comm_;
  const DataSplit& data_;
  at::Device device_;
  const FaultPlan* faults_;
  DeviceProbe probe_;
  std::unique_ptr<StepEngine> engine_;  ///< Note [step engine]
  bool has_bn_ = false;
  bool candidate_failed_ = false;    ///< a step of this candidate failed on some rank
  SearchTraceOptions trace_;         ///< Note [search traces] (dir "": off)
  std::set<std::string> traced_;     ///< the candidates traced so far
};

}  // namespace

std::string searchTraceName(int64_t per_gpu, int64_t accum, const Levers& levers) {
  std::string name = strCat("per_gpu_", per_gpu);
  if (accum > 1) name += strCat("_accum_", accum);
  if (levers.shard != Shard::kNone) name += strCat("_shard_", toString(levers.shard));
  if (levers.recompute == Recompute::kOn) name += "_recompute_on";
  return name;
}

std::unique_ptr<Measurer> makeTrainStepMeasurer(const Config& cfg, collective::Communicator& comm,
                                                const DataSplit& data, at::Device device,
                                                const FaultPlan* faults,
                                                const SearchTraceOptions* trace) {
  return std::make_unique<TrainStepMeasurer>(cfg, comm, data, device, faults, trace);
}
}  // namespace batchdist::worker
