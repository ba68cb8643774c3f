#include "worker/report/diagnose.h"

#include <cmath>
#include <cstdio>
#include <algorithm>
#include <optional>

#include "common/error.h"
#include "worker/common/console.h"
#include "worker/model/model.h"
#include "worker/plan/adapt.h"

namespace batchdist::worker {
namespace {

double pct(double part, double whole) { return whole > 0 ? 100.0 * part / whole : 0.0; }

/// Note [gradient noise scale] (worker/train/step/noise_scale.h): a global batch B
/// needs about (1 + B / B_noise) times the minimal number of samples, so at B = 4
/// B_simple samples cost 2.5x what they cost at B_simple (5 vs 2).
constexpr double kFarAbove = 4.0;

/// The advice never names a global batch the training set cannot take: at most
/// dataCeiling(N, batch.adapt_min_steps) (Note [goodput] in worker/plan/adapt.h),
/// so that an epoch keeps that many steps. B_simple can exceed it on a small data
/// set (digits: ~1720 for 1438 training samples).
struct BatchAdvice {
  int64_t target = 0;   ///< the global batch to move toward: B_simple, capped; at least 1
  std::string cap_note; ///< why it is below B_simple, or empty
};

BatchAdvice advice(double b, int64_t n, int64_t min_steps) {
  BatchAdvice a;
  a.target = std::max<int64_t>(1, std::llround(b));  // B_simple < 0.5 is no batch of 0
  const int64_t cap = dataCeiling(n, min_steps);
  if (cap > 0 && cap < a.target) {
    a.target = cap;
    a.cap_note = strCat(" (B_simple capped by the data: ", n, " training samples / ", min_steps,
                        " steps an epoch, batch.adapt_min_steps)");
  }
  return a;
}

/// Note [tokens per sample] (worker/plan/plan.h): the numbers of the noise-scale
/// finding in tokens beside samples, when the samples are token windows; every
/// text is "" otherwise, so the finding reads exactly as without tokens.
struct TokenTexts {
  int64_t per_sample = 0;
  /// " (2048 tokens)" after a global batch of `samples`.
  std::string batch(int64_t samples) const {
    return per_sample > 0 ? strCat(" (", samples * per_sample, " tokens)") : "";
  }
  /// "15 tokens, " inside B_simple's parenthesis, before when it was measured.
  std::string inside(double b) const {
    return per_sample > 0 ? strCat(noiseScaleText(b * static_cast<double>(per_sample)), " tokens, ")
                          : "";
  }
};

/// Where the advice moves the global batch: "batch.global toward 60" (with its
/// tokens), or, when the batch was given in tokens (Note [global tokens]), the key
/// the user wrote: "batch.global_tokens toward 3840 (global batch 60)".
std::string lowerTo(const Config& cfg, const BatchAdvice& a, const TokenTexts& t) {
  if (t.per_sample > 0 && cfg.batch.global_tokens > 0) {
    return strCat("batch.global_tokens toward ", a.target * t.per_sample, " (global batch ",
                  a.target, ")", a.cap_note);
  }
  return strCat("batch.global toward ", a.target, t.batch(a.target), a.cap_note);
}

/// |G|^2 came out <= 0: B_simple is beyond what global batch G resolves.
std::string tooLargeFinding(const TrainResult& r, int64_t n, int64_t min_steps,
                            const TokenTexts& t) {
  const int64_t cap = dataCeiling(n, min_steps);
  const std::string at = strCat(r.noise.b_big, t.batch(r.noise.b_big));
  if (cap > 0 && r.noise.b_big >= cap) {
    return strCat("noise scale: too large to measure at global batch ", at,
                  " (the smoothed |G|^2 estimate is not positive: the gradient is small next "
                  "to its noise), but the ", n, " training samples allow no larger batch with ",
                  min_steps, " steps an epoch (batch.adapt_min_steps); the data, not the "
                  "batch, limits the steps saved");
  }
  return strCat("noise scale: too large to measure at global batch ", at,
                " (the smoothed |G|^2 estimate is not positive: the gradient is small next to "
                "its noise), so B_simple is far above it; a larger global batch (more ranks, a "
                "larger per-GPU batch or batch.accum",
                cap > 0 ? strCat(", up to ", cap, t.batch(cap), " for ", n,
                                 " training samples at ", min_steps, " steps an epoch")
                        : std::string(),
                ") would take fewer steps for nearly the same number of samples");
}

std::optional<std::string> noiseFinding(const Config& cfg, const TrainResult& r, int64_t n,
                                        const TokenTexts& t) {
  double b = -1;
  std::string when = "last epoch";
  if (!r.history.empty() && r.history.back().noise_scale > 0) {
    b = r.history.back().noise_scale;
  } else if (r.noise.b_simple > 0) {
    b = r.noise.b_simple;
    when = "smoothed";
  }
  const int64_t min_steps = cfg.batch.adapt_min_steps;
  const int64_t cap = dataCeiling(n, min_steps);
  if (b <= 0 && r.noise.measured && r.noise.grad_sq <= 0 && r.noise.trace > 0) {
    return tooLargeFinding(r, n, min_steps, t);
  }
  if (b <= 0 || r.noise.b_big <= 0) return std::nullopt;
  const double g = static_cast<double>(r.noise.b_big);
  const std::string bs = noiseScaleText(b);
  const std::string global = strCat(r.noise.b_big, t.batch(r.noise.b_big));
  const std::string scale = strCat(bs, " (", t.inside(b), when, ")");
  const auto a = advice(b, n, min_steps);
  if (g >= kFarAbove * b) {
    return strCat("noise scale: the global batch ", global, " is ", formatFixed(g / b, 1),
                  "x the gradient noise scale B_simple ~ ", scale,
                  "; samples are being wasted: far above it a step gains little from more "
                  "samples, so reaching the same loss takes about (1 + ", r.noise.b_big, "/", bs,
                  ") / 2 = ", formatFixed((1 + g / b) / 2, 1),
                  "x the epochs of a global batch near ", bs,
                  " (McCandlish et al. 2018); lower ", lowerTo(cfg, a, t),
                  " (fewer ranks or a smaller per-GPU batch), or train more epochs");
  }
  if (g * kFarAbove <= b) {
    if (cap > 0 && r.noise.b_big >= cap) {
      return strCat("noise scale: the global batch ", global,
                    " is well below the gradient noise scale B_simple ~ ", scale,
                    ", but the ", n, " training samples allow no larger batch with ", min_steps,
                    " steps an epoch (batch.adapt_min_steps); the data, not the batch, limits the "
                    "steps saved");
    }
    return strCat("noise scale: the global batch ", global,
                  " is well below the gradient noise scale B_simple ~ ", scale,
                  "; a larger global batch, toward ", a.target, t.batch(a.target), a.cap_note,
                  " (more ranks, a larger per-GPU batch or batch.accum), would take fewer steps "
                  "for nearly the same number of samples");
  }
  return std::nullopt;
}


// Note [system diagnosis]
// ~~~~~~~~~~~~~~~~~~~~~~~
// The rules the batch-size guides state in words, with numbers, over every
// rank's run summary (Note [system metrics]); each names the rank it rests on:
//   input-bound       the step waits for batches > 10 % of its time (the `data:`
//                     finding); the loader threads busy >= 90 % of theirs: they
//                     are the limit (more threads, unless the host's CPUs are
//                     >= 90 % busy: then fewer or cheaper transforms), < 50 %:
//                     they are not (prefetch, or slow storage)
//   GPU idle          mean GPU utilisation < 70 %: input-bound when data > 10 %,
//                     communication-bound when the allreduce > 30 %, else
//                     launch- or code-bound ("GPU low and CPU low: the code"),
//                     where a training process at >= 90 % of a core is one thread
//                     launching kernels as fast as it can
//   memory headroom   NVML's memory used at most < 80 % of the GPU's (the guides
//                     fill 80-90 %); without NVML, the allocator's peak < 50 %
//   throttling        the clocks held down by a power reason, or a thermal one,
//                     in > 5 % of a rank's samples
//   low MFU           on a GPU, MFU (Note [mfu]) < 30 %, the low end of what eager
//                     PyTorch training reaches (30-45 %); the CPU's yardstick is a
//                     measured GEMM, not a hardware peak, so no finding there
constexpr double kInputBoundPct = 10, kCommBoundPct = 30, kGpuIdlePct = 70;
constexpr double kLoaderSaturated = 0.9, kLoaderIdle = 0.5, kHostSaturatedPct = 90;
constexpr double kLaunchBoundCorePct = 90, kMemoryTargetPct = 80, kThrottledShare = 0.05;
constexpr double kLowMfu = 0.30;

/// The rank whose run value of `m` is the lowest (highest: `highest`); nullptr
/// when no rank read it.
const RankSystem* extreme(const TrainResult& r, SystemMetric m, bool highest) {
  const RankSystem* best = nullptr;
  for (const auto& x : r.system) {
    if (!x.run.has(m)) continue;
    if (!best || (highest ? x.run.get(m) > best->run.get(m) : x.run.get(m) < best->run.get(m))) {
      best = &x;
    }
  }
  return best;
}

std::string rankText(const RankSystem& x) { return strCat("rank ", x.rank, " on ", x.host); }

/// The loader's clause of the `data:` finding (Note [system diagnosis]).
std::string loaderClause(const Config& cfg, const TrainResult& r) {
  const RankSystem* busy = extreme(r, SystemMetric::kLoaderBusy, /*highest=*/true);
  if (!busy) return "";
  const double b = 100 * busy->run.get(SystemMetric::kLoaderBusy);
  const RankSystem* host = extreme(r, SystemMetric::kCpuHostPct, true);
  if (b >= 100 * kLoaderSaturated) {
    if (host && host->run.get(SystemMetric::kCpuHostPct) >= kHostSaturatedPct) {
      return strCat("; the loader threads were busy ", formatFixed(b, 0), " % of the time (",
                    rankText(*busy), ") and the host's CPUs ",
                    formatFixed(host->run.get(SystemMetric::kCpuHostPct), 0),
                    " %: the host has no CPU left for more threads; cheaper transforms, "
                    "preprocessing offline, or more CPUs per GPU");
    }
    return strCat("; the loader threads were busy ", formatFixed(b, 0), " % of the time (",
                  rankText(*busy), "): they are the limit; raise data.workers (now ",
                  cfg.data.workers, ")");
  }
  if (b < 100 * kLoaderIdle) {
    return strCat("; the loader threads were busy only ", formatFixed(b, 0), " % (",
                  rankText(*busy), "): not their CPU; raise data.prefetch (now ",
                  cfg.data.prefetch, "), or the storage is slow");
  }
  return "";
}

/// GPU utilisation below kGpuIdlePct, and which bound the other figures point to.
std::optional<std::string> idleFinding(const TrainResult& r, double data, double comm) {
  const RankSystem* low = extreme(r, SystemMetric::kGpuUtil, /*highest=*/false);
  double u = r.gpu_utilization;
  std::string who = "";
  if (low) {
    u = low->run.get(SystemMetric::kGpuUtil);
    who = strCat(", ", rankText(*low));
  }
  if (u < 0 || u >= kGpuIdlePct) return std::nullopt;
  const std::string head = strCat("utilization: the GPU was busy ", formatFixed(u, 0),
                                  " % of the time (NVML", who, "); ");
  if (data > kInputBoundPct) return head + "input-bound: see the data finding";
  if (comm > kCommBoundPct) return head + "communication-bound: see the communication finding";
  std::string cpu;
  if (low && low->run.has(SystemMetric::kCpuProcessPct)) {
    const double p = low->run.get(SystemMetric::kCpuProcessPct);
    cpu = p >= kLaunchBoundCorePct
              ? strCat(" the process used ", formatFixed(p, 0), " % of a core: a thread launching "
                       "kernels as fast as it can; a larger per-GPU batch makes fewer, larger "
                       "kernels;")
              : strCat(" the process used ", formatFixed(p, 0), " % of a core;");
  }
  return strCat(head, "launch- or code-bound: the step waits neither for data (",
                formatFixed(data, 0), " %) nor for communication (", formatFixed(comm, 0), " %);",
                cpu, " trace a few steps (profile.active: 3) to see where it goes");
}

/// NVML's throttle flags over > kThrottledShare of a rank's samples: the three
/// ranks throttled most, and how many more.
std::optional<std::string> throttleFinding(const TrainResult& r) {
  std::vector<std::pair<double, std::string>> found;  // (share throttled, the rank's text)
  const auto value = [](const RankSystem& x, SystemMetric m) { return x.run.has(m) ? x.run.get(m) : 0; };
  for (const auto& x : r.system) {
    const double power = value(x, SystemMetric::kGpuPowerThrottled);
    const double thermal = value(x, SystemMetric::kGpuThermalThrottled);
    if (power <= kThrottledShare && thermal <= kThrottledShare) continue;
    const auto figure = [&](SystemMetric m, const char* unit) {
      return x.run.has(m) ? strCat(formatFixed(x.run.get(m), 0), unit) : std::string("?");
    };
    found.emplace_back(
        std::max(power, thermal),
        strCat(rankText(x), " power-capped in ", formatFixed(100 * power, 0), " % of samples (",
               figure(SystemMetric::kGpuPowerW, " W"), " of ", figure(SystemMetric::kGpuPowerLimitW, " W"),
               "), thermally in ", formatFixed(100 * thermal, 0), " % (up to ",
               figure(SystemMetric::kGpuTemperatureC, " C"), "), SM clock ",
               figure(SystemMetric::kGpuSmClockMhz, " MHz")));
  }
  if (found.empty()) return std::nullopt;
  std::stable_sort(found.begin(), found.end(),
                   [](const auto& a, const auto& b) { return a.first > b.first; });
  constexpr std::size_t kNamed = 3;
  std::string out;
  for (std::size_t i = 0; i < std::min(kNamed, found.size()); ++i) {
    out += strCat(i ? "; " : "", found[i].second);
  }
  if (found.size() > kNamed) out += strCat("; and ", found.size() - kNamed, " more rank(s)");
  return strCat("throttling: ", out, "; the GPU ran below its clocks: check its cooling and "
                "power limit (nvidia-smi -q -d PERFORMANCE)");
}

/// What the low-MFU finding points to first: the findings that name a larger
/// loss, then the settings that leave speed on the table, then a trace.
std::string mfuLever(const Config& cfg, double data, double comm) {
  if (data > kInputBoundPct) return "the step waits for data: see the data finding";
  if (comm > kCommBoundPct) return "the step waits for the allreduce: see the communication finding";
  if (cfg.train.precision == Precision::kFp32) return "fp32: see the precision finding";
  if (convolutional(cfg.model) && cfg.train.memory_format == MemoryFormat::kContiguous) {
    return "a convolutional model laid out contiguous: try train.memory_format: channels_last";
  }
  if (cfg.optim.kernels == StepKernels::kPerTensor) {
    return "the optimizer steps one tensor at a time: try optim.kernels: auto (fused on CUDA)";
  }
  return "a larger per-GPU batch makes larger kernels (the search's table has the rates); trace a "
         "few steps (profile.active: 3) to see where the step goes";
}

std::optional<std::string> mfuFinding(const Config& cfg, const TrainResult& r, bool cuda,
                                      const Yardstick* y, double data, double comm) {
  if (!cuda || !y || !y->known() || r.samples_per_s <= 0) return std::nullopt;
  const double mfu = y->mfu(r.samples_per_s);
  if (mfu >= kLowMfu) return std::nullopt;
  const double per_device = r.samples_per_s * y->flops_per_sample / static_cast<double>(y->ranks);
  return strCat("utilisation: MFU ", mfuText(mfu), " (", formatFixed(per_device / 1e12, 1),
                " TFLOP/s a device of a peak ", formatFixed(y->peak_flops / 1e12, 0), ", ",
                y->peak_source, "); eager training reaches 30-45 %: ", mfuLever(cfg, data, comm));
}

/// The memory finding's figures: NVML's used at most (any rank), else the
/// allocator's peak; `text` is the finding up to its advice.
struct MemoryUse {
  double used_mb = 0, total_mb = 0, threshold_pct = 50;
  std::string text;
};

std::optional<MemoryUse> memoryUse(const TrainResult& r, bool cuda) {
  const auto gib = [](double mb) { return formatFixed(mb / 1024, 1); };
  if (const RankSystem* x = extreme(r, SystemMetric::kGpuMemoryUsedMb, /*highest=*/true);
      x && x->run.has(SystemMetric::kGpuMemoryTotalMb)) {
    const double used = x->run.get(SystemMetric::kGpuMemoryUsedMb);
    const double total = x->run.get(SystemMetric::kGpuMemoryTotalMb);
    return MemoryUse{used, total, kMemoryTargetPct,
                     strCat("memory: at most ", gib(used), " GiB of ", gib(total), " GiB in use (",
                            formatFixed(pct(used, total), 0), " %, NVML, ", rankText(*x),
                            "; the guides fill 80-90 %)")};
  }
  if (cuda && r.memory_total_mb > 0) {
    return MemoryUse{r.peak_memory_mb, r.memory_total_mb, 50,
                     strCat("memory: peak ", gib(r.peak_memory_mb), " GiB of ",
                            gib(r.memory_total_mb), " GiB (",
                            formatFixed(pct(r.peak_memory_mb, r.memory_total_mb), 0), " %)")};
  }
  return std::nullopt;
}
}  // namespace

std::string noiseScaleText(double b) {
  if (b >= 10) return formatFixed(b, 0);
  char text[32];
  std::snprintf(text, sizeof text, "%.2g", b);
  return text;
}

std::vector<std::string> diagnose(const Config& cfg, const TrainResult& r, bool cuda,
                                  const std::string& device_name, int64_t train_samples,
                                  int64_t tokens_per_sample, const Yardstick* yardstick) {
  std::vector<std::string> out;
  const double total = r.time.total();
  if (total <= 0) return out;
  const double data = pct(r.time.data_wait, total);
  const double comm = pct(r.time.comm, total);
  if (data > kInputBoundPct) {
    out.push_back(strCat("data: ", formatFixed(data, 0), " % of step time waiting for batches (",
                         formatFixed(r.time.data_wait, 1), " s of ", formatFixed(total, 1),
                         " s); raise data.workers (now ", cfg.data.workers, ") or data.prefetch (now ",
                         cfg.data.prefetch, "), or preprocess offline", loaderClause(cfg, r)));
  }
  if (comm > kCommBoundPct) {
    out.push_back(strCat("communication: ", formatFixed(comm, 0),
                         " % of step time in the gradient allreduce (", formatFixed(r.time.comm, 1),
                         " s); a larger per-GPU batch or gradient accumulation (batch.accum) "
                         "amortises it"));
  }
  const double skew = pct(r.time.skew, total);
  if (skew > 15) {
    out.push_back(strCat("skew: ", formatFixed(skew, 0), " % of step time (rank 0) waiting for a "
                         "slower rank to finish its backward (", formatFixed(r.time.skew, 1),
                         " s); look for a rank with a slower device, a busier host, or a slower "
                         "data pipeline (data.workers)"));
  }
  if (const auto m = memoryUse(r, cuda); m && m->used_mb < m->threshold_pct / 100 * m->total_mb) {
    // A searched batch left memory free on purpose: larger ones were not faster
    // (the H200's ResNet-50 chose 1024 at 31 %, 2048 was 1.9 % faster).
    const std::string why =
        cfg.batch.per_gpu_auto
            ? strCat("the batch search chose it, the smallest within ",
                     formatFixed(100 * cfg.search.tolerance, 0),
                     " % of the best samples/s (search.tolerance; the search table has the rest)")
            : std::string("a larger batch fits: try batch.per_gpu: auto");
    out.push_back(strCat(m->text, "; ", why));
  }
  if (cuda && cfg.train.precision == Precision::kFp32) {
    out.push_back(strCat("precision: fp32 on ", device_name,
                         ", whose tensor cores run bf16/fp16 far faster; try train.precision: bf16 "
                         "(or fp16), which also halves activation memory"));
  }
  if (auto noise = noiseFinding(cfg, r, train_samples, TokenTexts{tokens_per_sample})) {
    out.push_back(*noise);
  }
  if (auto idle = idleFinding(r, data, comm)) out.push_back(*idle);
  if (auto throttled = throttleFinding(r)) out.push_back(*throttled);
  if (auto mfu = mfuFinding(cfg, r, cuda, yardstick, data, comm)) out.push_back(*mfu);
  return out;
}

}  // namespace batchdist::worker
