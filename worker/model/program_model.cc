#include "worker/model/program_model.h"

#include <torch/torch.h>

#include "common/error.h"
#include "worker/common/torch_error.h"
#include "worker/common/util.h"
#include "worker/model/nn_module_model.h"

namespace batchdist::worker {

namespace {

torch::nn::Module& handedOver(const std::shared_ptr<torch::nn::Module>& module) {
  if (!module) throw ConfigError("batchdist: the module handed over is null");
  return *module;
}

int64_t parameterCount(torch::nn::Module& m) {
  int64_t n = 0;
  for (const auto& p : m.parameters()) n += p.numel();
  return n;
}

/// Note [program parts]: the program's module; forward(x, target) is its loss
/// function, returned as module_loss reads a module's output (a dict: "loss",
/// then the metrics in the function's order).
class ProgramModel final : public NnModuleModel {
 public:
  explicit ProgramModel(std::shared_ptr<ProgramModule> program)
      : NnModuleModel(program->module()), program_(std::move(program)) {}

  at::Tensor forward(const at::Tensor&) override {
    throw Error("model.name: program: the program's module is called through its loss "
                "function, forward(x, target)");
  }
  bool takesTarget() const override { return true; }
  c10::IValue forwardWithTarget(const at::Tensor& x, const at::Tensor& target) override {
    ProgramLoss out;
    try {
      out = program_->loss()(*program_->module(), x, target);
    } catch (const c10::OutOfMemoryError&) {
      throw;  // the search and training handle it by its type
    } catch (const std::bad_alloc&) {
      throw;
    } catch (const std::exception& e) {
      throw TrainingError(strCat("the loss function failed on x of shape ", shapeText(x.sizes().vec()),
                                 " and target of shape ", shapeText(target.sizes().vec()), ": ",
                                 messageOf(e)));
    }
    c10::impl::GenericDict dict(c10::StringType::get(), c10::AnyType::get());
    if (!out.loss.defined()) {
      throw TrainingError("the loss function returned an undefined loss tensor; return one loss "
                          "per sample, a float [N] tensor");
    }
    dict.insert("loss", out.loss);
    for (const auto& [name, value] : out.metrics) {
      if (name == "loss") {
        throw TrainingError("the loss function returned a metric named 'loss', the loss's own "
                            "name; name it otherwise");
      }
      if (!value.defined() || value.numel() != 1) {
        throw TrainingError(strCat("the loss function returned the metric '", name, "' as ",
                                   value.defined() ? strCat("a tensor of shape ", shapeText(value.sizes().vec()))
                                                   : std::string("an undefined tensor"),
                                   "; return the batch's mean, a 0-d tensor"));
      }
      dict.insert(name, value.detach());
    }
    return dict;
  }
  SyncBatchNorm* syncBatchNorm() override { return nullptr; }
  bool hasBatchNorm() const override { return programHasBatchNorm(*program_); }
  std::string describe() const override {
    auto& m = *program_->module();
    return strCat(m.name(), " (the program's module), ", parameterCountText(parameterCount(m)),
                  " parameters");
  }

 private:
  std::shared_ptr<ProgramModule> program_;
};

}  // namespace

std::vector<at::Tensor> moduleState(torch::nn::Module& m) {
  std::vector<at::Tensor> out;
  for (const auto& p : m.parameters()) out.push_back(p);
  for (const auto& b : m.buffers()) out.push_back(b);
  return out;
}

ModuleSnapshot::ModuleSnapshot(torch::nn::Module& m) {
  torch::NoGradGuard no_grad;
  for (const auto& t : moduleState(m)) saved_.push_back(t.detach().to(at::kCPU).clone());
}

void ModuleSnapshot::restore(torch::nn::Module& m) const {
  torch::NoGradGuard no_grad;
  const auto now = moduleState(m);
  if (now.size() != saved_.size()) {
    throw Error(strCat("the program's module has ", now.size(), " parameters and buffers now, but ",
                       saved_.size(), " when it was handed over; do not add or remove any "
                       "while batchdist trains it"));
  }
  for (std::size_t i = 0; i < now.size(); ++i) now[i].copy_(saved_[i]);
}

ProgramModule::ProgramModule(std::shared_ptr<torch::nn::Module> module, LossFunction loss)
    : module_(std::move(module)), loss_(std::move(loss)),
      initial_(handedOver(module_)) {
  if (!loss_) throw ConfigError("batchdist: the loss function handed over is empty");
}

void ProgramModule::restore() const {
  initial_.restore(*module_);
  torch::NoGradGuard no_grad;
  // No gradient of an earlier build (the search's trial steps) reaches this one.
  for (auto& p : module_->parameters()) p.mutable_grad() = at::Tensor();
}

std::string ProgramModule::signature() const {
  std::string out = module_->name();
  for (const auto& item : module_->named_parameters()) {
    out += strCat(" ", item.key(), shapeText(item.value().sizes().vec()));
  }
  for (const auto& item : module_->named_buffers()) {
    out += strCat(" ", item.key(), shapeText(item.value().sizes().vec()));
  }
  return out;
}

std::unique_ptr<Model> buildProgramModel(const std::shared_ptr<ProgramModule>& program) {
  if (!program) throw ConfigError(programOnlyMessage("model.name"));
  program->restore();
  program->module()->train(true);
  return std::make_unique<ProgramModel>(program);
}

bool programHasBatchNorm(const ProgramModule& program) { return moduleHasBatchNorm(*program.module()); }

bool moduleHasBatchNorm(torch::nn::Module& module) {
  const auto is_batchnorm = [](torch::nn::Module& m) {
    return m.as<torch::nn::BatchNorm1d>() || m.as<torch::nn::BatchNorm2d>() ||
           m.as<torch::nn::BatchNorm3d>();
  };
  // Not modules(include_self = true): it needs the module owned by a shared_ptr.
  if (is_batchnorm(module)) return true;
  for (const auto& m : module.modules(/*include_self=*/false)) {
    if (is_batchnorm(*m)) return true;
  }
  return false;
}

}  // namespace batchdist::worker
