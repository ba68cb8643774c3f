#include "worker/train/shard/sharded_optimizer.h"

#include <torch/torch.h>

#include <set>
#include <utility>

#include "common/error.h"

namespace batchdist::worker {
namespace {

std::vector<int64_t> numelsOf(const std::vector<at::Tensor>& params) {
  std::vector<int64_t> out;
  for (const auto& p : params) out.push_back(p.numel());
  return out;
}

/// A tensor listed twice would take two ranges of the flat buffer and keep one.
void checkDistinct(const std::vector<at::Tensor>& params) {
  std::set<const c10::TensorImpl*> seen;
  for (const auto& p : params) {
    if (!seen.insert(p.unsafeGetTensorImpl()).second) {
      throw ConfigError("dist.shard: optimizer: the model lists one parameter tensor twice; "
                        "use dist.shard: none");
    }
  }
}

void checkOneDtype(const std::vector<at::Tensor>& params) {
  for (const auto& p : params) {
    if (p.scalar_type() != params.front().scalar_type()) {
      throw ConfigError(strCat("dist.shard: optimizer needs the trainable parameters in one "
                               "dtype; this model has ", c10::toString(params.front().scalar_type()),
                               " and ", c10::toString(p.scalar_type()), " ones: use dist.shard: none"));
    }
  }
}

}  // namespace

ShardedOptimizer::ShardedOptimizer(const OptimConfig& cfg, collective::Communicator& comm,
                                   std::vector<at::Tensor> params, int64_t segment_elements)
    : cfg_(cfg), comm_(comm), params_(std::move(params)),
      layout_(makeShardLayout(numelsOf(params_), comm.size(), segment_elements)) {
  if (params_.empty()) throw ConfigError("dist.shard: optimizer: the model has no trainable parameters");
  checkOneDtype(params_);
  checkDistinct(params_);
  torch::NoGradGuard no_grad;
  flat_ = torch::zeros({layout_.flatSize()},
                       params_.front().options().requires_grad(false));
  for (std::size_t i = 0; i < params_.size(); ++i) {
    auto& p = params_[i];
    auto range = flat_.narrow(0, layout_.starts[i], p.numel()).view(p.sizes());
    range.copy_(p.detach());
    p.set_data(range);  // the same parameter object, its elements now in flat_
  }
  buildInner(flat_, /*owned=*/false);
}

ShardedOptimizer::ShardedOptimizer(const OptimConfig& cfg, collective::Communicator& comm,
                                   std::vector<at::Tensor> params, ShardLayout layout,
                                   at::Tensor owned)
    : cfg_(cfg), comm_(comm), params_(std::move(params)), layout_(std::move(layout)) {
  if (params_.empty()) throw ConfigError("dist.shard: parameters: the model has no trainable parameters");
  checkOneDtype(params_);
  checkDistinct(params_);
  buildInner(owned, /*owned=*/true);
}

void ShardedOptimizer::buildInner(const at::Tensor& space, bool owned) {
  pieces_ = layout_.piecesOf(comm_.rank());
  std::vector<OptimizerParam> inner;
  for (const auto& piece : pieces_) {
    tensors_.push_back(space.narrow(0, owned ? piece.owned : piece.flat, piece.length));
    inner.push_back({tensors_.back(), params_[static_cast<std::size_t>(piece.param)]});
  }
  inner_ = makeOptimizer(cfg_, std::move(inner));
}

void ShardedOptimizer::step(double lr) {
  for (std::size_t j = 0; j < pieces_.size(); ++j) {
    const auto& piece = pieces_[j];
    if (shard_grad_.defined()) {  // Note [sharded gradients]
      tensors_[j].mutable_grad() = shard_grad_.narrow(0, piece.owned, piece.length);
      continue;
    }
    const auto& g = params_[static_cast<std::size_t>(piece.param)].grad();
    // A view of the summed gradient when it is contiguous (it is the parameter's layout).
    tensors_[j].mutable_grad() =
        g.defined() ? g.reshape({-1}).narrow(0, piece.offset, piece.length) : at::Tensor();
  }
  inner_->step(lr);
  if (layout_.ranks == 1 || !flat_.defined()) return;  // Note [parameter units]: gathered per unit
  for (const auto& s : layout_.segments) {  // each segment in place (Note [shard layout])
    if (s.chunk == 0) continue;
    auto segment = flat_.narrow(0, s.base, s.chunk * layout_.ranks);
    comm_.allgatherInto(segment.narrow(0, comm_.rank() * s.chunk, s.chunk), segment);
  }
}

void ShardedOptimizer::setWholeGradNorms(std::vector<double> norms) {
  std::vector<double> by_piece;
  for (const auto& piece : pieces_) by_piece.push_back(norms.at(static_cast<std::size_t>(piece.param)));
  inner_->setWholeGradNorms(std::move(by_piece));
}

void ShardedOptimizer::zeroGrad() {
  for (auto& p : params_) {
    if (p.grad().defined()) p.mutable_grad().zero_();
  }
  if (shard_grad_.defined()) shard_grad_.zero_();
}

std::string ShardedOptimizer::saveState() {
  throw Error("dist.shard: optimizer: the state is sharded; a checkpoint saves it by slices");
}

void ShardedOptimizer::loadState(const std::string&, const at::Device&) {
  throw Error("dist.shard: optimizer: the state is sharded; a checkpoint restores it by slices");
}

}  // namespace batchdist::worker
