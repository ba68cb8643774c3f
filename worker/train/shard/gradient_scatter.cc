#include "worker/train/shard/gradient_scatter.h"

#include <torch/torch.h>

#include <algorithm>
#include <utility>

namespace batchdist::worker {

GradientScatter::GradientScatter(collective::Communicator& comm, std::vector<at::Tensor> params,
                                 const ShardLayout& layout, at::Tensor shard, bool overlap,
                                 bool learn_order)
    : comm_(comm),
      params_(std::move(params)),
      layout_(layout),
      shard_(std::move(shard)),
      overlap_(overlap),
      segment_of_(params_.size(), 0),
      segments_(layout_.segments.size()) {
  learned_ = !learn_order;
  for (std::size_t k = 0; k < layout_.segments.size(); ++k) {
    const auto& s = layout_.segments[k];
    for (int64_t i = s.first; i < s.end; ++i) segment_of_[static_cast<std::size_t>(i)] = k;
  }
  // Note [gradient scatter]: the reverse first, rank 0's ready order after step 1.
  for (std::size_t k = segments_.size(); k-- > 0;) order_.push_back(k);
  local_sq_ = torch::zeros({}, shard_.options().dtype(torch::kDouble));
  hooks_ = std::make_unique<collective::GradReadyHooks>(
      params_, [this](std::size_t i) { onGradReady(i); }, "dist.shard: gradients");
}

GradientScatter::~GradientScatter() {
  hooks_.reset();  // no hook reaches this object any more
  for (auto& s : segments_) {
    try {
      if (s.work) s.work->wait();  // a collective in flight reads the buffer
    } catch (...) {  // NOLINT(bugprone-empty-catch): the communicator said why; nothing to add
    }
  }
}

void GradientScatter::beginStep() {
  for (auto& p : params_) p.mutable_grad() = at::Tensor();
  shard_.zero_();
  round_ = 0;
  open_ = false;
  local_sq_ = torch::zeros({}, shard_.options().dtype(torch::kDouble));
  peak_bytes_ = live_bytes_;
}

void GradientScatter::beginRound() {
  if (open_) closeRound();
  std::lock_guard<std::mutex> lock(mu_);
  for (std::size_t k = 0; k < segments_.size(); ++k) {
    const auto& s = layout_.segments[k];
    segments_[k].pending = static_cast<std::size_t>(s.end - s.first);
    segments_[k].ready = s.chunk == 0;  // nothing to send (the same on every rank)
  }
  next_ = 0;
  open_ = true;
}

void GradientScatter::endStep(int64_t rounds) {
  if (open_) closeRound();
  while (round_ < rounds) {  // Note [gradient scatter]: the rounds a failed rank missed
    beginRound();
    closeRound();
  }
  if (!learned_) learnOrder();
}

void GradientScatter::abandonStep(int64_t rounds) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    open_ = false;
  }
  while (!in_flight_.empty()) retireOldest();
  for (auto& seg : segments_) release(seg.buffer);
  round_ = rounds;
}

void GradientScatter::onGradReady(std::size_t param) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!open_) return;  // a backward outside a step's rounds: its .grad stays as autograd left it
  for (const auto k : in_flight_) segments_[k].work->progress();  // MPI moves only inside calls
  take(param);
  auto& s = segments_[segment_of_[param]];
  if (s.pending > 0 && --s.pending == 0) {
    s.ready = true;
    if (done_) done_(segment_of_[param]);
    if (!learned_ && round_ == 0) seen_order_.push_back(segment_of_[param]);
    if (overlap_) startReady(/*from_hook=*/true);
  }
}

void GradientScatter::take(std::size_t param) {
  auto& p = params_[param];
  if (!p.grad().defined()) return;
  torch::NoGradGuard no_grad;
  const std::size_t k = segment_of_[param];
  const auto& s = layout_.segments[k];
  auto& seg = segments_[k];
  if (!seg.buffer.defined()) seg.buffer = allocate(s.chunk * layout_.ranks, /*zeroed=*/true);
  const auto g = p.grad().reshape({-1});
  if (measure_) local_sq_ += g.to(torch::kDouble).square().sum();  // read once, at the step's end
  seg.buffer.narrow(0, layout_.starts[param] - s.base, g.numel()).copy_(g);
  p.mutable_grad() = at::Tensor();  // its value is in the buffer now
}

void GradientScatter::startReady(bool from_hook) {
  while (next_ < order_.size() && segments_[order_[next_]].ready) start(order_[next_++], from_hook);
}

void GradientScatter::start(std::size_t k, bool from_hook) {
  const auto& s = layout_.segments[k];
  if (s.chunk == 0) return;
  while (in_flight_.size() >= kInFlight) retireOldest();
  auto& seg = segments_[k];
  if (!seg.buffer.defined()) seg.buffer = allocate(s.chunk * layout_.ranks, /*zeroed=*/true);
  seg.out = round_ == 0 ? shard_.narrow(0, s.owned, s.chunk) : allocate(s.chunk, /*zeroed=*/false);
  seg.work = comm_.reduceScatterAsync(seg.buffer, seg.out, collective::ReduceOp::kSum);
  if (trace::on()) seg.work->trace(collective::bucketTraceName("reduce_scatter", k, seg.buffer));
  in_flight_.push_back(k);
  ++started_;
  if (from_hook) ++started_from_hooks_;
}

void GradientScatter::retireOldest() {
  const std::size_t k = in_flight_.front();
  in_flight_.pop_front();
  auto& seg = segments_[k];
  seg.work->wait();
  seg.work.reset();
  if (round_ > 0) {
    torch::NoGradGuard no_grad;
    const auto& s = layout_.segments[k];
    shard_.narrow(0, s.owned, s.chunk).add_(seg.out);
    release(seg.out);
  }
  seg.out = at::Tensor();
  release(seg.buffer);
}

void GradientScatter::closeRound() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& seg : segments_) seg.ready = true;
    startReady(/*from_hook=*/false);
    open_ = false;
  }
  while (!in_flight_.empty()) retireOldest();
  ++round_;
}

void GradientScatter::learnOrder() {
  // Collective: every rank ends every step here (Note [ready order]).
  learned_ = true;
  order_ = collective::agreeReadyOrder(comm_, seen_order_, order_);
  seen_order_.clear();
}

at::Tensor GradientScatter::allocate(int64_t elements, bool zeroed) {
  auto t = zeroed ? torch::zeros({elements}, shard_.options()) : torch::empty({elements}, shard_.options());
  live_bytes_ += static_cast<int64_t>(t.nbytes());
  peak_bytes_ = std::max(peak_bytes_, live_bytes_);
  return t;
}

void GradientScatter::release(at::Tensor& t) {
  if (!t.defined()) return;
  live_bytes_ -= static_cast<int64_t>(t.nbytes());
  t = at::Tensor();
}

}  // namespace batchdist::worker
