#pragma once
// Models: the built-ins (mlp, cnn, resnet18/50) and the user's own TorchScript
// module, behind one small interface the trainer uses.

#include <ATen/core/Tensor.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "collective/communicator.h"
#include "worker/config/config.h"

namespace batchdist::worker {

/// What the trainer needs of a model. Parameters and buffers come in a fixed
/// order, the same on every rank.
class Model {
 public:
  virtual ~Model() = default;
  virtual at::Tensor forward(const at::Tensor& x) = 0;
  virtual std::vector<std::pair<std::string, at::Tensor>> namedParameters() const = 0;
  virtual std::vector<std::pair<std::string, at::Tensor>> namedBuffers() const = 0;
  virtual void train(bool on) = 0;
  virtual void to(const at::Device& device) = 0;
  /// The saved form (TorchScript modules as TorchScript, built-ins as a C++
  /// archive), in memory: the caller writes it with writeFileAtomic, so a full
  /// disk is an error with a cause, never a half-written model.pt.
  virtual std::string serialize() = 0;
  virtual bool hasBatchNorm() const = 0;
  /// e.g. "resnet18 (cifar stem), 11.2 M parameters".
  virtual std::string describe() const = 0;

  std::vector<at::Tensor> parameters() const;
  /// The parameters that require grad: what the optimizer and the gradient
  /// synchroniser see (Note [frozen parameters] in worker/train/trainer.cc).
  std::vector<at::Tensor> trainableParameters() const;
  std::vector<at::Tensor> buffers() const;
  /// Parameters then buffers.
  std::vector<at::Tensor> state() const;
};

/// Builds the model of `cfg` for samples of `sample_shape` and `classes` outputs.
/// TorchScript paths are resolved against `base_dir`. `comm` is used by
/// model.sync_batchnorm (may be null otherwise). Throws ConfigError when the model
/// does not fit the data, or the TorchScript file is missing, not TorchScript, or
/// its forward fails on a sample batch (naming the file and the shape tried).
std::unique_ptr<Model> buildModel(const ModelConfig& cfg, const std::vector<int64_t>& sample_shape,
                                  int64_t classes, const std::string& base_dir = "",
                                  collective::Communicator* comm = nullptr);

/// Whether the configured model has BatchNorm layers, before the trainer builds
/// it (loads TorchScript files to look).
bool modelHasBatchNorm(const ModelConfig& cfg, const std::string& base_dir = "");

/// Note [sync batchnorm]: while a SyncBatchNorm layer trains, its batch statistics
/// are summed over all ranks (one allreduce per layer in forward and one in
/// backward), so every rank normalises with the global batch's mean and variance.
/// The switch lets the batch search measure without it (a rank that runs out of
/// memory mid-forward could otherwise strand the others in a collective).
void setSyncBatchNormEnabled(bool enabled);

}  // namespace batchdist::worker
