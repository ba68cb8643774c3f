#include "worker/model/model.h"

#include <torch/script.h>
#include <torch/torch.h>

#include <cmath>
#include <exception>
#include <filesystem>
#include <map>
#include <mutex>
#include <numeric>
#include <sstream>

#include "common/error.h"
#include "worker/common/files.h"
#include "worker/common/util.h"
#include "worker/config/config.h"
#include "worker/model/flops.h"
#include "worker/model/gpt.h"
#include "worker/model/nn_module_model.h"
#include "worker/model/program_model.h"
#include "worker/model/recompute.h"

namespace batchdist::worker {
namespace nn = torch::nn;

std::vector<torch::Tensor> Model::parameters() const {
  std::vector<torch::Tensor> out;
  for (auto& [name, t] : namedParameters()) out.push_back(t);
  return out;
}
std::vector<torch::Tensor> Model::trainableParameters() const {
  std::vector<torch::Tensor> out;
  for (auto& [name, t] : namedParameters()) {
    if (t.requires_grad()) out.push_back(t);
  }
  return out;
}
std::vector<torch::Tensor> Model::buffers() const {
  std::vector<torch::Tensor> out;
  for (auto& [name, t] : namedBuffers()) out.push_back(t);
  return out;
}
std::vector<torch::Tensor> Model::state() const {
  auto out = parameters();
  for (auto& b : buffers()) out.push_back(b);
  return out;
}

c10::IValue Model::forwardWithTarget(const torch::Tensor& x, const torch::Tensor& target) {
  throw Error(strCat(describe(), ": forward takes one input, not (x, target)"));
}

std::string parameterCountText(int64_t n) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f M", n / 1e6);
  return buf;
}

namespace {

/// The gradient of a sum over the ranks: the incoming gradient summed over the
/// ranks (AllreduceSum's and ReplayedAllreduceSum's backward).
torch::Tensor allreducedGradient(torch::autograd::AutogradContext* ctx, const torch::Tensor& grad) {
  auto* comm = reinterpret_cast<collective::Communicator*>(ctx->saved_data["comm"].toInt());
  auto g = grad.contiguous().clone();
  comm->allreduce(g, collective::ReduceOp::kSum);
  return g;
}

/// allreduce(SUM) whose gradient is again an allreduce(SUM): the building block of
/// SyncBatchNorm (Note [sync batchnorm]).
struct AllreduceSum : public torch::autograd::Function<AllreduceSum> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, torch::Tensor x,
                               int64_t comm_ptr) {
    ctx->saved_data["comm"] = comm_ptr;
    auto y = x.clone();
    reinterpret_cast<collective::Communicator*>(comm_ptr)->allreduce(y, collective::ReduceOp::kSum);
    return y;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    return {allreducedGradient(ctx, grads[0]), torch::Tensor()};
  }
};

/// Note [recompute replay]: the global sums the first pass allreduced, as
/// AllreduceSum's output; its gradient is again an allreduce(SUM), as AllreduceSum's.
struct ReplayedAllreduceSum : public torch::autograd::Function<ReplayedAllreduceSum> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, torch::Tensor x,
                               torch::Tensor kept, int64_t comm_ptr) {
    ctx->saved_data["comm"] = comm_ptr;
    return kept.clone();
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    return {allreducedGradient(ctx, grads[0]), torch::Tensor(), torch::Tensor()};
  }
};

/// BatchNorm over dim 1 of (N, C) or (N, C, H, W) inputs; with `sync`, the batch
/// statistics of training mode are global over the ranks (Note [sync batchnorm]).
/// Under recompute, the replay normalises as the first pass did and updates no
/// running statistics (Note [recompute replay]).
class BatchNormLayerImpl : public nn::Module {
 public:
  BatchNormLayerImpl(int64_t channels, SyncBatchNorm* sync) : channels_(channels), sync_(sync) {
    weight_ = register_parameter("weight", torch::ones({channels}));
    bias_ = register_parameter("bias", torch::zeros({channels}));
    running_mean_ = register_buffer("running_mean", torch::zeros({channels}));
    running_var_ = register_buffer("running_var", torch::ones({channels}));
    num_batches_tracked_ = register_buffer("num_batches_tracked", torch::zeros({}, torch::kLong));
    if (sync_) sync_->addLayer(2 * channels + 1);
  }

  torch::Tensor forward(const torch::Tensor& x) {
    const bool replay = is_training() && recomputePass() == RecomputePass::kReplay;
    if (!is_training() || sync_ == nullptr || !sync_->synchronising()) {
      if (replay) {  // the batch's statistics, no running ones to update
        return torch::batch_norm(x, weight_, bias_, {}, {}, /*training=*/true, kMomentum, kEps,
                                 /*cudnn_enabled=*/true);
      }
      if (is_training()) num_batches_tracked_.add_(1);
      return torch::batch_norm(x, weight_, bias_, running_mean_, running_var_, is_training(),
                               kMomentum, kEps, /*cudnn_enabled=*/true);
    }
    return syncForward(x, replay);
  }

 private:
  /// Note [sync batchnorm]: the global batch statistics, from one allreduce of
  /// the per-channel sums (the replay takes the first pass's instead).
  torch::Tensor syncForward(const torch::Tensor& x, bool replay) {
    std::vector<int64_t> dims{0};
    for (int64_t d = 2; d < x.dim(); ++d) dims.push_back(d);
    const auto xf = x.to(torch::kFloat);
    const double local_n = static_cast<double>(x.numel() / channels_);
    auto packed = torch::cat({xf.sum(dims), (xf * xf).sum(dims),
                              torch::full({1}, local_n, xf.options())});
    const auto comm = reinterpret_cast<int64_t>(&sync_->comm());
    torch::Tensor total;
    if (replay) {
      total = ReplayedAllreduceSum::apply(packed, takeReplayed(), comm);
    } else {
      sync_->beforeCollective(packed.numel());  // Note [sync batchnorm failure]
      total = AllreduceSum::apply(packed, comm);
      keepForReplay(total);  // under recompute's first pass only
    }
    const auto n = total.narrow(0, 2 * channels_, 1);
    const auto mean = total.narrow(0, 0, channels_) / n;
    const auto var = (total.narrow(0, channels_, channels_) / n - mean * mean).clamp_min(0);
    if (!replay) {
      torch::NoGradGuard no_grad;
      const double count = n.item<double>();
      running_mean_.mul_(1 - kMomentum).add_(mean.detach(), kMomentum);
      running_var_.mul_(1 - kMomentum).add_(var.detach() * (count / std::max(1.0, count - 1)),
                                            kMomentum);
      num_batches_tracked_.add_(1);
    }
    std::vector<int64_t> shape(x.dim(), 1);
    shape[1] = channels_;
    auto y = (xf - mean.view(shape)) * torch::rsqrt(var.view(shape) + kEps) * weight_.view(shape) +
             bias_.view(shape);
    return y.to(x.scalar_type());
  }

  static constexpr double kMomentum = 0.1;
  static constexpr double kEps = 1e-5;
  int64_t channels_;
  SyncBatchNorm* sync_;
  torch::Tensor weight_, bias_, running_mean_, running_var_, num_batches_tracked_;
};
TORCH_MODULE(BatchNormLayer);

nn::Conv2d conv(int64_t in, int64_t out, int64_t k, int64_t stride, int64_t pad) {
  return nn::Conv2d(nn::Conv2dOptions(in, out, k).stride(stride).padding(pad).bias(false));
}

class BasicBlockImpl : public nn::Module {
 public:
  static constexpr int64_t kExpansion = 1;
  BasicBlockImpl(int64_t in, int64_t width, int64_t stride, SyncBatchNorm* comm) {
    conv1_ = register_module("conv1", conv(in, width, 3, stride, 1));
    bn1_ = register_module("bn1", BatchNormLayer(width, comm));
    conv2_ = register_module("conv2", conv(width, width, 3, 1, 1));
    bn2_ = register_module("bn2", BatchNormLayer(width, comm));
    if (stride != 1 || in != width) {
      down_conv_ = register_module("down_conv", conv(in, width, 1, stride, 0));
      down_bn_ = register_module("down_bn", BatchNormLayer(width, comm));
    }
  }
  torch::Tensor forward(const torch::Tensor& x) {
    auto out = torch::relu(bn1_(conv1_(x)));
    out = bn2_(conv2_(out));
    return torch::relu(out + (down_conv_ ? down_bn_(down_conv_(x)) : x));
  }

 private:
  nn::Conv2d conv1_{nullptr}, conv2_{nullptr}, down_conv_{nullptr};
  BatchNormLayer bn1_{nullptr}, bn2_{nullptr}, down_bn_{nullptr};
};
TORCH_MODULE(BasicBlock);

class BottleneckImpl : public nn::Module {
 public:
  static constexpr int64_t kExpansion = 4;
  BottleneckImpl(int64_t in, int64_t width, int64_t stride, SyncBatchNorm* comm) {
    conv1_ = register_module("conv1", conv(in, width, 1, 1, 0));
    bn1_ = register_module("bn1", BatchNormLayer(width, comm));
    conv2_ = register_module("conv2", conv(width, width, 3, stride, 1));
    bn2_ = register_module("bn2", BatchNormLayer(width, comm));
    conv3_ = register_module("conv3", conv(width, width * kExpansion, 1, 1, 0));
    bn3_ = register_module("bn3", BatchNormLayer(width * kExpansion, comm));
    if (stride != 1 || in != width * kExpansion) {
      down_conv_ = register_module("down_conv", conv(in, width * kExpansion, 1, stride, 0));
      down_bn_ = register_module("down_bn", BatchNormLayer(width * kExpansion, comm));
    }
  }
  torch::Tensor forward(const torch::Tensor& x) {
    auto out = torch::relu(bn1_(conv1_(x)));
    out = torch::relu(bn2_(conv2_(out)));
    out = bn3_(conv3_(out));
    return torch::relu(out + (down_conv_ ? down_bn_(down_conv_(x)) : x));
  }

 private:
  nn::Conv2d conv1_{nullptr}, conv2_{nullptr}, conv3_{nullptr}, down_conv_{nullptr};
  BatchNormLayer bn1_{nullptr}, bn2_{nullptr}, bn3_{nullptr}, down_bn_{nullptr};
};
TORCH_MODULE(Bottleneck);

/// ResNet (He et al. 2016). The cifar stem (3x3/1, no pooling) keeps 32x32
/// inputs large enough for four stages; the imagenet stem is 7x7/2 + max pool.
class ResNetImpl : public nn::Module {
 public:
  template <typename Block>
  static nn::Sequential stage(int64_t& in, int64_t width, int64_t blocks, int64_t stride,
                              SyncBatchNorm* comm) {
    nn::Sequential s;
    for (int64_t b = 0; b < blocks; ++b) {
      s->push_back(Block(in, width, b == 0 ? stride : 1, comm));
      in = width * Block::Impl::kExpansion;
    }
    return s;
  }

  ResNetImpl(bool bottleneck, std::vector<int64_t> layers, int64_t in_ch, int64_t classes,
             bool imagenet_stem, SyncBatchNorm* comm, bool recompute = false)
      : recompute_(recompute) {
    stem_ = register_module("stem", nn::Sequential());
    if (imagenet_stem) {
      stem_->push_back(conv(in_ch, 64, 7, 2, 3));
    } else {
      stem_->push_back(conv(in_ch, 64, 3, 1, 1));
    }
    stem_->push_back(BatchNormLayer(64, comm));
    stem_->push_back(nn::ReLU());
    if (imagenet_stem) stem_->push_back(nn::MaxPool2d(nn::MaxPool2dOptions(3).stride(2).padding(1)));
    int64_t in = 64;
    const int64_t widths[] = {64, 128, 256, 512};
    for (int i = 0; i < 4; ++i) {
      auto s = bottleneck ? stage<Bottleneck>(in, widths[i], layers[i], i == 0 ? 1 : 2, comm)
                          : stage<BasicBlock>(in, widths[i], layers[i], i == 0 ? 1 : 2, comm);
      stages_.push_back(register_module("layer" + std::to_string(i + 1), s));
    }
    fc_ = register_module("fc", nn::Linear(in, classes));
  }

  torch::Tensor forward(torch::Tensor x) {
    x = stem_->forward(x);
    for (auto& s : stages_) {
      if (!recompute_) {
        x = s->forward(x);
        continue;
      }
      // Note [activation recompute]: each residual block keeps only its input.
      for (auto& block : *s) {
        auto run = [block](const torch::Tensor& in) mutable { return block.forward(in); };
        x = recomputed(run, x, block.ptr()->parameters());
      }
    }
    x = torch::adaptive_avg_pool2d(x, {1, 1}).flatten(1);
    return fc_(x);
  }
  void setRecompute(bool on) { recompute_ = on; }

 private:
  bool recompute_;
  nn::Sequential stem_{nullptr};
  std::vector<nn::Sequential> stages_;
  nn::Linear fc_{nullptr};
};
TORCH_MODULE(ResNet);

bool moduleHasBatchNorm(const nn::Module& m) {
  for (const auto& sub : m.modules(/*include_self=*/true)) {
    if (sub->name().find("BatchNorm") != std::string::npos) return true;
  }
  return false;
}

/// A built-in torch::nn model.
template <typename Holder>
class NnModel : public NnModuleModel {
 public:
  NnModel(Holder module, std::string name, std::shared_ptr<SyncBatchNorm> sync)
      : NnModuleModel(module.ptr()), module_(std::move(module)), name_(std::move(name)),
        sync_(std::move(sync)) {}
  torch::Tensor forward(const torch::Tensor& x) override { return module_->forward(laidOut(x)); }
  SyncBatchNorm* syncBatchNorm() override { return sync_ && sync_->layers() > 0 ? sync_.get() : nullptr; }
  bool hasBatchNorm() const override { return moduleHasBatchNorm(*module_); }
  std::string describe() const override {
    int64_t n = 0;
    for (const auto& p : module_->parameters()) n += p.numel();
    return name_ + ", " + parameterCountText(n) + " parameters";
  }

 private:
  Holder module_;
  std::string name_;
  std::shared_ptr<SyncBatchNorm> sync_;  ///< shared by its layers; null without sync
};

/// model.name: resnet18/50: each residual block under Note [activation recompute]
/// with model.recompute: on.
class ResNetModel : public NnModel<ResNet> {
 public:
  ResNetModel(const ResNet& net, std::string name, std::shared_ptr<SyncBatchNorm> sync)
      : NnModel<ResNet>(net, std::move(name), std::move(sync)), net_(net) {}
  bool setRecompute(bool on) override {
    net_->setRecompute(on);
    return true;
  }

 private:
  ResNet net_;
};

/// model.name: mlp, whose hidden layers (each from its Linear up to the next
/// Linear: ReLU, dropout) run under Note [activation recompute] with
/// model.recompute: on. The head runs as it is: it keeps only its input anyway.
class MlpModel : public NnModel<nn::Sequential> {
 public:
  MlpModel(const nn::Sequential& net, bool recompute, std::shared_ptr<SyncBatchNorm> sync)
      : NnModel<nn::Sequential>(net, "mlp", std::move(sync)), net_(net), recompute_(recompute) {
    // Groups over the same modules (not registered in net_: the names stay
    // net_'s). A Linear after another Linear of the group starts the next one.
    bool has_linear = false;
    for (const auto& m : *net_) {
      const bool linear = m.ptr()->as<nn::Linear>() != nullptr;
      if (groups_.empty() || (linear && has_linear)) {
        groups_.emplace_back();
        has_linear = false;
      }
      groups_.back()->push_back(m);
      has_linear = has_linear || linear;
    }
  }
  torch::Tensor forward(const torch::Tensor& x) override {
    if (!recompute_ && !unitHooks()) return net_->forward(x);
    auto h = x;
    for (std::size_t i = 0; i < groups_.size(); ++i) {
      auto group = groups_[i];
      BlockForward run = [group](const torch::Tensor& in) mutable { return group->forward(in); };
      // The head keeps only its input anyway.
      if (recompute_ && i + 1 < groups_.size()) run = recomputing(run, group->parameters());
      h = runUnit(unitHooks(), i, run, h);  // Note [parameter units]
    }
    return h;
  }
  /// Note [parameter units]: one unit per group (a Linear up to the next).
  std::vector<ParamUnit> units() const override {
    std::vector<ParamUnit> out;
    for (std::size_t i = 0; i < groups_.size(); ++i) {
      out.push_back({strCat(i + 1 < groups_.size() ? "layer " : "head ", i), groups_[i]->parameters(), {}});
    }
    return out;
  }
  bool setRecompute(bool on) override {
    recompute_ = on;
    return true;
  }

 private:
  nn::Sequential net_;
  std::vector<nn::Sequential> groups_;  ///< hidden layers, then the head
  bool recompute_;
};

/// The user's TorchScript module.
std::string essence(const std::string& what);

class ScriptModel : public Model {
 public:
  ScriptModel(torch::jit::Module m, std::string path) : m_(std::move(m)), path_(std::move(path)) {}
  torch::Tensor forward(const torch::Tensor& x) override {
    const auto out = call({laidOut(x)}, [&] {
      return strCat("forward failed on input of shape ", shapeText(x.sizes().vec()));
    });
    if (!out.isTensor()) {
      throw ConfigError(strCat("model.path: ", path_, ": forward must return one Tensor of logits"));
    }
    return out.toTensor();
  }
  bool takesTarget() const override { return forwardInputs(m_) >= 2; }
  c10::IValue forwardWithTarget(const torch::Tensor& x, const torch::Tensor& target) override {
    return call({laidOut(x), target}, [&] {
      return strCat("forward(x, target) failed on x of shape ", shapeText(x.sizes().vec()),
                    " and target of shape ", shapeText(target.sizes().vec()));
    });
  }
  /// forward's inputs after self (Note [module loss]: 2, the target too).
  static std::size_t forwardInputs(const torch::jit::Module& m) {
    const auto method = m.find_method("forward");
    return method ? method->function().getSchema().arguments().size() - 1 : 0;
  }
  std::vector<std::pair<std::string, torch::Tensor>> namedParameters() const override {
    std::vector<std::pair<std::string, torch::Tensor>> out;
    for (const auto& p : m_.named_parameters(/*recurse=*/true)) out.emplace_back(p.name, p.value);
    return out;
  }
  std::vector<std::pair<std::string, torch::Tensor>> namedBuffers() const override {
    std::vector<std::pair<std::string, torch::Tensor>> out;
    for (const auto& b : m_.named_buffers(/*recurse=*/true)) out.emplace_back(b.name, b.value);
    return out;
  }
  void train(bool on) override { m_.train(on); }
  void to(const at::Device& device) override { m_.to(device); }
  std::string serialize() override {
    std::ostringstream out;
    m_.save(out);
    return out.str();
  }
  bool hasBatchNorm() const override {
    for (const auto& sub : m_.modules()) {
      const auto type = sub.type()->name();
      if (type && type->qualifiedName().find("BatchNorm") != std::string::npos) return true;
    }
    return false;
  }
  std::string describe() const override {
    int64_t n = 0;
    for (const auto& p : m_.parameters(/*recurse=*/true)) n += p.numel();
    return "torchscript " + path_ + ", " + parameterCountText(n) + " parameters";
  }

 private:
  /// forward(inputs); the interpreter's message names the Python line, not the
  /// file: what() and the file are added. An out-of-memory passes as it is (the
  /// batch search and training handle it by type; one inside the interpreter
  /// keeps its "out of memory" text).
  template <typename What>
  c10::IValue call(std::vector<c10::IValue> inputs, const What& what) {
    try {
      return m_.forward(std::move(inputs));
    } catch (const c10::OutOfMemoryError&) {
      throw;
    } catch (const std::bad_alloc&) {
      throw;
    } catch (const std::exception& e) {
      throw TrainingError(strCat("model ", path_, ": ", what(), ": ", essence(e.what())));
    }
  }

  mutable torch::jit::Module m_;
  std::string path_;
};

/// The informative line of an exception: TorchScript puts a preamble first and
/// the actual error ("RuntimeError: ...") last.
std::string essence(const std::string& what) {
  std::vector<std::string> lines;
  std::size_t pos = 0;
  while (pos <= what.size()) {
    const auto end = what.find('\n', pos);
    const auto line = what.substr(pos, end == std::string::npos ? std::string::npos : end - pos);
    if (line.find_first_not_of(" \t") != std::string::npos) lines.push_back(line);
    if (end == std::string::npos) break;
    pos = end + 1;
  }
  if (lines.empty()) return what;
  if (lines.front().find("TorchScript interpreter") == std::string::npos) return lines.front();
  for (auto it = lines.rbegin(); it != lines.rend(); ++it) {
    if (it->find("Error:") != std::string::npos) return *it;
  }
  return lines.back();
}

torch::jit::Module loadScript(const std::string& path) {
  if (!std::filesystem::exists(path)) {
    throw ConfigError(strCat("model.path: no such file '", path, "'"));
  }
  // Note [input files are regular files]: torch::jit::load of a FIFO waited in open().
  if (const InputFile f = openInputFile(path); !f.kind.empty()) {
    throw ConfigError(strCat("model.path: '", path, "' ", f.why(), "; give the file a TorchScript "
                             "module was saved to (torch.jit.script(model).save(path))"));
  }
  try {
    return torch::jit::load(path, torch::kCPU);
  } catch (const std::exception& e) {
    throw ConfigError(strCat("model.path: '", path,
                             "' is not a TorchScript module (save one with "
                             "torch.jit.script(model).save(path)): ",
                             firstLine(e.what())));
  }
}

std::unique_ptr<Model> checked(std::unique_ptr<Model> model, const std::vector<int64_t>& shape,
                               int64_t classes, const std::string& what) {
  // One forward pass on a sample batch, so that a model that does not fit the
  // data fails here, with the shapes, rather than deep inside the first step.
  std::vector<int64_t> in{2};
  in.insert(in.end(), shape.begin(), shape.end());
  torch::Tensor out;
  try {
    torch::NoGradGuard no_grad;
    model->train(false);
    // Note [mfu]: the forward's products and convolutions, 3x for training.
    const double flops = countForwardFlops([&] { out = model->forward(torch::zeros(in)); });
    model->setTrainingFlopsPerSample(3 * flops / static_cast<double>(in[0]));
    model->train(true);
  } catch (const ConfigError&) {
    throw;
  } catch (const std::exception& e) {
    throw ConfigError(strCat(what, ": forward failed on a sample batch of shape ", shapeText(in),
                             ": ", essence(e.what())));
  }
  if (out.dim() != 2 || out.size(0) != 2 || out.size(1) != classes) {
    throw ConfigError(strCat(what, ": forward on a sample batch of shape ", shapeText(in),
                             " returned ", shapeText(out.sizes().vec()), "; expected [2, ",
                             classes, "] (one output per class or target value: model.outputs, or "
                             "data.classes)"));
  }
  return model;
}

/// checked() for model.name: gpt (Note [gpt]): samples are [T] token ids with
/// T <= model.seq_len, and a sample batch of [2, T] zeros gives [2, T, vocab]
/// logits. `classes` is not the head's width here (model.vocab is); the token
/// windows check their ids against model.vocab as they are gathered (Note [tokens]).
std::unique_ptr<Model> checkedGpt(std::unique_ptr<Model> model, const std::vector<int64_t>& shape,
                                  const ModelConfig& cfg) {
  if (shape.size() != 1 || shape[0] > cfg.seq_len) {
    throw ConfigError(strCat("model.name: gpt reads samples of [T] token ids with T <= "
                             "model.seq_len (", cfg.seq_len, "), but the data has shape ",
                             shapeText(shape), shape.size() == 1 ? "; raise model.seq_len" : ""));
  }
  const std::vector<int64_t> in{2, shape[0]};
  torch::Tensor out;
  {
    torch::NoGradGuard no_grad;
    model->train(false);
    out = model->forward(torch::zeros(in, torch::kLong));
    model->train(true);
  }
  const std::vector<int64_t> want{2, shape[0], cfg.vocab};
  if (out.sizes().vec() != want) {
    throw Error(strCat("model.name: gpt: forward on token ids of shape ", shapeText(in),
                       " returned ", shapeText(out.sizes().vec()), "; expected ", shapeText(want)));
  }
  int64_t params = 0;  // Note [mfu]: less the position embedding, as nanoGPT counts
  for (const auto& [name, p] : model->namedParameters()) {
    if (name != "wpe.weight") params += p.numel();
  }
  model->setTrainingFlopsPerSample(
      gptTrainingFlopsPerSample(params, cfg.layers, cfg.heads, cfg.embed, shape[0]));
  return model;
}

/// Note [activation recompute]: the config refuses the other models first; this
/// guards other callers of buildModel.
void checkRecomputeSupported(const ModelConfig& cfg) {
  if (cfg.recompute == Recompute::kOn && !recomputeUnsupported(cfg).empty()) {
    throw ConfigError(strCat("model.recompute: on is not supported for model.name: ",
                             toString(cfg.name), "; it is for gpt, mlp, resnet18 and resnet50"));
  }
}

}  // namespace

bool SyncBatchNorm::synchronising() const { return comm_.size() > 1 && paused_ == 0; }

LocalBatchNorm::LocalBatchNorm(Model& model) : sync_(model.syncBatchNorm()) {
  if (sync_ != nullptr) ++sync_->paused_;
}

LocalBatchNorm::~LocalBatchNorm() {
  if (sync_ != nullptr) --sync_->paused_;
}

void SyncBatchNorm::beginForward() { current_.clear(); }

void SyncBatchNorm::beforeCollective(int64_t numel) {
  if (fail_at_ >= 0 && static_cast<int64_t>(current_.size()) == fail_at_) {
    fail_at_ = -1;
    throw c10::OutOfMemoryError({__func__, __FILE__, static_cast<uint32_t>(__LINE__)},
                                "out of memory (injected by BATCHDIST_FAULT_OOM in forward)");
  }
  current_.push_back(numel);
}

int64_t SyncBatchNorm::endForward(bool failed) {
  fail_at_ = -1;
  if (!synchronising()) return failed ? 1 : 0;
  if (failed) {
    // The collectives this forward did not reach, as the last complete forward
    // made them (or, before any, in the layers' order, which is their forward order
    // in every built-in model); zeros add nothing to the others' statistics.
    const auto& sizes = last_.empty() ? layer_sizes_ : last_;
    const auto opts = at::TensorOptions().dtype(at::kFloat).device(comm_.device());
    for (std::size_t i = current_.size(); i < sizes.size(); ++i) {
      auto zeros = at::zeros({sizes[i]}, opts);
      comm_.allreduce(zeros, collective::ReduceOp::kSum);
    }
  } else {
    last_ = current_;
  }
  return static_cast<int64_t>(
      std::lround(comm_.allreduce(failed ? 1.0 : 0.0, collective::ReduceOp::kSum)));
}

WholeParameters::WholeParameters(const Model& model, bool absorb_writes)
    : hooks_(model.unitHooks()), absorb_(absorb_writes) {
  if (hooks_) hooks_->gatherAll();
}

WholeParameters::~WholeParameters() {
  if (!hooks_) return;
  try {
    hooks_->releaseAll(absorb_ && std::uncaught_exceptions() == 0);
  } catch (...) {  // NOLINT(bugprone-empty-catch): freeing memory; the run reports its own error
  }
}

void Model::setChannelsLast(bool on) {
  torch::NoGradGuard no_grad;
  const auto format = on ? at::MemoryFormat::ChannelsLast : at::MemoryFormat::Contiguous;
  for (auto& p : parameters()) {
    if (p.dim() == 4) p.set_data(p.detach().contiguous(format));
  }
  channels_last_ = on;
}

at::Tensor Model::laidOut(const at::Tensor& x) const {
  if (!channels_last_ || x.dim() != 4) return x;
  return x.contiguous(at::MemoryFormat::ChannelsLast);
}

bool convolutional(const ModelConfig& model) {
  return model.name == ModelName::kCnn || model.name == ModelName::kResnet18 ||
         model.name == ModelName::kResnet50;
}

bool channelsLast(const TrainConfig& train, const ModelConfig& model, bool on_cuda) {
  if (train.memory_format != MemoryFormat::kAuto) {
    return train.memory_format == MemoryFormat::kChannelsLast;
  }
  return convolutional(model) && on_cuda;
}

std::unique_ptr<Model> buildModel(const ModelConfig& cfg, const std::vector<int64_t>& shape,
                                  int64_t classes, const std::string& base_dir,
                                  collective::Communicator* comm) {
  // One per model, shared by its layers (Note [sync batchnorm failure]).
  const auto shared = cfg.sync_batchnorm && comm != nullptr
                          ? std::make_shared<SyncBatchNorm>(*comm)
                          : std::shared_ptr<SyncBatchNorm>();
  SyncBatchNorm* sync = shared.get();
  checkRecomputeSupported(cfg);
  if (cfg.name == ModelName::kProgram) return buildProgramModel(cfg.program);
  if (cfg.name == ModelName::kTorchscript) {
    const auto path = resolvePath(cfg.path, base_dir);
    std::unique_ptr<Model> model = std::make_unique<ScriptModel>(loadScript(path), path);
    // Note [module loss]: forward(x, target) is tried by its task, with real targets.
    if (!model->takesTarget()) model = checked(std::move(model), shape, classes, "model.path: " + path);
    model->setTrainingFlopsPerSample(cfg.flops_per_sample);  // Note [mfu]: as given, or unknown
    return model;
  }
  // Note [gpt]: token samples in, [N, T, vocab] out (data.name: tokens, the
  // language-model task).
  if (cfg.name == ModelName::kGpt) return checkedGpt(buildGpt(gptShape(cfg)), shape, cfg);
  if (cfg.name == ModelName::kMlp) {
    int64_t in = std::accumulate(shape.begin(), shape.end(), int64_t{1}, std::multiplies<>());
    nn::Sequential net;
    net->push_back(nn::Flatten());
    for (auto width : cfg.hidden) {
      net->push_back(nn::Linear(in, width));
      if (cfg.batchnorm) net->push_back(BatchNormLayer(width, sync));
      net->push_back(nn::ReLU());
      if (cfg.dropout > 0) net->push_back(nn::Dropout(cfg.dropout));
      in = width;
    }
    net->push_back(nn::Linear(in, classes));
    return checked(std::make_unique<MlpModel>(net, cfg.recompute == Recompute::kOn, shared), shape,
                   classes, "model.name: mlp");
  }
  if (shape.size() != 3) {
    throw ConfigError(strCat("model.name: ", toString(cfg.name),
                             " needs image samples of shape [C, H, W], but the data has shape ",
                             shapeText(shape), "; set data.shape (e.g. [1, 8, 8]) or use mlp"));
  }
  if (cfg.name == ModelName::kResnet18 || cfg.name == ModelName::kResnet50) {
    const bool deep = cfg.name == ModelName::kResnet50;
    ResNet net(deep, deep ? std::vector<int64_t>{3, 4, 6, 3} : std::vector<int64_t>{2, 2, 2, 2},
               shape[0], classes, cfg.stem == ResnetStem::kImagenet, sync,
               cfg.recompute == Recompute::kOn);
    const std::string name = toString(cfg.name);
    return checked(std::make_unique<ResNetModel>(
                       net, strCat(name, " (", toString(cfg.stem), " stem)"), shared),
                   shape, classes, "model.name: " + name);
  }
  // cnn: 3x3 conv blocks, global average pooling, linear head.
  nn::Sequential net;
  int64_t in = shape[0];
  int64_t h = shape[1];
  for (std::size_t i = 0; i < cfg.channels.size(); ++i) {
    const int64_t out = cfg.channels[i];
    net->push_back(nn::Conv2d(nn::Conv2dOptions(in, out, 3).padding(1).bias(!cfg.batchnorm)));
    if (cfg.batchnorm) net->push_back(BatchNormLayer(out, sync));
    net->push_back(nn::ReLU());
    if (i + 1 < cfg.channels.size() && h >= 8) {
      net->push_back(nn::MaxPool2d(2));
      h /= 2;
    }
    in = out;
  }
  net->push_back(nn::AdaptiveAvgPool2d(1));
  net->push_back(nn::Flatten());
  if (cfg.dropout > 0) net->push_back(nn::Dropout(cfg.dropout));
  net->push_back(nn::Linear(in, classes));
  return checked(std::make_unique<NnModel<nn::Sequential>>(net, "cnn", shared), shape, classes,
                 "model.name: cnn");
}

namespace {

/// What the run asks of a TorchScript file before the trainer builds its model.
struct ScriptFacts {
  bool has_batchnorm = false;
  bool takes_target = false;
};

/// The facts of the file at `path`, loaded once per process (set-up, the task's
/// choice and the search each ask; a module may be large), again if the file
/// changed (size or modification time).
ScriptFacts scriptFacts(const std::string& path) {
  static std::mutex mutex;
  static std::map<std::string, std::pair<std::string, ScriptFacts>> seen;  // path -> (stamp, facts)
  std::error_code ec;
  const auto size = std::filesystem::file_size(path, ec);
  const auto time = std::filesystem::last_write_time(path, ec);
  const auto stamp = ec ? std::string() : strCat(size, "@", time.time_since_epoch().count());
  const std::lock_guard<std::mutex> lock(mutex);
  if (const auto it = seen.find(path); it != seen.end() && !stamp.empty() && it->second.first == stamp) {
    return it->second.second;
  }
  const ScriptModel m(loadScript(path), path);
  const ScriptFacts facts{m.hasBatchNorm(), m.takesTarget()};
  seen[path] = {stamp, facts};
  return facts;
}

}  // namespace

bool modelTakesTarget(const ModelConfig& cfg, const std::string& base_dir) {
  if (cfg.name == ModelName::kProgram) return true;  // Note [program parts]
  return cfg.name == ModelName::kTorchscript &&
         scriptFacts(resolvePath(cfg.path, base_dir)).takes_target;
}

bool modelHasBatchNorm(const ModelConfig& cfg, const std::string& base_dir) {
  if (cfg.name == ModelName::kProgram) {
    if (!cfg.program) throw ConfigError(programOnlyMessage("model.name"));
    return programHasBatchNorm(*cfg.program);
  }
  if (cfg.name == ModelName::kTorchscript) {
    return scriptFacts(resolvePath(cfg.path, base_dir)).has_batchnorm;
  }
  if (cfg.name == ModelName::kResnet18 || cfg.name == ModelName::kResnet50) return true;
  if (cfg.name == ModelName::kGpt) return false;
  return cfg.batchnorm;
}

}  // namespace batchdist::worker
