#include "collective/recording_comm.h"

#include <ATen/ATen.h>

#include <algorithm>

namespace batchdist::collective {

void RecordingCommunicator::begin() {
  if (open_) end();
  current_.clear();
  open_ = true;
}

void RecordingCommunicator::end() {
  if (!open_) return;
  open_ = false;
  pattern_ = std::move(current_);
  current_.clear();
  has_pattern_ = true;
}

bool RecordingCommunicator::replayRest(int64_t whole_stretches) {
  open_ = false;
  const bool prefix = has_pattern_ && current_.size() <= pattern_.size() &&
                      std::equal(current_.begin(), current_.end(), pattern_.begin());
  const std::size_t from = current_.size();
  current_.clear();
  if (!prefix) return false;
  for (std::size_t i = from; i < pattern_.size(); ++i) makeOnZeros(pattern_[i]);
  for (int64_t n = 0; n < whole_stretches; ++n) {
    for (const auto& op : pattern_) makeOnZeros(op);
  }
  return true;
}

void RecordingCommunicator::record(Kind kind, const at::Tensor& t, ReduceOp reduce, int root) {
  if (!open_) return;
  current_.push_back({kind, t.sizes().vec(), t.scalar_type(), reduce, root});
}

void RecordingCommunicator::makeOnZeros(const Op& op) {
  const auto options = at::TensorOptions().dtype(op.dtype).device(inner_.device());
  auto t = at::zeros(op.sizes, options);
  switch (op.kind) {
    case Kind::kAllreduce:
      inner_.allreduce(t, op.reduce);
      return;
    case Kind::kBroadcast:
      inner_.broadcast(t, op.root);
      return;
    case Kind::kAllgather:
      inner_.allgather(t);
      return;
    case Kind::kBarrier:
      inner_.barrier();
      return;
    case Kind::kReduceScatter: {
      auto out = at::empty({t.numel() / inner_.size()}, options);
      inner_.reduceScatter(t, out, op.reduce);
      return;
    }
    case Kind::kAllgatherInto: {
      auto out = at::empty({t.numel() * inner_.size()}, options);
      inner_.allgatherInto(t, out);
      return;
    }
  }
}

void RecordingCommunicator::allreduce(at::Tensor& t, ReduceOp op) {
  record(Kind::kAllreduce, t, op);
  inner_.allreduce(t, op);
}

std::unique_ptr<PendingWork> RecordingCommunicator::allreduceAsync(at::Tensor& t, ReduceOp op) {
  record(Kind::kAllreduce, t, op);
  return inner_.allreduceAsync(t, op);
}

void RecordingCommunicator::broadcast(at::Tensor& t, int root) {
  record(Kind::kBroadcast, t, ReduceOp::kSum, root);
  inner_.broadcast(t, root);
}

at::Tensor RecordingCommunicator::allgather(const at::Tensor& t) {
  record(Kind::kAllgather, t);
  return inner_.allgather(t);
}

void RecordingCommunicator::barrier() {
  if (open_) current_.push_back({Kind::kBarrier, {}, at::kFloat, ReduceOp::kSum, 0});
  inner_.barrier();
}

std::unique_ptr<PendingWork> RecordingCommunicator::reduceScatterAsync(const at::Tensor& input,
                                                                       at::Tensor& output,
                                                                       ReduceOp op) {
  record(Kind::kReduceScatter, input, op);
  return inner_.reduceScatterAsync(input, output, op);
}

std::unique_ptr<PendingWork> RecordingCommunicator::allgatherIntoAsync(const at::Tensor& input,
                                                                       at::Tensor& output) {
  record(Kind::kAllgatherInto, input);
  return inner_.allgatherIntoAsync(input, output);
}

}  // namespace batchdist::collective
