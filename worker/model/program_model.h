#pragma once
// Note [program parts]: a program that uses batchdist as a library
// (launcher/include/batchdist/batchdist.h) hands over its own torch::nn::Module
// and loss function and, if it likes, its own data set. They travel in the
// config (model.program, data.program; model.name and data.name: program), so
// every stage that builds a trainer builds it from them, the search's measurer
// included, with no branch of its own:
//  - the model is the module as a Model whose forward(x, target) is the loss
//    function: the task is module_loss (Note [module loss] in
//    worker/task/task.cc), whose rules (one loss per sample where the plan pads,
//    named metrics learned from a first batch) are the same for a TorchScript
//    module and for a C++ one;
//  - the module's state when handed over is kept, and each build starts from it:
//    the batch search's steps never reach training, and every rank starts from
//    the same weights (rank 0's are broadcast anyway);
//  - the program's data set is read through ExampleSource (worker/data/data.h).
// One module object serves one build at a time: the search's measurer is gone
// before the training trainer is built.

#include <ATen/core/Tensor.h>

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "worker/model/model.h"

namespace torch::nn {
class Module;
}  // namespace torch::nn

namespace batchdist::worker {

/// What the loss function returns: the loss ([n] per sample, or the batch's 0-d
/// mean) and named 0-d metrics, in a fixed order.
struct ProgramLoss {
  at::Tensor loss;
  std::vector<std::pair<std::string, at::Tensor>> metrics;
};

/// A module's parameters, then its buffers.
std::vector<at::Tensor> moduleState(torch::nn::Module& m);

/// Copies of a module's parameters and buffers, on the CPU (no device memory
/// while the module trains), put back on demand.
class ModuleSnapshot {
 public:
  explicit ModuleSnapshot(torch::nn::Module& m);
  /// The module's state set back to the copies (on the device it is on now).
  /// Throws Error when it no longer has as many parameters and buffers.
  void restore(torch::nn::Module& m) const;

 private:
  std::vector<at::Tensor> saved_;
};

class ProgramModule {
 public:
  using LossFunction =
      std::function<ProgramLoss(torch::nn::Module&, const at::Tensor& x, const at::Tensor& target)>;
  /// Keeps `module`'s state as it is now (copies of its parameters and buffers).
  ProgramModule(std::shared_ptr<torch::nn::Module> module, LossFunction loss);
  const std::shared_ptr<torch::nn::Module>& module() const { return module_; }
  const LossFunction& loss() const { return loss_; }
  /// The module's parameters and buffers set back to the state it was handed
  /// over in (on the device they are on now), without gradients.
  void restore() const;
  /// The module's type and its parameters' and buffers' names and shapes: what
  /// the search cache's key holds of it (its weights do not change what fits).
  std::string signature() const;

 private:
  std::shared_ptr<torch::nn::Module> module_;
  LossFunction loss_;
  ModuleSnapshot initial_;
};

/// The model of model.name: program: `program`'s module, restored to its
/// initial state. Throws ConfigError when there is none (the batchdist command
/// was given model.name: program).
std::unique_ptr<Model> buildProgramModel(const std::shared_ptr<ProgramModule>& program);

/// Whether the module has BatchNorm layers (1d, 2d, 3d).
bool programHasBatchNorm(const ProgramModule& program);
/// Whether `module` or one of its submodules is a BatchNorm1d, 2d or 3d.
bool moduleHasBatchNorm(torch::nn::Module& module);

}  // namespace batchdist::worker
