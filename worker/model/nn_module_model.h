#pragma once
// What every built-in model (a C++ torch::nn module: mlp, cnn, resnet, gpt) does
// alike as a Model: its named parameters and buffers, train/eval, the device, and
// its saved form (a torch::serialize archive). For the .cc files that build them.

#include <torch/torch.h>

#include <memory>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "worker/model/model.h"

namespace batchdist::worker {

class NnModuleModel : public Model {
 public:
  std::vector<std::pair<std::string, torch::Tensor>> namedParameters() const override {
    std::vector<std::pair<std::string, torch::Tensor>> out;
    for (const auto& item : module_->named_parameters()) out.emplace_back(item.key(), item.value());
    return out;
  }
  std::vector<std::pair<std::string, torch::Tensor>> namedBuffers() const override {
    std::vector<std::pair<std::string, torch::Tensor>> out;
    for (const auto& item : module_->named_buffers()) out.emplace_back(item.key(), item.value());
    return out;
  }
  void train(bool on) override { module_->train(on); }
  void to(const at::Device& device) override { module_->to(device); }
  std::string serialize() override {
    torch::serialize::OutputArchive archive;
    module_->save(archive);
    std::ostringstream out;
    archive.save_to(out);
    return out.str();
  }

 protected:
  explicit NnModuleModel(std::shared_ptr<torch::nn::Module> module) : module_(std::move(module)) {}

 private:
  std::shared_ptr<torch::nn::Module> module_;
};

}  // namespace batchdist::worker
