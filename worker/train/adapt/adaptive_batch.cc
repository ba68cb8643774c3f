#include "worker/train/adapt/adaptive_batch.h"

#include <algorithm>
#include <cmath>
#include <iostream>
#include <sstream>

#include "common/error.h"
#include "worker/common/console.h"
#include "worker/train/adapt/adapt_record.h"

namespace batchdist::worker {

AdaptSpace spaceInForce(const AdaptSpace& measured, const std::vector<int64_t>& backed_off,
                        int64_t per_gpu) {
  AdaptSpace now = measured;
  auto& t = now.throughput;
  if (!backed_off.empty()) {
    // Not back to a per-GPU batch that ran out of memory (Note [oom back-off]).
    const int64_t limit = *std::min_element(backed_off.begin(), backed_off.end());
    t.erase(std::remove_if(t.begin(), t.end(),
                           [&](const ThroughputPoint& p) { return p.per_gpu >= limit; }),
            t.end());
  }
  const auto in_force = [&](const ThroughputPoint& p) { return p.per_gpu == per_gpu; };
  if (!t.empty() && std::none_of(t.begin(), t.end(), in_force)) {
    // The split in force was never measured (an out-of-memory back-off made it):
    // the lowest figure of the table stands for it, so the decision still moves.
    double low = t.front().samples_per_s;
    for (const auto& p : t) low = std::min(low, p.samples_per_s);
    t.push_back({per_gpu, low});
  }
  return now;
}

AdaptiveBatch::AdaptiveBatch(const BatchConfig& batch, OptimName optimizer,
                             collective::Communicator& comm, const Plan& plan0,
                             const AdaptSpace& space, bool figures_fault)
    : batch_(batch), optimizer_(optimizer), comm_(comm), plan0_(plan0), space_(space) {
  space_.fixed_step_s = -1;  // measured until the first decision
  if (figures_fault) space_.throughput.clear();  // Note [fault plan]
}

bool AdaptiveBatch::countStep(double fixed_s, double step_s) {
  // Note [adaptive training]: the step counts r steps at G0.
  progress_ += segments_.back().gain;
  fixed_sum_ += fixed_s;
  ++fixed_steps_;
  step_sum_ += step_s;
  ++step_count_;
  if (progress_ < static_cast<double>(plan0_.total_steps) - 1e-9) return false;
  done_ = true;
  return true;
}

double AdaptiveBatch::stepsLeft() const {
  return (plan0_.total_steps - progress_) / std::max(1.0, segments_.back().gain);
}

double AdaptiveBatch::lr(int64_t global) const {
  return adaptLr(plan0_, optimizer_, batch_.adapt_gain, progress_, global, b_noise_);
}

void AdaptiveBatch::beginSegment(int64_t global_step, const AdaptSplit& split, double b_noise,
                                 double efficiency, const std::string& why) {
  const double gain = stepGain(batch_.adapt_gain, static_cast<double>(split.global),
                               static_cast<double>(plan0_.global), b_noise);
  if (!segments_.empty() && segments_.back().begin_step == global_step) {
    segments_.back() = {global_step, split.global, gain};
  } else {
    segments_.push_back({global_step, split.global, gain});
  }
  b_noise_ = b_noise;
  BatchChange c;
  c.step = global_step;
  c.global = split.global;
  c.per_gpu = split.per_gpu;
  c.accum = split.accum;
  c.gain = gain;
  c.noise_scale = b_noise > 0 ? b_noise : -1;
  c.efficiency = efficiency;
  c.why = why;
  history_.push_back(c);
}

// ---------------------------------------------------------------------------
// The decision (Note [adaptive training])

std::optional<AdaptSplit> AdaptiveBatch::decide(int64_t s, int64_t global_step,
                                                const AdaptSplit& current, double b_simple,
                                                const std::vector<int64_t>& backed_off,
                                                Console* console) {
  if (!due(s, global_step)) return std::nullopt;
  last_decision_ = global_step;
  const double b = agreeFigures(b_simple, current);
  // Note [goodput] or Note [batch-size warmup], by batch.adapt (space_.mode).
  auto d = decideAdaptive(spaceInForce(space_, backed_off, current.per_gpu), current, b);
  followRankZero(d, current, global_step);
  return settle(d, current, global_step, b, console);
}

bool AdaptiveBatch::due(int64_t s, int64_t global_step) const {
  // Not during the warmup (Note [adaptive training]): G stays G0 until the
  // progress has passed it, unless batch.adapt_in_warmup.
  if (!batch_.adapt_in_warmup && progress_ < static_cast<double>(plan0_.warmup_steps)) {
    return false;
  }
  const bool epoch_start = s == 0 && global_step > 0;
  if (!epoch_start && global_step - last_decision_ < batch_.adapt_every_steps) return false;
  // Once per step (an epoch cut short by a larger G starts the next at the same step).
  return !(global_step == last_decision_ && global_step > 0);
}

// The same figures on every rank: B from the allreduced norms (MAX only makes
// that certain), the slowest rank's fixed cost and step time, and the fewest
// steps any rank measured them over.
double AdaptiveBatch::agreeFigures(double b_simple, const AdaptSplit& current) {
  const double fixed = fixed_steps_ > 0 ? fixed_sum_ / fixed_steps_ : 0.0;
  const double step_s = step_count_ > 0 ? step_sum_ / step_count_ : 0.0;
  const auto v = comm_.allreduce({b_simple, fixed, step_s, -static_cast<double>(fixed_steps_)},
                                 collective::ReduceOp::kMax);
  if (space_.fixed_step_s < 0 && -v[3] > 0) {
    // Frozen from here on: later decisions rest on B alone (Note [adaptive training]).
    space_.fixed_step_s = v[1];
    const auto& t = space_.throughput;
    const bool have = std::any_of(t.begin(), t.end(), [&](const ThroughputPoint& p) {
      return p.per_gpu == current.per_gpu;
    });
    if (!have && v[2] > 0) {
      // No search figure for the split in force (a fixed batch.per_gpu): its own
      // steps, as if at accumulation 1 (the model's lower bound).
      space_.throughput.push_back({current.per_gpu, static_cast<double>(current.global) / v[2]});
    }
  }
  return v[0];
}

void AdaptiveBatch::followRankZero(AdaptDecision& d, const AdaptSplit& current,
                                   int64_t global_step) {
  const AdaptSplit mine = d.chosen;
  const auto text = comm_.broadcast(strCat(mine.global, " ", mine.per_gpu, " ", mine.accum), 0);
  AdaptSplit zero;
  std::istringstream(text) >> zero.global >> zero.per_gpu >> zero.accum;
  if (zero == mine) return;
  d.chosen = zero;
  d.change = zero != current;
  if (followed_++ > 0) return;  // said once
  const int64_t tokens = space_.tokens_per_sample;
  std::cerr << strCat("batchdist: warning: rank ", comm_.rank(), ": the adaptive batch decision at step ",
                      global_step + 1, " was global batch ", splitText(mine, comm_.size(), tokens),
                      ", rank 0's ", splitText(zero, comm_.size(), tokens),
                      ": taking rank 0's, in this decision and any later one that differs (this "
                      "rank's samples/s figures differ from rank 0's)\n")
            << std::flush;
}

std::optional<AdaptSplit> AdaptiveBatch::settle(const AdaptDecision& d, const AdaptSplit& current,
                                                int64_t global_step, double b, Console* console) {
  const double g0 = static_cast<double>(plan0_.global);
  if (d.change) {
    const double eff = statisticalEfficiency(static_cast<double>(d.chosen.global), g0, b);
    const double old_gain = segments_.back().gain;
    beginSegment(global_step, d.chosen, b, eff, d.why);
    if (console) {
      console->line(strCat("adapt: step ", global_step + 1, ": ", d.why, "; efficiency ",
                           formatFixed(eff, 3), ", lr gain ", formatFixed(old_gain, 3), " -> ",
                           formatFixed(segments_.back().gain, 3)));
    }
    return d.chosen;
  }
  // G stays; its AdaScale gain follows B (a new segment when it moved by 1 %).
  const double gain = stepGain(batch_.adapt_gain, static_cast<double>(current.global), g0, b);
  if (std::abs(gain - segments_.back().gain) > 0.01 * segments_.back().gain) {
    beginSegment(global_step, current, b,
                 statisticalEfficiency(static_cast<double>(current.global), g0, b), d.why);
  }
  return std::nullopt;
}

// ---------------------------------------------------------------------------
// Note [adaptive checkpoint]

nlohmann::ordered_json AdaptiveBatch::record(const AdaptSplit& split, int64_t epoch,
                                             int64_t next_step, int64_t cut_step,
                                             int64_t cut_begin,
                                             const AdaptRecordParts& parts) const {
  // JSON has no inf or NaN: a figure that is not finite is written as unknown.
  const auto finite = [](double x, double unknown) { return std::isfinite(x) ? x : unknown; };
  return {{"world_size", comm_.size()},
          {"global", split.global},
          {"per_gpu", split.per_gpu},
          {"accum", split.accum},
          {"epoch", epoch},
          {"step_in_epoch", next_step},
          // The next step's lr if G stays (for the manifest; not read on resume).
          {"lr_next", finite(lr(split.global), 0)},
          {"cut_step", cut_step},
          {"cut_begin", cut_begin},
          {"progress", progress_},
          {"b_noise", finite(b_noise_, -1)},
          {"last_decision", last_decision_},
          {"fixed_step_s", finite(space_.fixed_step_s, -1)},
          {"fixed_sum", finite(fixed_sum_, 0)},
          {"fixed_steps", fixed_steps_},
          {"step_sum", finite(step_sum_, 0)},
          {"step_count", step_count_},
          {"oom", parts.oom},
          {"fixed_per_gpu", space_.fixed_per_gpu},
          {"multiple_of", space_.multiple_of},
          {"throughput", adapt_record::throughputJson(space_.throughput)},
          {"segments", adapt_record::segmentsJson(segments_)},
          {"history", adapt_record::historyJson(history_)},
          {"noise", parts.noise},
          {"noise_ticks", parts.noise_ticks}};
}

std::optional<Plan> AdaptiveBatch::restore(const nlohmann::ordered_json& rec, int64_t step,
                                           const Plan& plan, Console* console) {
  if (rec.is_null()) {
    startAtG0(step, plan);
    return std::nullopt;
  }
  std::optional<Plan> to;
  try {
    progress_ = rec.at("progress").get<double>();
    last_decision_ = rec.at("last_decision").get<int64_t>();
    resume_.epoch = rec.at("epoch").get<int64_t>();
    resume_.step = rec.at("step_in_epoch").get<int64_t>();
    resume_.cut_step = rec.at("cut_step").get<int64_t>();
    resume_.cut_begin = rec.at("cut_begin").get<int64_t>();
    segments_ = adapt_record::segmentsFrom(rec.at("segments"));
    b_noise_ = rec.at("b_noise").get<double>();
    if (rec.at("world_size").get<int64_t>() == comm_.size()) {
      to = restoreSameWorld(rec, plan);
    } else {
      to = resplitForWorld(rec.at("global").get<int64_t>(), plan);
    }
  } catch (const nlohmann::json::exception& e) {
    throw Error(strCat("checkpoint: the adaptive batch record is damaged: ", e.what()));
  }
  if (segments_.empty() || segments_.front().begin_step != 0) {
    throw Error("checkpoint: the adaptive batch record has no history from step 0");
  }
  try {
    history_ = adapt_record::historyFrom(rec.at("history"));
  } catch (const nlohmann::json::exception& e) {
    throw Error(strCat("checkpoint: the adaptive batch record is damaged: ", e.what()));
  }
  const Plan& now = to ? *to : plan;
  if (now.global != segments_.back().global) resumedOtherSplit(step, now, console);
  done_ = progress_ >= static_cast<double>(plan0_.total_steps) - 1e-9;
  return to;
}

// A fresh run, or a checkpoint of a run at G0 only: its steps were all at G0.
void AdaptiveBatch::startAtG0(int64_t step, const Plan& plan) {
  progress_ = static_cast<double>(step);
  last_decision_ = step;
  const int64_t spe = std::max<int64_t>(1, plan.steps_per_epoch);
  resume_.epoch = step / spe;
  resume_.step = resume_.cut_step = step % spe;
  resume_.cut_begin = resume_.step * plan.global;
  beginSegment(0, {plan.global, plan.per_gpu, plan.accum}, -1, 1.0, "start at G0");
}

// The same world: the same split and figures, so the run continues bitwise.
Plan AdaptiveBatch::restoreSameWorld(const nlohmann::ordered_json& rec, const Plan& plan) {
  space_.fixed_step_s = rec.at("fixed_step_s").get<double>();
  fixed_sum_ = rec.at("fixed_sum").get<double>();
  fixed_steps_ = rec.at("fixed_steps").get<int64_t>();
  step_sum_ = rec.at("step_sum").get<double>();
  step_count_ = rec.at("step_count").get<int64_t>();
  space_.fixed_per_gpu = rec.at("fixed_per_gpu").get<int64_t>();
  space_.multiple_of = rec.at("multiple_of").get<int64_t>();
  space_.throughput = adapt_record::throughputFrom(rec.at("throughput"));
  return withGlobal(plan, rec.at("global").get<int64_t>(), rec.at("per_gpu").get<int64_t>(),
                    rec.at("accum").get<int64_t>());
}

// Another world: G kept where it splits over it with this search's sizes, else
// resumeSplit()'s (goodput: the best candidate now; warmup: the largest doubling
// below G); the rest of the epoch is cut anew.
std::optional<Plan> AdaptiveBatch::resplitForWorld(int64_t g, const Plan& plan) {
  const int64_t pos = resume_.cut_begin + (resume_.step - resume_.cut_step) * g;
  const int64_t fixed = space_.fixed_per_gpu;
  const int64_t w = comm_.size();
  std::optional<Plan> to;
  if (const auto pick = resumeSplit(space_, g, b_noise_)) {
    to = withGlobal(plan, pick->global, pick->per_gpu, pick->accum);
  } else if (fixed > 0 && g % (fixed * w) == 0) {
    // A fixed batch.per_gpu and no figures for this world yet: G kept by
    // accumulation (the table fills again from this run's steps).
    to = withGlobal(plan, g, fixed, g / (fixed * w));
  }
  resume_.cut_step = resume_.step;
  resume_.cut_begin = pos;
  return to;
}

// A resume on another world whose G did not split: a new segment from `step`.
void AdaptiveBatch::resumedOtherSplit(int64_t step, const Plan& now, Console* console) {
  const AdaptSplit split{now.global, now.per_gpu, now.accum};
  if (console) {
    const bool fixed = space_.fixed_per_gpu > 0;
    const int64_t g = segments_.back().global, tokens = space_.tokens_per_sample;
    console->line(strCat("adapt: resumed on ", comm_.size(), " ranks: global batch ", g,
                         tokens > 0 ? strCat(" (", g * tokens, " tokens)") : std::string(),
                         " does not split over them with ",
                         fixed ? strCat("batch.per_gpu ", space_.fixed_per_gpu)
                         : space_.mode == BatchAdapt::kWarmup ? std::string("a valid per-GPU batch")
                                                              : std::string("the measured per-GPU batches"),
                         "; ", splitText(split, comm_.size(), space_.tokens_per_sample),
                         " from step ", step + 1));
  }
  beginSegment(step, split, b_noise_,
               statisticalEfficiency(static_cast<double>(now.global),
                                     static_cast<double>(plan0_.global), b_noise_),
               strCat("resumed on ", comm_.size(), " ranks"));
}

}  // namespace batchdist::worker
