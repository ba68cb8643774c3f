#include "worker/task/task.h"

#include <torch/torch.h>

#include <cmath>
#include <cstdio>

#include "common/error.h"
#include "worker/common/console.h"
#include "worker/data/data.h"

namespace batchdist::worker {

namespace {

/// "<first>name value<sep><first>name value...", each value to 4 significant digits.
std::string joinMetrics(const Metrics& m, const char* first, const char* sep) {
  std::string out;
  for (const auto& x : m) {
    char v[32];
    std::snprintf(v, sizeof v, "%.4g", x.value);
    out += strCat(out.empty() ? "" : sep, first, x.name, " ", v);
  }
  return out;
}

}  // namespace

std::string Task::describe(const Metrics& m) const { return joinMetrics(m, "eval ", ", "); }

std::string Task::epochFigures(const Metrics& m) const { return joinMetrics(m, "eval_", "  "); }

namespace {

/// Integer labels, one logit per class: cross-entropy, accuracy by argmax.
class Classification final : public Task {
 public:
  TaskKind kind() const override { return TaskKind::kClassification; }
  at::Tensor perSampleLoss(const at::Tensor& out, const at::Tensor& target) const override {
    return torch::nn::functional::cross_entropy(
        out.to(torch::kFloat), target,
        torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kNone));
  }
  int sumCount() const override { return 2; }  // loss, correct
  void addEvalSums(const at::Tensor& out, const at::Tensor& target,
                   std::vector<double>& sums) const override {
    const auto logits = out.to(torch::kFloat);
    sums[0] += torch::nn::functional::cross_entropy(
                   logits, target,
                   torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum))
                   .item<double>();
    sums[1] += logits.argmax(1).eq(target).sum().item<double>();
  }
  Metrics metrics(const std::vector<double>& sums, double samples) const override {
    return {{"accuracy", sums[1] / samples}};
  }
  BestMetric best() const override { return {"accuracy", true}; }
  at::ScalarType targetDtype() const override { return at::kLong; }
  std::string describe(const Metrics& m) const override {
    return strCat("eval accuracy ", formatFixed(100.0 * metricValue(m, "accuracy"), 2), " %");
  }
  std::string epochFigures(const Metrics& m) const override {
    return strCat("eval_acc ", formatFixed(100.0 * metricValue(m, "accuracy"), 2), " %");
  }
};

/// Float targets, N or N x k, one output per target: mean squared error per
/// sample (the mean over its k values); metrics mse and mae over all values.
class Regression final : public Task {
 public:
  TaskKind kind() const override { return TaskKind::kRegression; }
  at::Tensor perSampleLoss(const at::Tensor& out, const at::Tensor& target) const override {
    const auto d = diff(out, target);
    return d.square().mean(1);
  }
  // The loss (the per-sample squared error summed: mse's sum too), the absolute error.
  int sumCount() const override { return 2; }
  void addEvalSums(const at::Tensor& out, const at::Tensor& target,
                   std::vector<double>& sums) const override {
    const auto d = diff(out, target).to(torch::kDouble);
    sums[0] += d.square().mean(1).sum().item<double>();
    sums[1] += d.abs().mean(1).sum().item<double>();
  }
  Metrics metrics(const std::vector<double>& sums, double samples) const override {
    return {{"mse", sums[0] / samples}, {"mae", sums[1] / samples}};
  }
  BestMetric best() const override { return {"mse", false}; }
  at::ScalarType targetDtype() const override { return at::kFloat; }

 private:
  /// outputs - targets as fp32 [n, k] (a target of shape [n] is [n, 1]).
  static at::Tensor diff(const at::Tensor& out, const at::Tensor& target) {
    const int64_t n = out.size(0);
    return out.to(torch::kFloat).reshape({n, -1}) - target.to(torch::kFloat).reshape({n, -1});
  }
};

/// Note [language model]: token windows (Note [tokens]): logits [n, T, vocab]
/// against the next tokens [n, T] (int64). A window's loss is the mean of its T
/// tokens' cross-entropies (fp32), so the trainer's weighted mean over the R real
/// windows of a step (Note [loss normalisation]) is the mean over its R x T real
/// tokens: every window has exactly T, and padding weighs 0 whole windows. The
/// evaluation likewise: the summed window losses over the windows is the mean
/// token cross-entropy (`loss`), and `perplexity` is its exp.
class LanguageModel final : public Task {
 public:
  TaskKind kind() const override { return TaskKind::kLanguageModel; }
  at::Tensor perSampleLoss(const at::Tensor& out, const at::Tensor& target) const override {
    const int64_t n = out.size(0), vocab = out.size(-1);
    return torch::nn::functional::cross_entropy(
               out.to(torch::kFloat).reshape({-1, vocab}), target.reshape({-1}),
               torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kNone))
        .view({n, -1})
        .mean(1);
  }
  int sumCount() const override { return 1; }  // the summed window losses
  void addEvalSums(const at::Tensor& out, const at::Tensor& target,
                   std::vector<double>& sums) const override {
    sums[0] += perSampleLoss(out, target).to(torch::kDouble).sum().item<double>();
  }
  Metrics metrics(const std::vector<double>& sums, double samples) const override {
    const double loss = sums[0] / samples;
    return {{"loss", loss}, {"perplexity", std::exp(loss)}};
  }
  BestMetric best() const override { return {"loss", false}; }
  at::ScalarType targetDtype() const override { return at::kLong; }
  /// A window's T x vocab logits (GPT-2 small: 256 windows are 52 GB in fp32).
  int64_t evalChunk(int64_t per_gpu) const override { return std::max<int64_t>(1, per_gpu); }
  /// "eval loss 2.345, perplexity 10.43".
  std::string describe(const Metrics& m) const override {
    return "eval " + joinMetrics(m, "", ", ");
  }
  /// "eval_perplexity 10.43": the epoch line gives eval_loss already.
  std::string epochFigures(const Metrics& m) const override {
    return joinMetrics({{"perplexity", metricValue(m, "perplexity")}}, "eval_", "  ");
  }
};

}  // namespace

std::unique_ptr<Task> makeTask(TaskKind kind) {
  switch (kind) {
    case TaskKind::kClassification:
      return std::make_unique<Classification>();
    case TaskKind::kRegression:
      return std::make_unique<Regression>();
    case TaskKind::kLanguageModel:
      return std::make_unique<LanguageModel>();
    case TaskKind::kAuto:
      break;
  }
  throw Error("makeTask: task.name auto must be resolved from the data first (chooseTask)");
}

namespace {

/// Note [task choice] for token data: the language model; its head is model.vocab
/// wide (the gpt's is tied to the token embedding).
TaskChoice languageModelChoice(const Config& cfg) {
  TaskChoice c;
  c.kind = TaskKind::kLanguageModel;
  c.why = cfg.task.name == TaskKind::kAuto ? "task.name: auto; tokens are token windows"
                                           : "task.name: language_model";
  c.outputs = cfg.model.vocab;
  if (cfg.model.outputs > 0 && cfg.model.outputs != c.outputs) {
    throw keyError(cfg.source, "model.outputs",
                   strCat(cfg.model.outputs, ", but a language model's head is model.vocab (",
                          c.outputs, ") wide, one logit per token id; leave model.outputs out"));
  }
  return c;
}

}  // namespace

// Note [task choice]: task.name auto takes regression when the data's targets are
// floats (npy: a float32/float64 y.npy), the language model for data.name: tokens
// (token windows, read by model.name: gpt; each of the three without the others is
// a ConfigError naming both keys: languageModelMismatch, also checked at config
// load), and classification otherwise (integer labels: every other source). An
// explicit task.name must match the targets. The head: classification's is the
// class count (model.outputs, if given, at least that); regression's is the
// targets' k (1 for N targets; model.outputs, if given, equal to it); the
// language model's is model.vocab.
TaskChoice chooseTask(const Config& cfg, const DataSplit& data) {
  if (const auto p = languageModelMismatch(cfg)) throw keyError(cfg.source, p->key, p->what);
  if (cfg.data.name == DataName::kTokens) return languageModelChoice(cfg);
  const auto& y = data.train.target;
  const bool floats = y.defined() && y.is_floating_point();
  TaskChoice c;
  if (cfg.task.name == TaskKind::kAuto) {
    c.kind = floats ? TaskKind::kRegression : TaskKind::kClassification;
    c.why = floats ? strCat("task.name: auto; ", toString(cfg.data.name), " has float targets")
                   : strCat("task.name: auto; ", toString(cfg.data.name), " has class labels");
  } else {
    c.kind = cfg.task.name;
    c.why = strCat("task.name: ", toString(c.kind));
    if ((c.kind == TaskKind::kRegression) != floats) {
      throw keyError(cfg.source, "task.name",
                     c.kind == TaskKind::kRegression
                         ? strCat("regression needs float targets, but data.name ",
                                  toString(cfg.data.name),
                                  " gives class labels (regression reads data.name: npy with a "
                                  "float32 or float64 y.npy)")
                         : strCat("classification needs integer class labels, but ",
                                  toString(cfg.data.name),
                                  "'s y.npy holds floats; use task.name: regression (or auto), or "
                                  "integer labels"));
    }
  }
  const int64_t given = cfg.model.outputs;
  if (c.kind == TaskKind::kClassification) {
    const int64_t classes = data.train.classes;
    if (given > 0 && given < classes) {
      throw keyError(cfg.source, "model.outputs",
                     strCat(given, " is below the ", classes, " classes of the data; one output per "
                                   "class (leave it out for exactly ", classes, ")"));
    }
    c.outputs = given > 0 ? given : classes;
  } else {
    const int64_t k = y.dim() == 1 ? 1 : y.size(1);
    if (given > 0 && given != k) {
      throw keyError(cfg.source, "model.outputs",
                     strCat(given, ", but the targets have ", k, " value", k == 1 ? "" : "s",
                            " per sample; one output per value (leave it out for ", k, ")"));
    }
    c.outputs = k;
  }
  return c;
}

}  // namespace batchdist::worker
