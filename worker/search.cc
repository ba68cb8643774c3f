#include "worker/search.h"

#include <torch/torch.h>
#include <yaml-cpp/yaml.h>

#include <malloc.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <iomanip>
#include <limits>
#include <sstream>

#include "collective/error.h"
#include "worker/util.h"
#include "collective/torch_compat.h"
#include "worker/json.h"
#include "worker/plan.h"
#include "worker/report.h"
#include "worker/trainer.h"

namespace batchdist::worker {
namespace {

/// Timed steps per rank the re-measuring phase may bring the search up to.
constexpr int64_t kStepBudget = 40;

std::string mb(double v) { return formatFixed(v, 0) + " MB"; }

}  // namespace

const char* toString(FailKind kind) {
  switch (kind) {
    case FailKind::kNone: return "ok";
    case FailKind::kOverBudget: return "over memory budget";
    case FailKind::kOutOfMemory: return "out of memory";
    case FailKind::kError: return "error";
  }
  return "?";
}

bool isOutOfMemory(const std::exception& e) {
  if (dynamic_cast<const c10::OutOfMemoryError*>(&e) != nullptr) return true;
  if (dynamic_cast<const std::bad_alloc*>(&e) != nullptr) return true;
  const std::string what = e.what();
  for (const char* needle : {"out of memory", "CUDNN_STATUS_NOT_SUPPORTED", "CUBLAS_STATUS_ALLOC_FAILED",
                             "CUDNN_STATUS_ALLOC_FAILED", "can't allocate memory"}) {
    if (what.find(needle) != std::string::npos) return true;
  }
  return false;
}

void resetPeakRss() {
  // Give freed heap back first, so the new peak is not masked by (or charged
  // for) what an earlier candidate left behind.
  malloc_trim(0);
  // Linux >= 4.0: writing 5 to clear_refs resets VmHWM to the current RSS.
  std::ofstream("/proc/self/clear_refs") << "5";
}

double peakRssMb() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmHWM:", 0) == 0) return std::atof(line.c_str() + 6) / 1024.0;
  }
  return 0;
}

// ---------------------------------------------------------------------------
// Selection.

const Candidate& chooseCandidate(const std::vector<Candidate>& candidates,
                                 const std::string& objective, double tolerance,
                                 std::string* why) {
  const Candidate* best = nullptr;
  const Candidate* largest = nullptr;
  for (const auto& c : candidates) {
    if (c.failed) continue;
    if (!best || c.global_sps > best->global_sps) best = &c;
    if (!largest || c.per_gpu > largest->per_gpu) largest = &c;
  }
  if (!best) {
    const Candidate* smallest = nullptr;
    for (const auto& c : candidates) {
      if (!smallest || c.per_gpu < smallest->per_gpu) smallest = &c;
    }
    if (!smallest) throw Error("batch search: no candidate was tried (search.min > search.max?)");
    throw Error(strCat("batch search: no per-GPU batch fits; the smallest tried, ",
                       smallest->per_gpu, ", failed: ", smallest->reason, " (peak ",
                       mb(smallest->peak_mb),
                       "). Lower search.min, use a smaller model, fp16/bf16, or more memory "
                       "(search.memory_limit_mb / search.memory_fraction)"));
  }
  if (objective == "max_fit") {
    if (why) *why = strCat("the largest per-GPU batch that fits on every rank");
    return *largest;
  }
  const Candidate* pick = best;
  for (const auto& c : candidates) {
    if (!c.failed && c.global_sps >= (1.0 - tolerance) * best->global_sps &&
        c.per_gpu < pick->per_gpu) {
      pick = &c;
    }
  }
  if (why) {
    *why = pick == best
               ? strCat("the highest throughput measured (", formatFixed(best->global_sps, 0),
                        " samples/s)")
               : strCat("the smallest within ", formatFixed(100 * tolerance, 0),
                        " % of the best throughput (", formatFixed(best->global_sps, 0),
                        " samples/s at per-GPU ", best->per_gpu, "): ",
                        formatFixed(pick->global_sps, 0), " samples/s");
  }
  return *pick;
}

// ---------------------------------------------------------------------------
// The walk.

BatchSearch::BatchSearch(const Config& cfg, collective::Communicator& comm, Measurer& measurer,
                         int64_t train_size, bool has_batchnorm)
    : cfg_(cfg), comm_(comm), measurer_(measurer), train_size_(train_size), has_bn_(has_batchnorm) {}

Candidate BatchSearch::agree(int64_t per_gpu, int64_t accum, const Measurement& m) {
  const int64_t W = comm_.size();
  const bool failed = m.fail != FailKind::kNone;
  // One fixed collective per candidate: MAX of [kind, failing rank, peak, sps, -sps].
  const auto v = comm_.allreduce(
      {static_cast<double>(m.fail), failed ? static_cast<double>(comm_.rank()) : -1.0, m.peak_mb,
       failed ? 0.0 : m.samples_per_s,
       failed ? -std::numeric_limits<double>::max() / 4 : -m.samples_per_s},
      collective::ReduceOp::kMax);
  Candidate c;
  c.rank_peak_mb = comm_.allgather(m.peak_mb);
  c.per_gpu = per_gpu;
  c.accum = accum;
  c.global = per_gpu * accum * W;
  const auto kind = static_cast<FailKind>(static_cast<int>(v[0]));
  c.failed = kind != FailKind::kNone;
  c.peak_mb = v[2];
  if (kind == FailKind::kError) {
    // A real bug, not a size limit: every rank stops (the failing one names it).
    throw TrainingError(strCat("batch search: per-GPU batch ", per_gpu, " failed on rank ",
                               static_cast<int>(v[1]), m.detail.empty() ? "" : ": " + m.detail));
  }
  if (c.failed) {
    c.reason = strCat(toString(kind), " on rank ", static_cast<int>(v[1]));
    if (kind == FailKind::kOverBudget) {
      c.reason += strCat(" (peak ", mb(c.peak_mb), " > budget)");
    }
  } else {
    c.max_rank_sps = v[3];
    c.min_rank_sps = -v[4];
    c.global_sps = c.min_rank_sps * W;  // the slowest rank sets the pace
  }
  return c;
}

SearchResult BatchSearch::run(Console* console) {
  const auto& s = cfg_.search;
  const int64_t W = comm_.size();
  const double t0 = monotonicSeconds();
  SearchResult r;
  r.objective = s.objective;
  r.tolerance = s.tolerance;
  r.world_size = W;
  r.device = measurer_.deviceName();
  const auto budgets = comm_.allgather(measurer_.memoryBudgetMb());
  r.memory_budget_mb = 0;
  for (double b : budgets) {
    if (b > 0 && (r.memory_budget_mb == 0 || b < r.memory_budget_mb)) r.memory_budget_mb = b;
  }

  // Allowed per-GPU sizes. Fixed global batch: divisors of G/W (accumulation
  // derived). Otherwise any size; accumulation as configured (default 1).
  const bool fixed_global = cfg_.batch.global > 0 && !cfg_.batch.global_auto;
  int64_t share = 0;
  if (fixed_global) {
    if (cfg_.batch.global % W != 0) {
      throw ConfigError(strCat(cfg_.source, ": batch.global=", cfg_.batch.global,
                               " is not divisible by world size ", W, "; use ",
                               cfg_.batch.global / W * W, " or ", (cfg_.batch.global / W + 1) * W));
    }
    share = cfg_.batch.global / W;
  }
  const int64_t fixed_accum = cfg_.batch.accum > 0 ? cfg_.batch.accum : 1;
  const int64_t lo = std::max(s.min, has_bn_ ? cfg_.batch.min_per_gpu : int64_t{1});
  int64_t hi = s.max > 0 ? s.max : std::numeric_limits<int64_t>::max() / 4;
  // Under drop, a global batch larger than the training set has no step at all.
  const int64_t data_cap = cfg_.batch.last_batch == LastBatch::kDrop
                               ? train_size_ / (W * (fixed_global ? 1 : fixed_accum))
                               : std::numeric_limits<int64_t>::max() / 4;
  if (!fixed_global) hi = std::min(hi, data_cap);
  auto allowed = [&](int64_t m) {
    if (m < lo || m > hi) return false;
    return fixed_global ? share % m == 0 : true;
  };
  auto accumFor = [&](int64_t m) { return fixed_global ? share / m : fixed_accum; };
  auto firstAllowedFrom = [&](int64_t from) -> int64_t {
    if (fixed_global) {
      for (int64_t m = std::max(from, lo); m <= std::min(hi, share); ++m) {
        if (allowed(m)) return m;
      }
      return 0;
    }
    return from <= hi ? std::max(from, lo) : 0;
  };
  auto between = [&](int64_t a, int64_t b) {
    std::vector<int64_t> out;
    for (int64_t m = a + 1; m < b; ++m) {
      if (allowed(m) && (fixed_global || m % s.multiple_of == 0)) out.push_back(m);
    }
    return out;
  };

  if (console) {
    console->line(strCat("batch search: ", W, " rank(s) on ", r.device, ", objective ",
                         s.objective, ", per-GPU from ", lo,
                         fixed_global ? strCat(" dividing ", share, " (batch.global ",
                                               cfg_.batch.global, ")")
                                      : std::string(),
                         r.memory_budget_mb > 0 ? ", memory budget " + mb(r.memory_budget_mb)
                                                : std::string(", no memory budget")));
  }

  auto measureOne = [&](int64_t m) -> const Candidate& {
    const int64_t a = accumFor(m);
    // The first candidate also pays for a cold process (allocator, thread pools).
    const auto local = measurer_.measure(m, a, r.candidates.empty() ? s.warmup_steps + 2 : 0);
    r.timed_steps += local.timed_steps;
    r.candidates.push_back(agree(m, a, local));
    const auto& c = r.candidates.back();
    if (console) {
      console->line(strCat("  per-GPU ", m, " x accum ", a, ": ",
                           c.failed ? "FAILED " + c.reason
                                    : formatFixed(c.global_sps, 0) + " samples/s, peak " +
                                          mb(c.peak_mb)));
    }
    return c;
  };

  // Phase 1: double from the minimum up to the first failure, the cap, or (for
  // the throughput objective) a plateau of two doublings without a gain.
  int64_t last_ok = 0;
  int64_t first_fail = 0;
  double best = 0;
  int flat = 0;
  for (int64_t m = firstAllowedFrom(lo); m != 0;) {
    const auto& c = measureOne(m);
    if (c.failed) {
      first_fail = m;
      break;
    }
    last_ok = m;
    flat = c.global_sps > best * (1.0 + s.tolerance) ? 0 : flat + 1;
    best = std::max(best, c.global_sps);
    if (s.objective == "throughput" && flat >= 2) break;
    m = firstAllowedFrom(2 * m);
  }
  // Phase 2: binary search between the last success and the first failure, if
  // the boundary can matter (max_fit, or throughput still rising at last_ok).
  if (last_ok > 0 && first_fail > 0) {
    const Candidate* ok = nullptr;
    for (const auto& c : r.candidates) {
      if (c.per_gpu == last_ok) ok = &c;
    }
    const bool worth = s.objective == "max_fit" || (ok && ok->global_sps >= (1.0 - s.tolerance) * best);
    while (worth) {
      const auto inside = between(last_ok, first_fail);
      if (inside.empty()) break;
      const int64_t mid = inside[inside.size() / 2];
      const auto& c = measureOne(mid);
      if (c.failed) {
        first_fail = mid;
      } else {
        last_ok = mid;
      }
    }
  }

  // Phase 3 (throughput): the best of several noisy measurements is biased
  // upwards, so the contenders near the top are measured once more and their
  // two measurements averaged before the rule picks. Bounded by the step budget.
  if (s.objective == "throughput") {
    std::vector<std::size_t> contenders;
    for (std::size_t i = 0; i < r.candidates.size(); ++i) {
      const auto& c = r.candidates[i];
      if (!c.failed && c.global_sps >= (1.0 - 2 * s.tolerance - 0.1) * best) contenders.push_back(i);
    }
    std::sort(contenders.begin(), contenders.end(), [&](std::size_t a, std::size_t b) {
      return r.candidates[a].global_sps > r.candidates[b].global_sps;
    });
    const int64_t room = (kStepBudget - r.timed_steps) / std::max<int64_t>(1, s.timed_steps);
    contenders.resize(std::min<std::size_t>(contenders.size(), std::max<int64_t>(0, std::min<int64_t>(room, 4))));
    if (contenders.size() >= 2) {
      for (auto i : contenders) {
        const int64_t m = r.candidates[i].per_gpu;
        const auto local = measurer_.measure(m, r.candidates[i].accum, 0);
        r.timed_steps += local.timed_steps;
        const auto again = agree(m, r.candidates[i].accum, local);
        auto& c = r.candidates[i];
        if (again.failed) {
          c = again;  // failed now: it does not fit reliably
        } else {
          c.global_sps = 0.5 * (c.global_sps + again.global_sps);
          c.min_rank_sps = std::min(c.min_rank_sps, again.min_rank_sps);
          c.max_rank_sps = std::max(c.max_rank_sps, again.max_rank_sps);
          c.peak_mb = std::max(c.peak_mb, again.peak_mb);
          for (std::size_t k = 0; k < c.rank_peak_mb.size() && k < again.rank_peak_mb.size(); ++k) {
            c.rank_peak_mb[k] = std::max(c.rank_peak_mb[k], again.rank_peak_mb[k]);
          }
          c.measurements = 2;
        }
        if (console) {
          console->line(strCat("  per-GPU ", m, " re-measured: ",
                               c.failed ? "FAILED " + c.reason
                                        : formatFixed(again.global_sps, 0) + " samples/s (mean " +
                                              formatFixed(c.global_sps, 0) + ")"));
        }
      }
    }
  }

  const auto& pick = chooseCandidate(r.candidates, s.objective, s.tolerance, &r.why);
  r.chosen = pick.per_gpu;
  r.chosen_accum = pick.accum;
  r.seconds = monotonicSeconds() - t0;
  return r;
}

// ---------------------------------------------------------------------------
// The real measurer.

namespace {

class TrainStepMeasurer : public Measurer {
 public:
  TrainStepMeasurer(const Config& cfg, collective::Communicator& comm, const DataSplit& data,
                    at::Device device, const std::string& base_dir)
      : cfg_(cfg), comm_(comm), data_(data), device_(device) {
    // A throwaway model: the training run starts from a fresh, identical one.
    has_bn_ = modelHasBatchNorm(cfg_.model, base_dir);
    const auto first = makePlan(cfg_, comm_.size(), data_.train.size(), has_bn_,
                                std::max<int64_t>(2, cfg_.search.min));
    trainer_ = std::make_unique<Trainer>(cfg_, comm_, data_, device_, first, base_dir);
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
                                                const DataSplit& data, at::Device device,
                                                const std::string& base_dir) {
  return std::make_unique<TrainStepMeasurer>(cfg, comm, data, device, base_dir);
}

// ---------------------------------------------------------------------------
// Output.

std::string searchJson(const SearchResult& r) {
  std::vector<std::string> cands;
  for (const auto& c : r.candidates) {
    json::Object o;
    o.add("per_gpu_batch", c.per_gpu)
        .add("accum_steps", c.accum)
        .add("global_batch", c.global)
        .add("failed", c.failed)
        .add("reason", c.reason)
        .add("samples_per_s", c.global_sps)
        .add("rank_samples_per_s_min", c.min_rank_sps)
        .add("rank_samples_per_s_max", c.max_rank_sps)
        .add("peak_memory_mb", c.peak_mb)
        .raw("rank_peak_memory_mb", [&] {
          std::vector<std::string> v;
          for (double p : c.rank_peak_mb) v.push_back(json::number(p));
          return json::array(v);
        }())
        .add("measurements", c.measurements)
        .add("chosen", c.per_gpu == r.chosen);
    cands.push_back(o.str());
  }
  return json::Object()
      .add("chosen", r.chosen)
      .add("chosen_accum", r.chosen_accum)
      .add("why", r.why)
      .add("cached", r.cached)
      .add("objective", r.objective)
      .add("tolerance", r.tolerance)
      .add("memory_budget_mb", r.memory_budget_mb)
      .add("device", r.device)
      .add("world_size", r.world_size)
      .add("timed_steps", r.timed_steps)
      .add("seconds", r.seconds)
      .raw("candidates", json::array(cands))
      .str();
}

std::string searchTable(const SearchResult& r) {
  std::ostringstream os;
  os << "  per-GPU  accum  global   samples/s   rank min..max samples/s   peak MB  result\n";
  for (const auto& c : r.candidates) {
    char line[256];
    std::snprintf(line, sizeof line, "  %7lld  %5lld  %6lld  %10.0f   %10.0f..%-10.0f  %8.0f  %s%s\n",
                  static_cast<long long>(c.per_gpu), static_cast<long long>(c.accum),
                  static_cast<long long>(c.global), c.global_sps, c.min_rank_sps, c.max_rank_sps,
                  c.peak_mb, c.failed ? c.reason.c_str() : "ok",
                  c.per_gpu == r.chosen ? "  <- chosen" : "");
    os << line;
  }
  os << "  chosen per-GPU batch " << r.chosen << " x accum " << r.chosen_accum << ": " << r.why
     << (r.cached ? " [cached]" : "") << "\n";
  return os.str();
}

std::string searchSvg(const SearchResult& r) {
  const double W = 720, H = 420, L = 70, R = 70, T = 40, B = 50;
  double xmin = 1e300, xmax = 0, smax = 1, mmax = std::max(1.0, r.memory_budget_mb);
  for (const auto& c : r.candidates) {
    xmin = std::min(xmin, std::log2(static_cast<double>(c.per_gpu)));
    xmax = std::max(xmax, std::log2(static_cast<double>(c.per_gpu)));
    smax = std::max(smax, c.global_sps);
    mmax = std::max(mmax, c.peak_mb);
  }
  if (r.candidates.empty()) xmin = 0, xmax = 1;
  if (xmax - xmin < 1e-9) xmin -= 0.5, xmax += 0.5;
  auto X = [&](int64_t m) {
    return L + (std::log2(static_cast<double>(m)) - xmin) / (xmax - xmin) * (W - L - R);
  };
  auto Ys = [&](double v) { return H - B - v / (smax * 1.1) * (H - T - B); };
  auto Ym = [&](double v) { return H - B - v / (mmax * 1.1) * (H - T - B); };
  std::ostringstream os;
  os << std::fixed << std::setprecision(1);
  os << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << W << "\" height=\"" << H
     << "\" font-family=\"sans-serif\" font-size=\"12\">\n"
     << "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
     << "<text x=\"" << W / 2 << "\" y=\"20\" text-anchor=\"middle\" font-size=\"14\">batch search: "
     << r.world_size << " rank(s), " << r.device << ", objective " << r.objective << "</text>\n"
     << "<line x1=\"" << L << "\" y1=\"" << H - B << "\" x2=\"" << W - R << "\" y2=\"" << H - B
     << "\" stroke=\"black\"/>\n"
     << "<line x1=\"" << L << "\" y1=\"" << T << "\" x2=\"" << L << "\" y2=\"" << H - B
     << "\" stroke=\"#1f77b4\"/>\n"
     << "<line x1=\"" << W - R << "\" y1=\"" << T << "\" x2=\"" << W - R << "\" y2=\"" << H - B
     << "\" stroke=\"#d62728\"/>\n"
     << "<text x=\"" << W / 2 << "\" y=\"" << H - 12
     << "\" text-anchor=\"middle\">per-GPU batch (log scale)</text>\n"
     << "<text x=\"16\" y=\"" << H / 2 << "\" transform=\"rotate(-90 16 " << H / 2
     << ")\" text-anchor=\"middle\" fill=\"#1f77b4\">samples/s (all ranks)</text>\n"
     << "<text x=\"" << W - 14 << "\" y=\"" << H / 2 << "\" transform=\"rotate(90 " << W - 14 << " "
     << H / 2 << ")\" text-anchor=\"middle\" fill=\"#d62728\">peak memory (MB)</text>\n"
     << "<text x=\"" << L - 6 << "\" y=\"" << Ys(smax) << "\" text-anchor=\"end\" fill=\"#1f77b4\">"
     << std::setprecision(0) << smax << "</text>\n"
     << "<text x=\"" << W - R + 6 << "\" y=\"" << Ym(mmax) << "\" fill=\"#d62728\">" << mmax
     << "</text>\n"
     << std::setprecision(1);
  auto sorted = r.candidates;
  std::sort(sorted.begin(), sorted.end(),
            [](const Candidate& a, const Candidate& b) { return a.per_gpu < b.per_gpu; });
  std::string sps_pts, mem_pts;
  double last_label = -1e9;
  for (const auto& c : sorted) {
    if (X(c.per_gpu) - last_label >= 30) {  // labels of clustered sizes would overlap
      os << "<text x=\"" << X(c.per_gpu) << "\" y=\"" << H - B + 16
         << "\" text-anchor=\"middle\">" << c.per_gpu << "</text>\n";
      last_label = X(c.per_gpu);
    }
    if (c.failed) {
      os << "<text x=\"" << X(c.per_gpu) << "\" y=\"" << H - B - 4
         << "\" text-anchor=\"middle\" fill=\"#d62728\" font-weight=\"bold\">x<title>" << c.reason
         << "</title></text>\n";
      continue;
    }
    sps_pts += strCat(X(c.per_gpu), ",", Ys(c.global_sps), " ");
    if (c.peak_mb > 0) mem_pts += strCat(X(c.per_gpu), ",", Ym(c.peak_mb), " ");
    os << "<circle cx=\"" << X(c.per_gpu) << "\" cy=\"" << Ys(c.global_sps)
       << "\" r=\"3\" fill=\"#1f77b4\"/>\n";
    if (c.peak_mb > 0) {
      os << "<rect x=\"" << X(c.per_gpu) - 3 << "\" y=\"" << Ym(c.peak_mb) - 3
         << "\" width=\"6\" height=\"6\" fill=\"#d62728\"/>\n";
    }
  }
  os << "<polyline points=\"" << sps_pts << "\" fill=\"none\" stroke=\"#1f77b4\" stroke-width=\"2\"/>\n";
  if (!mem_pts.empty()) {
    os << "<polyline points=\"" << mem_pts
       << "\" fill=\"none\" stroke=\"#d62728\" stroke-width=\"1.5\"/>\n";
  }
  if (r.memory_budget_mb > 0) {
    os << "<line x1=\"" << L << "\" y1=\"" << Ym(r.memory_budget_mb) << "\" x2=\"" << W - R
       << "\" y2=\"" << Ym(r.memory_budget_mb)
       << "\" stroke=\"#d62728\" stroke-dasharray=\"6,4\"/>\n"
       << "<text x=\"" << L + 4 << "\" y=\"" << Ym(r.memory_budget_mb) - 4
       << "\" fill=\"#d62728\">memory budget " << std::setprecision(0) << r.memory_budget_mb
       << " MB</text>\n"
       << std::setprecision(1);
  }
  for (const auto& c : sorted) {
    if (c.per_gpu != r.chosen || c.failed) continue;
    os << "<circle cx=\"" << X(c.per_gpu) << "\" cy=\"" << Ys(c.global_sps)
       << "\" r=\"8\" fill=\"none\" stroke=\"green\" stroke-width=\"2.5\"/>\n"
       << "<text x=\"" << X(c.per_gpu) << "\" y=\"" << Ys(c.global_sps) - 12
       << "\" text-anchor=\"middle\" fill=\"green\">chosen: " << c.per_gpu << "</text>\n";
  }
  os << "</svg>\n";
  return os.str();
}

// ---------------------------------------------------------------------------
// Cache.

std::string searchCacheKey(const Config& cfg, const DataInfo& data, int64_t world,
                           const std::string& device, const std::vector<double>& budgets) {
  // The resolved model/optim/search/batch sections plus what the machine adds.
  std::string sections;
  for (const auto& [path, value] : cfg.resolved) {
    const auto section = path.substr(0, path.find('.'));
    if (section == "model" || section == "optim" || section == "search" || section == "batch") {
      if (path == "search.cache" || path == "batch.per_gpu") continue;
      sections += path + "=" + value + ";";
    }
  }
  std::string shape;
  for (auto d : data.sample_shape) shape += std::to_string(d) + "x";
  std::string b;
  for (double v : budgets) b += formatFixed(v, 0) + ",";
  return strCat(sections, "data.shape=", shape, ";data.classes=", data.classes,
                ";data.train=", data.train_size, ";precision=", cfg.train.precision,
                ";transform=", cfg.data.resize, ";device=", device,
                ";world=", world, ";budgets=", b, ";torch=", compat::torchVersion());
}

std::optional<SearchResult> readSearchCache(const std::string& path, const std::string& key) {
  YAML::Node root;
  try {
    root = YAML::LoadFile(path);
  } catch (const std::exception&) {
    return std::nullopt;  // missing or unreadable: search again
  }
  try {
    if (!root["key"] || root["key"].as<std::string>() != key) return std::nullopt;
    const auto res = root["result"];
    SearchResult r;
    r.chosen = res["chosen"].as<int64_t>();
    r.chosen_accum = res["chosen_accum"].as<int64_t>();
    r.why = res["why"].as<std::string>();
    r.objective = res["objective"].as<std::string>();
    r.tolerance = res["tolerance"].as<double>();
    r.memory_budget_mb = res["memory_budget_mb"].as<double>();
    r.device = res["device"].as<std::string>();
    r.world_size = res["world_size"].as<int64_t>();
    r.timed_steps = 0;  // none this run
    for (const auto& c : res["candidates"]) {
      Candidate k;
      k.per_gpu = c["per_gpu_batch"].as<int64_t>();
      k.accum = c["accum_steps"].as<int64_t>();
      k.global = c["global_batch"].as<int64_t>();
      k.failed = c["failed"].as<bool>();
      k.reason = c["reason"].as<std::string>();
      k.global_sps = c["samples_per_s"].as<double>();
      k.min_rank_sps = c["rank_samples_per_s_min"].as<double>();
      k.max_rank_sps = c["rank_samples_per_s_max"].as<double>();
      k.peak_mb = c["peak_memory_mb"].as<double>();
      if (c["measurements"]) k.measurements = c["measurements"].as<int64_t>();
      if (c["rank_peak_memory_mb"]) {
        for (const auto& v : c["rank_peak_memory_mb"]) k.rank_peak_mb.push_back(v.as<double>());
      }
      r.candidates.push_back(k);
    }
    r.cached = true;
    return r;
  } catch (const std::exception&) {
    return std::nullopt;  // a damaged cache is not an error: search again
  }
}

void writeSearchCache(const std::string& path, const std::string& key, const SearchResult& r) {
  writeFileAtomic(path, json::Object().add("key", key).raw("result", searchJson(r)).str() + "\n");
}

}  // namespace batchdist::worker
