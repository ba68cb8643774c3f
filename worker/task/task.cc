#include "worker/task/task.h"

#include <torch/script.h>
#include <torch/torch.h>

#include <cctype>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <optional>
#include <utility>

#include "common/error.h"
#include "worker/common/console.h"
#include "worker/common/util.h"
#include "worker/data/data.h"
#include "worker/data/loader.h"
#include "worker/model/model.h"
#include "worker/model/precision.h"

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

/// "a, b", or "none".
std::string joinNames(const std::vector<std::string>& names) {
  const std::string out = joined(names);
  return out.empty() ? "none" : out;
}

}  // namespace

std::string Task::describe(const Metrics& m) const { return joinMetrics(m, "eval ", ", "); }

at::Tensor Task::forwardLoss(Model& model, const Batch& batch, const Autocast& autocast) const {
  torch::Tensor out;
  {
    AutocastScope scope(autocast.device, autocast.precision);
    out = model.forward(batch.x);
  }
  return (perSampleLoss(out, batch.target) * batch.w).sum();
}

void Task::forwardEvalSums(Model& model, const at::Tensor& x, const at::Tensor& target,
                           const Autocast& autocast, std::vector<double>& sums) const {
  torch::Tensor out;
  {
    AutocastScope scope(autocast.device, autocast.precision);
    out = model.forward(x);
  }
  addEvalSums(out, target, sums);
}

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

/// What a module's forward(x, target) returned (Note [module loss]): its loss, fp32
/// [n] or 0-d (a mean), and its scalar entries by name.
struct ModuleOutput {
  at::Tensor loss;
  std::vector<std::pair<std::string, at::Tensor>> metrics;
};

/// A metric's value: a 0-d or one-element tensor, a float or an int; else none.
std::optional<at::Tensor> scalarOf(const c10::IValue& v) {
  if (v.isTensor() && v.toTensor().numel() == 1) return v.toTensor().reshape({});
  if (v.isDouble()) return at::scalar_tensor(v.toDouble(), at::kDouble);
  if (v.isInt()) return at::scalar_tensor(static_cast<double>(v.toInt()), at::kDouble);
  return std::nullopt;
}

/// A dict key that names a metric in every output (a JSON key, a TensorBoard tag,
/// an HTML id): a letter, then letters, digits, '_', '-' or '.'.
bool metricName(const std::string& s) {
  if (s.empty() || !std::isalpha(static_cast<unsigned char>(s[0]))) return false;
  for (const char c : s) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_' && c != '-' && c != '.') return false;
  }
  return true;
}

/// Note [module loss]: a TorchScript module whose forward takes (x, target) and
/// returns its own loss is trained as it is. What forward may return:
///  - the per-sample loss, a floating tensor of shape [n], one per sample of the
///    batch (F.cross_entropy(..., reduction='none'); a language model: the mean
///    over each window's tokens);
///  - a tuple whose first entry is that; the others are metrics, named metric_1,
///    metric_2, ... by their place in it (a dict names them);
///  - a dict (str keys) with that under "loss"; the other entries are metrics
///    under their keys (a letter, then letters, digits, '_', '-', '.').
/// A metric is a scalar (a 0-d or one-element tensor, a float, an int): the
/// batch's mean. Entries that are not scalars (logits, say) are passed over. The
/// loss is made fp32 (autocast's bf16 or fp16 too) and weighed by the trainer as
/// any task's (Note [loss normalisation]: padding weighs 0), so the update is the
/// mean gradient over the step's real samples, whatever the split.
/// A loss that is already a mean (0-d) is taken as mean x n, the sum over the
/// batch's n samples: exact where every sample weighs 1 (drop; keep's uneven
/// micro-batches), but a mean cannot leave padding out, so under padding
/// (batch.last_batch: pad) it is refused, naming the file and what to return: at
/// set-up when the plan pads (probe), and in any batch that holds padding (a
/// split the adaptive batch or the search tries later).
/// Evaluation: the summed loss, and each metric times its batch's sample count,
/// so metrics() gives means over the validation samples: "loss", then the
/// module's metrics in its order; the best is the lowest loss. The metrics'
/// names are learned at set-up (probe: a forward on two training samples) and
/// must stay the same. The targets are the data's as they are (targetDtype:
/// any; npy's y.npy of any shape: DataContext::module_targets).
class ModuleLoss final : public Task {
 public:
  explicit ModuleLoss(std::string module) : module_(std::move(module)) {}
  TaskKind kind() const override { return TaskKind::kModuleLoss; }
  at::Tensor perSampleLoss(const at::Tensor&, const at::Tensor&) const override {
    throw Error("module_loss: the module computes its own loss (forwardLoss)");
  }
  at::Tensor forwardLoss(Model& model, const Batch& batch, const Autocast& autocast) const override {
    const auto out = run(model, batch.x, batch.target, autocast);
    if (out.loss.dim() > 0) return (out.loss * batch.w).sum();
    if (!batch.w.eq(1).all().item<bool>()) throw meanRefused();
    return out.loss * static_cast<double>(batch.x.size(0));  // the sum: every sample weighs 1
  }
  int sumCount() const override { return 1 + static_cast<int>(names_.size()); }
  void addEvalSums(const at::Tensor&, const at::Tensor&, std::vector<double>&) const override {
    throw Error("module_loss: the module computes its own loss (forwardEvalSums)");
  }
  void forwardEvalSums(Model& model, const at::Tensor& x, const at::Tensor& target,
                       const Autocast& autocast, std::vector<double>& sums) const override;
  Metrics metrics(const std::vector<double>& sums, double samples) const override {
    Metrics m{{"loss", sums[0] / samples}};
    for (std::size_t i = 0; i < names_.size(); ++i) m.push_back({names_[i], sums[i + 1] / samples});
    return m;
  }
  BestMetric best() const override { return {"loss", false}; }
  /// Any: the module takes the data's targets as they are.
  at::ScalarType targetDtype() const override { return at::ScalarType::Undefined; }
  /// A module's memory per sample is unknown (a language model's logits are
  /// large): the micro-batch, known to fit.
  int64_t evalChunk(int64_t per_gpu) const override { return std::max<int64_t>(1, per_gpu); }
  /// "eval loss 0.01234, mae 0.0871".
  std::string describe(const Metrics& m) const override { return "eval " + joinMetrics(m, "", ", "); }
  /// "eval_mae 0.0871": the epoch line gives eval_loss already.
  std::string epochFigures(const Metrics& m) const override {
    return joinMetrics(Metrics(m.begin() + std::min<std::size_t>(1, m.size()), m.end()), "eval_", "  ");
  }
  void probe(Model& model, const Dataset& train, const std::vector<int64_t>& input_shape,
             const Autocast& autocast, bool padded) override;

 private:
  /// forward(x, target) under autocast, unpacked (throws ConfigError on a broken contract).
  ModuleOutput run(Model& model, const at::Tensor& x, const at::Tensor& target,
                   const Autocast& autocast) const;
  ModuleOutput unpack(const c10::IValue& v, int64_t n) const;
  at::Tensor checkedLoss(const c10::IValue& loss, int64_t n) const;
  ConfigError refused(const std::string& what) const {
    // Note [program parts]: a program's module has no file; its loss function speaks.
    return ConfigError(module_.empty() ? strCat("the loss function ", what)
                                       : strCat("model.path: ", module_, ": forward(x, target) ", what));
  }
  ConfigError meanRefused() const {
    return refused("returned the batch's mean loss (a 0-d tensor), which cannot leave out the "
                   "padding of batch.last_batch: pad (samples of weight 0); return one loss per "
                   "sample instead, a [N] tensor (reduction='none', e.g. F.mse_loss(out, target, "
                   "reduction='none').mean(1)), or use batch.last_batch: drop");
  }

  std::string module_;              ///< the TorchScript file ("": a program's module)
  std::vector<std::string> names_;  ///< its metrics, learned by probe()
};

ModuleOutput ModuleLoss::run(Model& model, const at::Tensor& x, const at::Tensor& target,
                             const Autocast& autocast) const {
  c10::IValue out;
  {
    AutocastScope scope(autocast.device, autocast.precision);
    out = model.forwardWithTarget(x, target);
  }
  return unpack(out, x.size(0));
}

ModuleOutput ModuleLoss::unpack(const c10::IValue& v, int64_t n) const {
  ModuleOutput out;
  c10::IValue loss;  // None until found
  if (v.isTensor()) {
    loss = v;
  } else if (v.isTuple() && !v.toTupleRef().elements().empty()) {
    const auto& e = v.toTupleRef().elements();
    loss = e[0];
    for (std::size_t i = 1; i < e.size(); ++i) {
      if (auto s = scalarOf(e[i])) out.metrics.emplace_back(strCat("metric_", i), *s);
    }
  } else if (v.isGenericDict()) {
    for (const auto& kv : v.toGenericDict()) {
      if (!kv.key().isString()) throw refused("returned a dict whose keys are not str");
      const std::string key = kv.key().toStringRef();
      if (key == "loss") {
        loss = kv.value();
      } else if (auto s = scalarOf(kv.value())) {
        if (!metricName(key)) {
          throw refused(strCat("returned a metric named '", key, "'; name metrics with a letter, "
                               "then letters, digits, '_', '-' or '.'"));
        }
        out.metrics.emplace_back(key, *s);
      }
    }
    if (loss.isNone()) throw refused("returned a dict without a \"loss\" entry; put the per-sample loss under \"loss\"");
  } else {
    throw refused(strCat("returned ", v.tagKind(), "; return the per-sample loss (a [N] tensor), "
                         "a tuple whose first entry is it, or a dict with it under \"loss\""));
  }
  out.loss = checkedLoss(loss, n);
  return out;
}

at::Tensor ModuleLoss::checkedLoss(const c10::IValue& loss, int64_t n) const {
  if (!loss.isTensor() || !loss.toTensor().is_floating_point()) {
    throw refused(strCat("returned a loss that is not a floating tensor (", loss.tagKind(),
                         loss.isTensor() ? strCat(" of ", c10::toString(loss.toTensor().scalar_type())) : "",
                         "); return one loss per sample, a float [N] tensor"));
  }
  const auto& t = loss.toTensor();
  if (t.dim() > 0 && !(t.dim() == 1 && t.size(0) == n)) {
    throw refused(strCat("returned a loss of shape ", shapeText(t.sizes().vec()), " for a batch of ",
                         n, " samples; return one loss per sample, shape [", n, "] (reduction='none', "
                         "then a mean over all but the first dimension)"));
  }
  return t.to(at::kFloat);
}

void ModuleLoss::forwardEvalSums(Model& model, const at::Tensor& x, const at::Tensor& target,
                                 const Autocast& autocast, std::vector<double>& sums) const {
  const auto out = run(model, x, target, autocast);
  const auto n = static_cast<double>(x.size(0));
  sums[0] += out.loss.dim() == 0 ? out.loss.item<double>() * n
                                 : out.loss.to(at::kDouble).sum().item<double>();
  std::vector<std::string> names;
  for (const auto& [name, value] : out.metrics) names.push_back(name);
  if (names != names_) {
    throw refused(strCat("returned the metrics (", joinNames(names), ") in evaluation, but (",
                         joinNames(names_), ") on its first batch; return the same every time"));
  }
  for (std::size_t i = 0; i < names_.size(); ++i) {
    sums[i + 1] += out.metrics[i].second.item<double>() * n;
  }
}

void ModuleLoss::probe(Model& model, const Dataset& train, const std::vector<int64_t>& input_shape,
                       const Autocast& autocast, bool padded) {
  const int64_t n = std::min<int64_t>(2, train.size());
  if (n == 0) return;
  std::vector<int64_t> in{n};
  in.insert(in.end(), input_shape.begin(), input_shape.end());
  // Inputs of zeros (token ids 0 for token windows), as buildModel tries a model;
  // the targets are real: their dtype and shape are the data's. A program's data
  // (Note [program data]) is tried as it is: its inputs are of any dtype.
  at::Tensor x, target;
  if (train.as_given) {
    std::vector<int64_t> first(static_cast<std::size_t>(n));
    std::iota(first.begin(), first.end(), int64_t{0});
    auto [bx, bt] = train.batch(first);
    x = bx.to(autocast.device);
    target = bt.to(autocast.device);
  } else {
    x = at::zeros(in, at::TensorOptions()
                          .dtype(train.tokens ? at::kLong : at::kFloat)
                          .device(autocast.device));
    target = train.targets(at::arange(n, at::kLong)).to(autocast.device);
  }
  ModuleOutput out;
  try {
    torch::NoGradGuard no_grad;
    model.train(false);
    out = run(model, x, target, autocast);
    model.train(true);
  } catch (const TrainingError& e) {
    throw ConfigError(strCat(e.what(), train.as_given ? " (the first training samples)"
                                                     : " (a sample batch: inputs of zeros, the "
                                                       "first training targets)"));
  }
  names_.clear();
  for (const auto& [name, value] : out.metrics) names_.push_back(name);
  if (padded && out.loss.dim() == 0) throw meanRefused();
}

}  // namespace

std::unique_ptr<Task> makeTask(TaskKind kind, const std::string& module) {
  switch (kind) {
    case TaskKind::kClassification:
      return std::make_unique<Classification>();
    case TaskKind::kRegression:
      return std::make_unique<Regression>();
    case TaskKind::kLanguageModel:
      return std::make_unique<LanguageModel>();
    case TaskKind::kModuleLoss:
      return std::make_unique<ModuleLoss>(module);
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

/// Note [program parts]: a program's module trains with its loss function:
/// module_loss, whatever the data.
TaskChoice programLossChoice(const Config& cfg) {
  if (cfg.task.name != TaskKind::kAuto && cfg.task.name != TaskKind::kModuleLoss) {
    throw keyError(cfg.source, "task.name",
                   strCat(toString(cfg.task.name), ", but the program's module trains with the loss "
                          "function it was handed over with; leave task.name out (or module_loss)"));
  }
  if (cfg.model.outputs > 0) {
    throw keyError(cfg.source, "model.outputs",
                   strCat(cfg.model.outputs, ", but the program's module returns its own loss: "
                          "there is no head to size; leave model.outputs out"));
  }
  TaskChoice c;
  c.kind = TaskKind::kModuleLoss;
  c.why = "the program's module and loss function";
  return c;
}

/// Note [task choice] for a TorchScript model (or task.name: module_loss):
/// module_loss when its forward takes the target; none (the other rules decide)
/// when it takes one input.
std::optional<TaskChoice> moduleLossChoice(const Config& cfg) {
  const bool script = cfg.model.name == ModelName::kTorchscript;
  const TaskKind task = cfg.task.name;
  if (cfg.model.name == ModelName::kProgram) return programLossChoice(cfg);
  const auto& path = cfg.model.path;
  if (!script || !modelTakesTarget(cfg.model, cfg.base_dir)) {
    if (task == TaskKind::kModuleLoss) {
      throw keyError(cfg.source, "task.name", script
          ? strCat("module_loss calls forward(x, target), but ", path, "'s forward takes one input "
                   "(x); return the loss from forward(x, target) (docs/models.md), or use task.name: auto")
          : strCat("module_loss trains a TorchScript module's own loss, but model.name is ",
                   toString(cfg.model.name), "; use model.name: torchscript, a module whose "
                   "forward(x, target) returns it (docs/models.md), or task.name: auto"));
    }
    if (script && cfg.data.name == DataName::kTokens) {
      throw keyError(cfg.source, "model.path",
                     strCat(path, ": forward takes one input (x), but on data.name: tokens a "
                                  "TorchScript module trains with its own loss: forward(x, target) "
                                  "returning one loss per window (docs/models.md); or use model.name: gpt"));
    }
    return std::nullopt;
  }
  if (task != TaskKind::kAuto && task != TaskKind::kModuleLoss) {
    throw keyError(cfg.source, "task.name",
                   strCat(toString(task), " computes the loss from the model's outputs, but ", path,
                          "'s forward takes (x, target) and returns its own loss; use task.name: "
                          "module_loss (or auto)"));
  }
  if (cfg.model.outputs > 0) {
    throw keyError(cfg.source, "model.outputs",
                   strCat(cfg.model.outputs, ", but ", path, " returns its own loss: there is no "
                          "head to size; leave model.outputs out"));
  }
  TaskChoice c;
  c.kind = TaskKind::kModuleLoss;
  c.why = task == TaskKind::kAuto ? strCat("task.name: auto; ", path, "'s forward takes (x, target)")
                                  : "task.name: module_loss";
  c.module = resolvePath(path, cfg.base_dir);
  return c;
}

}  // namespace

bool trainsModuleLoss(const Config& cfg) {
  if (cfg.model.name == ModelName::kProgram) return true;  // Note [program parts]
  return cfg.model.name == ModelName::kTorchscript &&
         (cfg.task.name == TaskKind::kAuto || cfg.task.name == TaskKind::kModuleLoss) &&
         modelTakesTarget(cfg.model, cfg.base_dir);
}

// Note [task choice]: task.name auto takes module_loss for a TorchScript model
// whose forward takes the target, forward(x, target) (Note [module loss]; on any
// data, token windows included; a one-input module on token windows is refused),
// regression when the data's targets are floats (npy: a float32/float64 y.npy),
// the language model for data.name: tokens (token windows, read by model.name:
// gpt; each of the three without the others is a ConfigError naming both keys:
// languageModelMismatch, also checked at config load), and classification
// otherwise (integer labels: every other source). An explicit task.name must
// match the targets and the model. The head: classification's is the class count
// (model.outputs, if given, at least that); regression's is the targets' k (1 for
// N targets; model.outputs, if given, equal to it); the language model's is
// model.vocab; a module with its own loss has none (model.outputs refused).
TaskChoice chooseTask(const Config& cfg, const DataSplit& data) {
  if (const auto p = languageModelMismatch(cfg)) throw keyError(cfg.source, p->key, p->what);
  if (cfg.model.name == ModelName::kTorchscript || cfg.model.name == ModelName::kProgram ||
      cfg.task.name == TaskKind::kModuleLoss) {
    if (auto c = moduleLossChoice(cfg)) return *c;
  }
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
