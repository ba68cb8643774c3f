#include "worker/plan/plan.h"

#include <algorithm>
#include <cmath>
#include <random>
#include <sstream>

#include "common/error.h"
#include "worker/common/console.h"
#include "worker/plan/adapt.h"

namespace batchdist::worker {
namespace {

/// The global batch G as a message names it: "batch.global=96", or, when it came
/// from batch.global_tokens (Note [global tokens]), that key and its windows.
std::string globalName(const Config& cfg, int64_t G) {
  if (cfg.batch.global_tokens == 0) return strCat("batch.global=", G);
  return strCat("batch.global_tokens=", cfg.batch.global_tokens, " (", G, " windows of ",
                cfg.model.seq_len, " tokens)");
}

}  // namespace

int64_t tokensPerSample(const Config& cfg) {
  return cfg.data.name == DataName::kTokens ? cfg.model.seq_len : 0;
}

double scaledLr(double base_lr, int64_t base_batch, int64_t global, LrScaling rule) {
  const double ratio = static_cast<double>(global) / static_cast<double>(base_batch);
  switch (rule) {
    case LrScaling::kLinear: return base_lr * ratio;
    case LrScaling::kSqrt: return base_lr * std::sqrt(ratio);
    case LrScaling::kNone: return base_lr;
  }
  return base_lr;
}

namespace {

/// a * b, or ConfigError naming what was being computed when it overflows.
int64_t mul(int64_t a, int64_t b, const std::string& src, const char* what) {
  int64_t out = 0;
  if (__builtin_mul_overflow(a, b, &out)) {
    throw ConfigError(strCat(src, ": ", what, " overflows (", a, " x ", b,
                             "); the batch settings are far too large"));
  }
  return out;
}

/// "use 96 or 192": the valid global batches nearest to G, multiples of `unit`;
/// `key` adds " for batch.global". In tokens, for batch.global_tokens, when the
/// batch was given so (Note [global tokens]).
std::string nearestGlobal(const Config& cfg, int64_t G, int64_t unit, bool key) {
  const bool tokens = cfg.batch.global_tokens > 0;
  const int64_t scale = tokens ? cfg.model.seq_len : 1;
  const int64_t below = (G / unit) * unit;
  const int64_t above = below + unit;
  const char* what = "the nearest valid batch";
  const std::string out =
      below <= 0 ? strCat("use ", mul(above, scale, cfg.source, what))
                 : strCat("use ", mul(below, scale, cfg.source, what), " or ",
                          mul(above, scale, cfg.source, what));
  if (tokens) return out + " for batch.global_tokens";
  return key ? out + " for batch.global" : out;
}

/// Phase 1: the batch triple G = m x a x W from whichever of the three are set.
void resolveBatch(const Config& cfg, int64_t world, int64_t per_gpu_override, Plan& p) {
  const auto& b = cfg.batch;
  const std::string& src = cfg.source;
  int64_t G = b.global_auto ? 0 : b.global;
  int64_t m = per_gpu_override > 0 ? per_gpu_override : b.per_gpu;
  int64_t a = b.accum;
  if (b.per_gpu_auto && m == 0) {
    throw ConfigError(strCat(src, ": batch.per_gpu is 'auto': the batch search picks it at run "
                                  "time (batchdist search / batchdist train)"));
  }
  if (G > 0 && m > 0 && a > 0) {
    const int64_t product = mul(mul(m, a, src, "batch.per_gpu x batch.accum"), world, src,
                                "batch.per_gpu x batch.accum x world size");
    if (G != product) {
      throw ConfigError(strCat(src, ": ", globalName(cfg, G), " != batch.per_gpu ", m,
                               " x batch.accum ", a, " x world size ", world, " (= ", product,
                               "); drop one of the three to derive it, or ",
                               nearestGlobal(cfg, G, mul(m, world, src, "batch.per_gpu x world size"),
                                             /*key=*/true)));
    }
  } else if (G > 0 && m > 0) {
    const int64_t unit = mul(m, world, src, "batch.per_gpu x world size");
    if (G % unit != 0) {
      throw ConfigError(strCat(src, ": ", globalName(cfg, G), " is not divisible by world size ",
                               world, " x batch.per_gpu ", m, " (= ", unit, "); ",
                               nearestGlobal(cfg, G, unit, /*key=*/false)));
    }
    a = G / unit;
  } else if (G > 0 && a > 0) {
    const int64_t unit = mul(a, world, src, "batch.accum x world size");
    if (G % unit != 0) {
      throw ConfigError(strCat(src, ": ", globalName(cfg, G), " is not divisible by world size ",
                               world, " x batch.accum ", a, " (= ", unit, "); ",
                               nearestGlobal(cfg, G, unit, /*key=*/false)));
    }
    m = G / unit;
  } else if (G > 0) {
    if (G % world != 0) {
      throw ConfigError(strCat(src, ": ", globalName(cfg, G), " is not divisible by world size ",
                               world, "; ", nearestGlobal(cfg, G, world, /*key=*/false)));
    }
    a = 1;
    m = G / world;
  } else {
    if (m == 0) m = 32;
    if (a == 0) a = 1;
    G = mul(mul(m, a, src, "batch.per_gpu x batch.accum"), world, src,
            "batch.per_gpu x batch.accum x world size");
  }
  p.per_gpu = m;
  p.accum = a;
  p.global = G;
}

/// Phase 2: Note [equal shards] for BatchNorm: never fewer than 2 samples (nor
/// fewer than batch.min_per_gpu) in a micro-batch, and no uneven last batch.
void checkBatchNorm(const Config& cfg, bool has_bn, const Plan& p) {
  if (!has_bn) return;
  const std::string& src = cfg.source;
  if (cfg.batch.last_batch == LastBatch::kKeep) {
    throw ConfigError(strCat(
        src, ": batch.last_batch: keep splits the short last batch unevenly and can give a rank "
             "0 or 1 samples, which BatchNorm cannot normalise (NaN running statistics); use "
             "'drop' or 'pad' for this model"));
  }
  const int64_t floor = minPerGpu(cfg, /*has_batchnorm=*/true);
  if (p.per_gpu < floor) {
    throw ConfigError(strCat(src, ": batch.per_gpu=", p.per_gpu, " is below ", floor,
                             ": BatchNorm in training mode needs at least ", floor,
                             " samples per GPU per micro-batch (batch.min_per_gpu, never below "
                             "2); raise batch.global or lower batch.accum"));
  }
}

/// Steps per epoch of n samples at p.global, and what p.last_batch drops or pads:
/// the one arithmetic of planEpochs() and withGlobal().
void cutEpochs(int64_t n, Plan& p) {
  const int64_t G = p.global;
  p.samples_dropped = p.samples_padded = 0;
  if (p.last_batch == LastBatch::kDrop) {
    p.steps_per_epoch = n / G;
    p.samples_dropped = n % G;
  } else {
    p.steps_per_epoch = n / G + (n % G != 0 ? 1 : 0);
    if (p.last_batch == LastBatch::kPad) p.samples_padded = (G - n % G) % G;
  }
}

/// Phase 3: steps per epoch and what the last batch policy drops or pads.
void planEpochs(const Config& cfg, int64_t n, Plan& p) {
  const int64_t G = p.global;
  cutEpochs(n, p);
  if (cfg.batch.last_batch == LastBatch::kDrop) {
    if (p.steps_per_epoch == 0) {
      throw ConfigError(strCat(cfg.source, ": the training set has ", n,
                               " samples, fewer than ", globalName(cfg, G),
                               ", so batch.last_batch: drop leaves no step; lower the batch or "
                               "use last_batch: pad"));
    }
  } else if (p.samples_padded > n) {
    throw ConfigError(strCat(cfg.source, ": ", globalName(cfg, G), " with batch.last_batch: pad "
                             "would add ", p.samples_padded, " padding samples to the ", n,
                             " of the training set each epoch (more padding than data); lower "
                             "the batch"));
  }
  p.epochs = cfg.train.epochs;
  p.total_steps = mul(p.epochs, p.steps_per_epoch, cfg.source, "train.epochs x steps per epoch");
  if (cfg.train.max_steps > 0) p.total_steps = std::min(p.total_steps, cfg.train.max_steps);
}

/// Phase 4: Note [lr follows the batch]: the peak rate scaled to G, warmup, schedule.
void planLr(const Config& cfg, Plan& p) {
  const auto& o = cfg.optim;
  p.optimizer = toString(o.name);
  p.base_lr = o.lr;
  p.base_batch = o.base_batch;
  p.lr_scaling = o.lr_scaling;
  p.lr = scaledLr(o.lr, o.base_batch, p.global, o.lr_scaling);
  p.warmup_steps = o.warmup_steps >= 0
                       ? o.warmup_steps
                       : static_cast<int64_t>(std::llround(o.warmup_epochs * p.steps_per_epoch));
  p.schedule = o.schedule;
  p.min_lr = o.min_lr;
  p.step_gamma = o.step_gamma;
  p.milestones = o.milestones;
  std::sort(p.milestones.begin(), p.milestones.end());
}

/// Phase 5: warnings worth a look, never fatal.
void planWarnings(const Config& cfg, Plan& p) {
  const int64_t n = p.dataset_size;
  const int64_t G = p.global;
  if (p.samples_dropped > 0) {
    p.warnings.push_back(strCat(p.samples_dropped, " of ", n, " training samples (",
                                100.0 * p.samples_dropped / n,
                                " %) are dropped each epoch (batch.last_batch: drop); a new "
                                "permutation each epoch drops different ones"));
  }
  if (p.samples_padded > 0) {
    p.warnings.push_back(strCat(p.samples_padded, " padding samples (weight 0) fill the last "
                                "global batch each epoch (batch.last_batch: pad)"));
  }
  if (p.lr_scaling != LrScaling::kNone && G / 8 > cfg.optim.base_batch && p.warmup_steps == 0) {
    p.warnings.push_back(strCat("lr scaled ", G / static_cast<double>(cfg.optim.base_batch),
                                "x for batch ", G, " with no warmup; large-batch training usually "
                                "needs optim.warmup_epochs (Goyal et al. 2017)"));
  }
  if (p.warmup_steps > p.total_steps) {
    p.warnings.push_back(strCat("warmup (", p.warmup_steps, " steps) is longer than the run (",
                                p.total_steps, " steps)"));
  }
  if (G > n / 2 && cfg.batch.last_batch != LastBatch::kDrop) {
    p.warnings.push_back(strCat(globalName(cfg, G), " is more than half the training set (", n,
                                "): few steps per epoch"));
  }
}

}  // namespace

Plan makePlan(const Config& cfg, int64_t world, int64_t n, bool has_bn, int64_t per_gpu_override) {
  Plan p;
  p.world_size = world;
  p.last_batch = cfg.batch.last_batch;
  p.dataset_size = n;
  p.tokens_per_sample = tokensPerSample(cfg);
  p.global_tokens = p.tokens_per_sample > 0 ? cfg.batch.global_tokens : 0;
  resolveBatch(cfg, world, per_gpu_override, p);
  checkBatchNorm(cfg, has_bn, p);
  planEpochs(cfg, n, p);
  planLr(cfg, p);
  planWarnings(cfg, p);
  if (cfg.batch.adapt != BatchAdapt::kOff) {
    // Note [goodput], Note [batch-size warmup]: is any G above G0 reachable with
    // this world and data set?
    // (ConfigError naming the nearest split when not.)
    const auto space = adaptSpace(cfg, p, has_bn);
    p.warnings.insert(p.warnings.end(), space.warnings.begin(), space.warnings.end());
  }
  return p;
}

int64_t minPerGpu(const Config& cfg, bool has_batchnorm) {
  return has_batchnorm ? std::max<int64_t>(2, cfg.batch.min_per_gpu) : 1;
}

int64_t backedOffPerGpu(int64_t per_gpu, int64_t min_per_gpu) {
  for (int64_t f = 2; f * f <= per_gpu; ++f) {
    if (per_gpu % f == 0) return per_gpu / f >= min_per_gpu ? per_gpu / f : 0;
  }
  return per_gpu > 1 && 1 >= min_per_gpu ? 1 : 0;  // a prime: one sample a micro-batch
}

Plan withPerGpu(const Plan& plan, int64_t per_gpu) {
  const int64_t rank_batch = plan.per_gpu * plan.accum;
  if (per_gpu <= 0 || rank_batch % per_gpu != 0) {
    throw Error(strCat("per-GPU batch ", per_gpu, " does not divide the ", rank_batch,
                       " samples per rank and step (global batch ", plan.global, " over ",
                       plan.world_size, " ranks)"));
  }
  Plan p = plan;
  p.per_gpu = per_gpu;
  p.accum = rank_batch / per_gpu;
  return p;
}

Plan withGlobal(const Plan& plan, int64_t global, int64_t per_gpu, int64_t accum) {
  if (per_gpu <= 0 || accum <= 0 || global != per_gpu * accum * plan.world_size ||
      global > plan.dataset_size) {
    throw Error(strCat("global batch ", global, " is not per-GPU batch ", per_gpu,
                       " x accumulation ", accum, " x ", plan.world_size, " ranks within the ",
                       plan.dataset_size, " training samples"));
  }
  Plan p = plan;
  p.global = global;
  p.per_gpu = per_gpu;
  p.accum = accum;
  cutEpochs(p.dataset_size, p);
  return p;
}

double Plan::lrAt(int64_t step) const {
  if (step < warmup_steps) {
    // Linear rise to the scaled rate (gradual warmup, Goyal et al. 2017).
    return lr * static_cast<double>(step + 1) / static_cast<double>(warmup_steps);
  }
  switch (schedule) {
    case Schedule::kConstant: return lr;
    case Schedule::kStep: {
      const int64_t epoch = step / std::max<int64_t>(1, steps_per_epoch);
      double r = lr;
      for (auto m : milestones) {
        if (epoch >= m) r *= step_gamma;
      }
      return r;
    }
    case Schedule::kCosine: {
      const double span = std::max<int64_t>(1, total_steps - warmup_steps);
      const double t = std::min(1.0, (step - warmup_steps) / span);
      return min_lr + (lr - min_lr) * 0.5 * (1.0 + std::cos(M_PI * t));
    }
  }
  return lr;
}

double Plan::lrAtProgress(double progress) const {
  if (progress < warmup_steps) {
    // lrAt(s) is lr (s + 1) / warmup at whole steps; between them the line goes
    // on, but never above the peak.
    return lr * std::min(1.0, (progress + 1.0) / static_cast<double>(warmup_steps));
  }
  switch (schedule) {
    case Schedule::kConstant: return lr;
    case Schedule::kStep: {
      const double epoch = std::floor(progress / static_cast<double>(std::max<int64_t>(1, steps_per_epoch)));
      double r = lr;
      for (auto m : milestones) {
        if (epoch >= static_cast<double>(m)) r *= step_gamma;
      }
      return r;
    }
    case Schedule::kCosine: {
      const double span = std::max<int64_t>(1, total_steps - warmup_steps);
      const double t = std::min(1.0, (progress - warmup_steps) / span);
      return min_lr + (lr - min_lr) * 0.5 * (1.0 + std::cos(M_PI * t));
    }
  }
  return lr;
}

int64_t Plan::rankSamplesPerEpoch(int64_t rank) const {
  if (last_batch != LastBatch::kKeep || dataset_size % global == 0) {
    return steps_per_epoch * accum * per_gpu;
  }
  // keep: full steps, then this rank's share of the short last batch.
  const int64_t full = dataset_size / global;
  const int64_t rest = dataset_size - full * global;
  const int64_t slots = world_size * accum;
  int64_t mine = 0;
  for (int64_t k = 0; k < accum; ++k) {
    const int64_t s = rank * accum + k;
    mine += rest / slots + (s < rest % slots ? 1 : 0);
  }
  return full * accum * per_gpu + mine;
}

std::string planTokensText(const Plan& p) {
  if (p.tokens_per_sample <= 0) return "";
  const int64_t len = p.tokens_per_sample;
  const int64_t step = p.tokensPerStep();
  if (p.global_tokens <= 0) {
    return strCat("  tokens: global batch ", p.global, " x ", len, " tokens (model.seq_len) = ",
                  step, " tokens per step\n");
  }
  const int64_t asked = p.global_tokens;
  const std::string windows = asked % len == 0
                                  ? strCat(asked / len)
                                  : formatFixed(static_cast<double>(asked) / len, 2);
  const char* rounded = step == asked ? "" : step > asked ? ", rounded up to whole windows"
                                                          : ", rounded down to whole windows";
  return strCat("  tokens: batch.global_tokens ", asked, " = ", windows, " windows of ", len,
                " tokens (model.seq_len)", rounded, ": global batch ", p.global, " (", step,
                " tokens per step)\n");
}

std::string planText(const Plan& p) {
  std::ostringstream os;
  os << "plan: world " << p.world_size << " x per-GPU batch " << p.per_gpu << " x accumulation "
     << p.accum << " = global batch " << p.global << "\n";
  os << planTokensText(p);
  os << "  data: " << p.dataset_size << " training samples, " << p.steps_per_epoch
     << " steps/epoch, last batch '" << toString(p.last_batch) << "': " << p.samples_dropped
     << " dropped, " << p.samples_padded << " padded per epoch\n";
  os << "  per rank: " << p.rankSamplesPerEpoch(0) << " samples/epoch";
  if (p.last_batch == LastBatch::kKeep) {
    os << " (rank 0; rank " << p.world_size - 1 << ": " << p.rankSamplesPerEpoch(p.world_size - 1)
       << ")";
  }
  os << "\n";
  os << "  lr: " << p.lr << " (" << p.optimizer << ", optim.lr " << p.base_lr << " at batch "
     << p.base_batch << ", " << toString(p.lr_scaling) << " scaling), warmup " << p.warmup_steps
     << " steps, schedule " << toString(p.schedule) << ", " << p.total_steps << " steps in all\n";
  for (const auto& w : p.warnings) os << "  warning: " << w << "\n";
  return os.str();
}

nlohmann::ordered_json planTokensJson(const Plan& p) {
  auto j = nlohmann::ordered_json::object();
  if (p.tokens_per_sample <= 0) return j;
  j["tokens_per_sample"] = p.tokens_per_sample;
  if (p.global > 0) j["tokens_per_step"] = p.tokensPerStep();
  if (p.global_tokens > 0) j["global_tokens_asked"] = p.global_tokens;
  return j;
}

nlohmann::ordered_json planJson(const Plan& p) {
  auto ranks = nlohmann::ordered_json::array();
  for (int64_t r = 0; r < p.world_size; ++r) {
    ranks.push_back({{"rank", r}, {"samples_per_epoch", p.rankSamplesPerEpoch(r)}});
  }
  nlohmann::ordered_json j{{"world_size", p.world_size},
                           {"per_gpu_batch", p.per_gpu},
                           {"accum_steps", p.accum},
                           {"global_batch", p.global}};
  j.update(planTokensJson(p));
  j.update(nlohmann::ordered_json{
          {"last_batch", toString(p.last_batch)},
          {"dataset_size", p.dataset_size},
          {"steps_per_epoch", p.steps_per_epoch},
          {"samples_dropped", p.samples_dropped},
          {"samples_padded", p.samples_padded},
          {"epochs", p.epochs},
          {"total_steps", p.total_steps},
          {"optimizer", p.optimizer},
          {"base_lr", p.base_lr},
          {"base_batch", p.base_batch},
          {"lr_scaling", toString(p.lr_scaling)},
          {"lr", p.lr},
          {"warmup_steps", p.warmup_steps},
          {"schedule", toString(p.schedule)},
          {"ranks", ranks},
          {"warnings", p.warnings}});
  return j;
}

std::vector<int64_t> seededPermutation(int64_t n, uint64_t seed, int64_t epoch) {
  // Own Fisher-Yates over mt19937_64: no library distribution whose algorithm
  // could differ between standard libraries.
  std::seed_seq seq{static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32),
                    static_cast<uint32_t>(epoch), 0x62646973u};
  std::mt19937_64 gen(seq);
  std::vector<int64_t> perm(n);
  for (int64_t i = 0; i < n; ++i) perm[i] = i;
  for (int64_t i = n - 1; i > 0; --i) {
    const int64_t j = static_cast<int64_t>(gen() % static_cast<uint64_t>(i + 1));
    std::swap(perm[i], perm[j]);
  }
  return perm;
}

Sharder::Sharder(const Plan& plan, uint64_t seed) : plan_(plan), seed_(seed) { setEpoch(0); }

void Sharder::setEpoch(int64_t epoch) {
  perm_ = seededPermutation(plan_.dataset_size, seed_, epoch);
  cut_step_ = cut_begin_ = 0;
}

// Note [adaptive cut]: an adaptive run (Note [goodput] in worker/plan/adapt.h)
// changes G at a step boundary, possibly mid-epoch. The epoch's permutation stays;
// the rest of it, from the position the next step would have begun at, is cut
// into steps of the new G. So the order of the samples is a function of (seed,
// epoch, sample position) alone, whatever the history of G, every step still has
// exactly G slots (Note [equal shards]), and the tail that drop leaves out (or pad
// fills) is the one the last G leaves.
void Sharder::setCut(int64_t first_step, int64_t begin) {
  if (first_step < 0 || begin < 0 || begin > plan_.dataset_size) {
    throw Error(strCat("sharder: cut at step ", first_step, ", sample ", begin, " of ",
                       plan_.dataset_size));
  }
  cut_step_ = first_step;
  cut_begin_ = begin;
}

Sharder Sharder::withPlan(const Plan& plan) const {
  Sharder out = *this;
  out.plan_ = plan;
  return out;
}

int64_t Sharder::stepsInEpoch() const {
  const int64_t rest = plan_.dataset_size - cut_begin_;
  const int64_t g = std::max<int64_t>(1, plan_.global);
  return cut_step_ + (plan_.last_batch == LastBatch::kDrop ? rest / g : (rest + g - 1) / g);
}

int64_t Sharder::realSamples(int64_t step) const {
  const int64_t begin = position(step);
  return std::max<int64_t>(0, std::min(plan_.global, plan_.dataset_size - begin));
}

MicroBatch Sharder::micro(int64_t step, int64_t k, int64_t rank) const {
  const int64_t n = plan_.dataset_size;
  const int64_t m = plan_.per_gpu;
  const int64_t slot = rank * plan_.accum + k;
  const int64_t step_begin = position(step);
  MicroBatch mb;
  if (plan_.last_batch == LastBatch::kKeep && realSamples(step) < plan_.global) {
    // Short last batch split as evenly as possible over the W x a slots.
    const int64_t rest = realSamples(step);
    const int64_t slots = plan_.world_size * plan_.accum;
    const int64_t size = rest / slots + (slot < rest % slots ? 1 : 0);
    const int64_t offset = slot * (rest / slots) + std::min(slot, rest % slots);
    for (int64_t i = 0; i < size; ++i) {
      mb.indices.push_back(perm_[step_begin + offset + i]);
      mb.weights.push_back(1.0f);
    }
    return mb;
  }
  mb.indices.reserve(m);
  mb.weights.reserve(m);
  for (int64_t i = 0; i < m; ++i) {
    const int64_t pos = step_begin + slot * m + i;
    if (pos < n) {
      mb.indices.push_back(perm_[pos]);
      mb.weights.push_back(1.0f);
    } else {
      // Padding: repeat from the start of the permutation with weight 0.
      mb.indices.push_back(perm_[(pos - n) % n]);
      mb.weights.push_back(0.0f);
    }
  }
  return mb;
}

std::pair<int64_t, int64_t> evalShard(int64_t n, int64_t world, int64_t rank) {
  const int64_t base = n / world;
  const int64_t extra = n % world;
  const int64_t begin = rank * base + std::min(rank, extra);
  return {begin, begin + base + (rank < extra ? 1 : 0)};
}

}  // namespace batchdist::worker
