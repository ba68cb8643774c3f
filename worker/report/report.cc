#include "worker/report/report.h"

#include <algorithm>

#include "common/error.h"
#include "worker/common/util.h"
#include "worker/report/metrics_log.h"

namespace batchdist::worker {
namespace {

/// Unknown (negative) estimates as null.
nlohmann::ordered_json positiveOrNull(double v) {
  return v > 0 ? nlohmann::ordered_json(v) : nlohmann::ordered_json();
}

/// Note [tokens per sample]: on token windows B_simple and the global batch in
/// tokens too (b_simple_tokens, global_batch_tokens); other samples: no such keys.
nlohmann::ordered_json noiseJson(const NoiseScaleResult& n, int64_t tokens_per_sample) {
  const auto tokens = static_cast<double>(tokens_per_sample);
  nlohmann::ordered_json o{{"measured", n.measured}, {"b_simple", positiveOrNull(n.b_simple)}};
  if (tokens > 0) o["b_simple_tokens"] = positiveOrNull(n.b_simple * tokens);
  o["global_batch"] = n.b_big;
  if (tokens > 0) o["global_batch_tokens"] = n.b_big * tokens_per_sample;
  o.update(nlohmann::ordered_json{{"per_rank_batch", n.b_small},
                                  {"global_over_b_simple",
                                   n.b_simple > 0 ? nlohmann::ordered_json(n.b_big / n.b_simple)
                                                  : nlohmann::ordered_json()},
                                  {"grad_sq", n.grad_sq},
                                  {"trace", n.trace},
                                  {"steps", n.steps}});
  if (!n.why_not.empty()) o["why_not"] = n.why_not;
  return o;
}

nlohmann::ordered_json historyJson(const TrainResult& r, int64_t tokens_per_sample) {
  auto out = nlohmann::ordered_json::array();
  for (const auto& h : r.history) {
    nlohmann::ordered_json e{{"epoch", h.epoch + 1},
                             {"train_loss", h.train_loss},
                             {"eval_loss", h.eval_loss}};
    addEvalMetrics(h.eval_metrics, e);
    e["samples_per_s"] = h.samples_per_s;
    if (tokens_per_sample > 0) e["tokens_per_s"] = h.samples_per_s * static_cast<double>(tokens_per_sample);
    e["seconds"] = h.seconds;
    e["noise_scale"] = positiveOrNull(h.noise_scale);
    out.push_back(std::move(e));
  }
  return out;
}

nlohmann::ordered_json timeJson(const TimeBreakdown& t) {
  const double total = t.total();
  return {{"data_wait_s", t.data_wait},
          {"compute_s", t.compute},
          {"comm_s", t.comm},
          {"skew_s", t.skew},
          {"data_wait_fraction", shareOf(t.data_wait, total)},
          {"compute_fraction", shareOf(t.compute, total)},
          {"comm_fraction", shareOf(t.comm, total)},
          {"skew_fraction", shareOf(t.skew, total)}};
}

/// Note [oom back-off]: one entry per back-off; `to` is null when nothing was left.
nlohmann::ordered_json oomJson(const TrainResult& r) {
  auto out = nlohmann::ordered_json::array();
  for (const auto& b : r.oom_backoffs) {
    nlohmann::ordered_json j{{"step", b.step},
                             {"rank", b.ranks.empty() ? -1 : b.ranks.front()},
                             {"ranks", b.ranks},
                             {"from", strCat(b.from_per_gpu, "x", b.from_accum)},
                             {"to", nullptr},
                             {"from_per_gpu", b.from_per_gpu},
                             {"from_accum", b.from_accum},
                             {"to_per_gpu", b.to_per_gpu},
                             {"to_accum", b.to_accum},
                             {"peak_mb", b.peak_mb},
                             {"capacity_mb", b.capacity_mb},
                             {"retry", b.retry}};
    if (b.to_per_gpu > 0) j["to"] = strCat(b.to_per_gpu, "x", b.to_accum);
    out.push_back(j);
  }
  return out;
}

/// The keys every report opens with: what ran, and where.
nlohmann::ordered_json reportHeader(const RunInfo& info) {
  return {{"batchdist_version", BATCHDIST_VERSION}, {"torch_version", info.torch_version},
          {"world_size", info.world_size},          {"hosts", info.hosts},
          {"backend", info.backend},                {"device", info.device},
          {"cpu_blas", info.cpu_blas},              {"data", info.data_origin}};
}

}  // namespace

/// Note [mfu]: mfu (when known), flops_per_sample and the peak (when known), its source.
static void addMfu(const Yardstick& y, double samples_per_s, nlohmann::ordered_json& o) {
  if (y.known()) o["mfu"] = y.mfu(samples_per_s);
  if (y.flops_per_sample > 0) o["flops_per_sample"] = y.flops_per_sample;
  if (y.peak_flops > 0) o["peak_tflops"] = y.peak_flops / 1e12;
  if (!y.peak_source.empty()) o["peak_source"] = y.peak_source;
}

nlohmann::ordered_json runReport(const Config& cfg, const Plan& plan, const TrainResult& r,
                                 const RunInfo& info) {
  auto o = reportHeader(info);
  o["task"] = r.task;
  // Note [tokens per sample]: tokens beside the batch and the rate, for token samples only.
  const auto tokens = static_cast<double>(plan.tokens_per_sample);
  o.update(nlohmann::ordered_json{{"per_gpu_batch", plan.per_gpu},
                           {"accum_steps", plan.accum},
                           {"global_batch", plan.global}});
  if (tokens > 0) o["tokens_per_step"] = plan.tokensPerStep();
  o.update(nlohmann::ordered_json{{"lr", plan.lr},
                           {"warmup_steps", plan.warmup_steps},
                           {"schedule", toString(plan.schedule)},
                           {"precision", toString(cfg.train.precision)},
                           {"shard", toString(cfg.dist.shard)},
                           {"recompute", toString(cfg.model.recompute)},
                           {"memory_format", info.channels_last ? "channels_last" : "contiguous"},
                           {"epochs", r.epochs},
                           {"steps", r.steps},
                           {"samples", r.samples},
                           {"samples_per_s", r.samples_per_s}});
  if (tokens > 0) {
    o["tokens"] = r.samples * plan.tokens_per_sample;
    o["tokens_per_s"] = r.samples_per_s * tokens;
  }
  addMfu(info.yardstick, r.samples_per_s, o);
  o.update(nlohmann::ordered_json{{"train_loss", r.train_loss}, {"eval_loss", r.eval_loss}});
  addEvalMetrics(r.eval_metrics, o);
  o.update(nlohmann::ordered_json{{"best_metric", r.best_metric},
                                  {"best_higher", r.best_higher},
                                  {"validation_samples", info.validation_samples},
                                  {"wall_s", r.wall_s},
                                  {"completed", r.completed},
                                  {"model_path", info.model_path}});
  if (!r.completed) o["stopped_by"] = info.stopped_by;
  if (!r.failure.empty()) o["error"] = r.failure;
  o["oom_backoffs"] = oomJson(r);
  o["oom_retries"] = r.oom_retries;
  o["plan"] = planJson(plan);
  o["history"] = historyJson(r, plan.tokens_per_sample);
  o["time_breakdown"] = timeJson(r.time);
  o["noise_scale"] = noiseJson(r.noise, plan.tokens_per_sample);
  if (!r.batch_history.empty()) {
    // batch.adapt: goodput or warmup (Note [adaptive training] in worker/train/adapt/adaptive_batch.h).
    auto changes = nlohmann::ordered_json::array();
    for (const auto& c : r.batch_history) {
      changes.push_back({{"step", c.step},
                         {"global_batch", c.global},
                         {"per_gpu_batch", c.per_gpu},
                         {"accum", c.accum},
                         {"lr_gain", c.gain},
                         {"noise_scale", positiveOrNull(c.noise_scale)},
                         {"efficiency", c.efficiency},
                         {"why", c.why}});
    }
    o["batch_history"] = changes;
    o["progress"] = r.progress;
  }
  o["diagnosis"] = info.diagnosis;
  if (cfg.data.decoded()) {
    const auto& d = r.data;
    o["data_pipeline"] = {{"source", toString(cfg.data.name)},
                          {"train_samples", info.train_samples},
                          {"classes", info.classes},
                          {"workers", d.workers},
                          {"loader_samples_per_s", d.capacity_samples_per_s},
                          {"read_s", d.stages.read},
                          {"decode_s", d.stages.decode},
                          {"transform_s", d.stages.transform},
                          {"bytes", d.stages.bytes}};
    if (d.cache_mb >= 0) {
      o["data_pipeline"]["cache_mb"] = d.cache_mb;
      o["data_pipeline"]["cache_hits"] = d.cache_hits;
    }
    auto first = nlohmann::ordered_json::array();
    for (const auto& e : d.first_errors) first.push_back({{"file", e.where}, {"reason", e.reason}});
    o["data_errors"] = {{"count", d.errors}, {"first", first}};
  }
  // Note [memory by part]: rank 0's; "rest" is the peak less the three parts.
  const auto& um = r.update_memory;
  o["memory"] = {{"peak_mb", r.peak_memory_mb},
                 {"total_mb", r.memory_total_mb},
                 {"gpu_utilization", r.gpu_utilization},
                 {"parameters_mb", um.parameters_mb},
                 {"gradients_mb", um.gradients_mb},
                 {"optimizer_state_mb", um.optimizer_state_mb},
                 {"rest_mb", std::max(0.0, r.peak_memory_mb - um.fixedMb())}};
  if (cfg.train.precision == Precision::kFp16) {
    o["loss_scaler"] = {{"scale", r.loss_scale}, {"skipped_steps", r.skipped_steps}};
  }
  if (cfg.optim.clip_grad_norm > 0) {
    const auto& c = r.grad_clip;
    o["grad_clip"] = {{"clip_grad_norm", cfg.optim.clip_grad_norm}, {"steps", c.steps},
                      {"clipped_steps", c.clipped}, {"last_norm", c.last_norm},
                      {"max_norm", c.max_norm}};
  }
  if (info.search) {
    const auto& s = *info.search;
    o["search"] = {{"chosen", s.chosen},
                   {"cached", s.cached},
                   {"candidates", s.candidates.size()},
                   {"timed_steps", s.timed_steps},
                   {"seconds", s.seconds},
                   {"rounds", s.rounds},
                   {"rule", s.rule},
                   {"loader_samples_per_s", s.loader_sps},
                   {"data_bound", !s.data_bound.empty()}};
    if (!s.levers.empty()) {  // Note [lever search]
      o["search"]["chosen_levers"] = leversJson(s.chosen_levers);
      auto outcomes = nlohmann::ordered_json::array();
      for (const auto& l : s.levers) {
        outcomes.push_back({{"levers", leversText(l.levers)},
                            {"predicted_max_per_gpu", l.predicted_max},
                            {"measured_max_per_gpu", l.measured_max},
                            {"verdict", l.verdict}});
      }
      o["search"]["levers"] = outcomes;
    }
    for (const auto& c : s.candidates) {
      if (!isChosen(s, c) || c.failed) continue;
      o["search"]["chosen_samples_per_s"] = c.global_sps;
      if (tokens > 0) o["search"]["chosen_tokens_per_s"] = c.global_sps * tokens;
      o["search"]["chosen_ci_low"] = c.sps_low;
      o["search"]["chosen_ci_high"] = c.sps_high;
    }
  }
  if (!info.resumed_path.empty()) {
    o["resumed_from"] = {{"path", info.resumed_path},
                         {"step", info.resumed_step},
                         {"world_size_then", info.resumed_world},
                         {"world_size_now", info.world_size}};
  }
  auto checkpoints = nlohmann::ordered_json::array();
  for (const auto& c : r.checkpoints) {
    // Note [background checkpoint]: seconds is what the step waited.
    nlohmann::ordered_json j{{"step", c.step}, {"path", c.path}, {"seconds", c.seconds},
                             {"write_seconds", c.write_seconds}, {"background", c.background},
                             {"bytes", c.bytes}, {"on_signal", c.on_signal}};
    if (!c.error.empty()) j["error"] = c.error;
    checkpoints.push_back(j);
  }
  o["checkpoints"] = checkpoints;
  o["checkpoint_seconds"] = r.checkpoint_s;
  // Note [step profiler]: rank 0's trace; every rank wrote its own beside it.
  if (cfg.profile.on()) o["profile"] = r.profile.json();
  if (!r.system.empty()) {  // Note [system metrics]
    auto ranks = nlohmann::ordered_json::array();
    for (const auto& x : r.system) ranks.push_back(rankSystemJson(x));
    o["system"] = {{"sample_s", cfg.report.sample_s}, {"ranks", std::move(ranks)}};
  }
  o["config"] = cfg.resolved;
  return o;
}

nlohmann::ordered_json searchStoppedReport(const Config& cfg, const RunInfo& info,
                                           int64_t last_per_gpu, double search_seconds) {
  auto o = reportHeader(info);
  o.update(nlohmann::ordered_json{{"precision", toString(cfg.train.precision)},
                           {"steps", 0},
                           {"completed", false},
                           {"stopped_by", info.stopped_by},
                           {"stopped_during", "batch search"},
                           {"search", {{"stopped_after_per_gpu", last_per_gpu},
                                       {"seconds", search_seconds}}},
                           {"diagnosis", info.diagnosis},
                           {"config", cfg.resolved}});
  return o;
}

std::string metricsJsonl(const TrainResult& r) {
  std::string out;
  for (const auto& m : r.metrics) out += metricsLine(m);
  return out;
}

}  // namespace batchdist::worker
