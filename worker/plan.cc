#include "worker/plan.h"

#include <algorithm>
#include <cmath>
#include <random>
#include <sstream>

#include "collective/error.h"
#include "worker/json.h"

namespace batchdist::worker {
namespace {

/// "use 96 or 192" for a value that must be a positive multiple of `unit`.
std::string nearestMultiples(int64_t value, int64_t unit) {
  const int64_t below = (value / unit) * unit;
  const int64_t above = below + unit;
  if (below <= 0) return strCat("use ", above);
  return strCat("use ", below, " or ", above);
}

}  // namespace

double scaledLr(double base_lr, int64_t base_batch, int64_t global, LrScaling rule) {
  const double ratio = static_cast<double>(global) / static_cast<double>(base_batch);
  switch (rule) {
    case LrScaling::kLinear: return base_lr * ratio;
    case LrScaling::kSqrt: return base_lr * std::sqrt(ratio);
    case LrScaling::kNone: return base_lr;
  }
  return base_lr;
}

Plan makePlan(const Config& cfg, int64_t world, int64_t n, bool has_bn, int64_t per_gpu_override) {
  const auto& b = cfg.batch;
  Plan p;
  p.world_size = world;
  p.last_batch = b.last_batch;
  p.dataset_size = n;
  const std::string src = cfg.source;

  int64_t G = b.global_auto ? 0 : b.global;
  int64_t m = per_gpu_override > 0 ? per_gpu_override : b.per_gpu;
  int64_t a = b.accum;
  if (b.per_gpu_auto && m == 0) {
    throw ConfigError(strCat(src, ": batch.per_gpu is 'auto': the batch search picks it at run "
                                  "time (batchdist search / batchdist train)"));
  }

  if (G > 0 && m > 0 && a > 0) {
    if (G != m * a * world) {
      throw ConfigError(strCat(src, ": batch.global=", G, " != batch.per_gpu ", m,
                               " x batch.accum ", a, " x world size ", world, " (= ", m * a * world,
                               "); drop one of the three to derive it, or ",
                               nearestMultiples(G, m * world), " for batch.global"));
    }
  } else if (G > 0 && m > 0) {
    if (G % (m * world) != 0) {
      throw ConfigError(strCat(src, ": batch.global=", G, " is not divisible by world size ", world,
                               " x batch.per_gpu ", m, " (= ", m * world, "); ",
                               nearestMultiples(G, m * world)));
    }
    a = G / (m * world);
  } else if (G > 0 && a > 0) {
    if (G % (a * world) != 0) {
      throw ConfigError(strCat(src, ": batch.global=", G, " is not divisible by world size ", world,
                               " x batch.accum ", a, " (= ", a * world, "); ",
                               nearestMultiples(G, a * world)));
    }
    m = G / (a * world);
  } else if (G > 0) {
    if (G % world != 0) {
      throw ConfigError(strCat(src, ": batch.global=", G, " is not divisible by world size ", world,
                               "; ", nearestMultiples(G, world)));
    }
    a = 1;
    m = G / world;
  } else {
    if (m == 0) m = 32;
    if (a == 0) a = 1;
    G = m * a * world;
  }
  p.per_gpu = m;
  p.accum = a;
  p.global = G;

  if (has_bn && b.last_batch == LastBatch::kKeep) {
    throw ConfigError(strCat(
        src, ": batch.last_batch: keep splits the short last batch unevenly and can give a rank "
             "0 or 1 samples, which BatchNorm cannot normalise (NaN running statistics); use "
             "'drop' or 'pad' for this model"));
  }
  if (has_bn && m < b.min_per_gpu) {
    throw ConfigError(strCat(src, ": batch.per_gpu=", m, " is below batch.min_per_gpu=",
                             b.min_per_gpu, ": BatchNorm in training mode needs at least ",
                             b.min_per_gpu, " samples per GPU per micro-batch; raise batch.global "
                             "or lower batch.accum"));
  }

  if (b.last_batch == LastBatch::kDrop) {
    p.steps_per_epoch = n / G;
    p.samples_dropped = n % G;
    if (p.steps_per_epoch == 0) {
      throw ConfigError(strCat(src, ": the training set has ", n,
                               " samples, fewer than batch.global=", G,
                               ", so batch.last_batch: drop leaves no step; lower the batch or "
                               "use last_batch: pad"));
    }
  } else {
    p.steps_per_epoch = (n + G - 1) / G;
    if (b.last_batch == LastBatch::kPad) p.samples_padded = (G - n % G) % G;
  }

  p.epochs = cfg.train.epochs;
  p.total_steps = p.epochs * p.steps_per_epoch;
  if (cfg.train.max_steps > 0) p.total_steps = std::min(p.total_steps, cfg.train.max_steps);

  const auto& o = cfg.optim;
  p.optimizer = o.name;
  p.base_lr = o.lr;
  p.base_batch = o.base_batch;
  p.lr_scaling = o.lr_scaling;
  p.lr = scaledLr(o.lr, o.base_batch, G, o.lr_scaling);
  p.warmup_steps = o.warmup_steps >= 0
                       ? o.warmup_steps
                       : static_cast<int64_t>(std::llround(o.warmup_epochs * p.steps_per_epoch));
  p.schedule = o.schedule;
  p.min_lr = o.min_lr;
  p.step_gamma = o.step_gamma;
  p.milestones = o.milestones;
  std::sort(p.milestones.begin(), p.milestones.end());
  if (o.schedule == Schedule::kStep && p.milestones.empty()) {
    throw ConfigError(strCat(src, ": optim.schedule: step needs optim.milestones (epochs at which "
                                  "the rate is multiplied by optim.step_gamma), e.g. [30, 60]"));
  }

  // Warnings worth a look, never fatal.
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
  if (p.lr_scaling != LrScaling::kNone && G > 8 * o.base_batch && p.warmup_steps == 0) {
    p.warnings.push_back(strCat("lr scaled ", G / static_cast<double>(o.base_batch),
                                "x for batch ", G, " with no warmup; large-batch training usually "
                                "needs optim.warmup_epochs (Goyal et al. 2017)"));
  }
  if (p.warmup_steps > p.total_steps) {
    p.warnings.push_back(strCat("warmup (", p.warmup_steps, " steps) is longer than the run (",
                                p.total_steps, " steps)"));
  }
  if (G > n / 2 && b.last_batch != LastBatch::kDrop) {
    p.warnings.push_back(strCat("batch.global=", G, " is more than half the training set (", n,
                                "): few steps per epoch"));
  }
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

std::string planText(const Plan& p) {
  std::ostringstream os;
  os << "plan: world " << p.world_size << " x per-GPU batch " << p.per_gpu << " x accumulation "
     << p.accum << " = global batch " << p.global << "\n";
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

std::string planJson(const Plan& p) {
  std::vector<std::string> ranks;
  for (int64_t r = 0; r < p.world_size; ++r) {
    ranks.push_back(json::Object().add("rank", r).add("samples_per_epoch", p.rankSamplesPerEpoch(r)).str());
  }
  std::vector<std::string> warnings;
  for (const auto& w : p.warnings) warnings.push_back(json::quote(w));
  return json::Object()
      .add("world_size", p.world_size)
      .add("per_gpu_batch", p.per_gpu)
      .add("accum_steps", p.accum)
      .add("global_batch", p.global)
      .add("last_batch", toString(p.last_batch))
      .add("dataset_size", p.dataset_size)
      .add("steps_per_epoch", p.steps_per_epoch)
      .add("samples_dropped", p.samples_dropped)
      .add("samples_padded", p.samples_padded)
      .add("epochs", p.epochs)
      .add("total_steps", p.total_steps)
      .add("optimizer", p.optimizer)
      .add("base_lr", p.base_lr)
      .add("base_batch", p.base_batch)
      .add("lr_scaling", toString(p.lr_scaling))
      .add("lr", p.lr)
      .add("warmup_steps", p.warmup_steps)
      .add("schedule", toString(p.schedule))
      .raw("ranks", json::array(ranks))
      .raw("warnings", json::array(warnings))
      .str();
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

void Sharder::setEpoch(int64_t epoch) { perm_ = seededPermutation(plan_.dataset_size, seed_, epoch); }

int64_t Sharder::realSamples(int64_t step) const {
  const int64_t begin = step * plan_.global;
  return std::max<int64_t>(0, std::min(plan_.global, plan_.dataset_size - begin));
}

MicroBatch Sharder::micro(int64_t step, int64_t k, int64_t rank) const {
  const int64_t n = plan_.dataset_size;
  const int64_t m = plan_.per_gpu;
  const int64_t slot = rank * plan_.accum + k;
  const int64_t step_begin = step * plan_.global;
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
