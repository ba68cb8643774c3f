// Note [gradient scatter]: the reduce-scatters of dist.shard: gradients on 2 and
// 3 ranks (threads over a HashStore + Gloo): started from autograd's hooks while
// backward runs, in one order on every rank (learned from rank 0's first step),
// with few buffers alive at once; the shard against an allreduce of the same
// gradients; accumulation; a rank whose backward fails halfway.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <stdexcept>
#include <vector>

#include "tests/thread_ranks.h"
#include "worker/train/shard/gradient_scatter.h"
#include "worker/train/shard/shard_layout.h"

using namespace batchdist;
using namespace batchdist::worker;

namespace {

using testsupport::runRanks;

constexpr int64_t kWidth = 32, kLayers = 8;

/// A chain of kLayers tanh layers of kWidth x kWidth weights and kWidth biases;
/// `reversed`: registered last layer first (backward's order, so the initial
/// start order, the reverse of the list, is the wrong one).
struct Chain {
  std::vector<torch::Tensor> weights, biases;
  explicit Chain(int seed) {
    for (int64_t l = 0; l < kLayers; ++l) {
      const double f = 0.13 * static_cast<double>(l + 1) + 0.01 * seed;
      weights.push_back((torch::sin(torch::arange(kWidth * kWidth) * f) * 0.3)
                            .view({kWidth, kWidth}).requires_grad_());
      biases.push_back(torch::cos(torch::arange(kWidth) * f).mul(0.1).requires_grad_());
    }
  }
  std::vector<torch::Tensor> params(bool reversed) const {
    std::vector<torch::Tensor> out;
    for (int64_t l = 0; l < kLayers; ++l) {
      const auto i = static_cast<std::size_t>(reversed ? kLayers - 1 - l : l);
      out.push_back(weights[i]);
      out.push_back(biases[i]);
    }
    return out;
  }
  /// A loss that differs by rank and micro-batch; `fail_at`: a layer whose
  /// backward throws (-1: none).
  torch::Tensor loss(int rank, int64_t micro, int64_t fail_at = -1) const {
    auto x = torch::cos(torch::arange(4 * kWidth).view({4, kWidth}) * (0.3 + 0.1 * rank + 0.05 * micro));
    for (int64_t l = 0; l < kLayers; ++l) {
      x = torch::tanh(torch::matmul(x, weights[l]) + biases[l]);
      if (l == fail_at) {
        x.register_hook([](const torch::Tensor& /*grad*/) -> torch::Tensor {
          throw std::runtime_error("injected: backward fails halfway");
        });
      }
    }
    return x.square().sum();
  }
};

std::vector<int64_t> numels(const std::vector<torch::Tensor>& ps) {
  std::vector<int64_t> n;
  for (const auto& p : ps) n.push_back(p.numel());
  return n;
}

/// Rank `rank`'s chunks of the flat gradient `whole` (the parameters end to end
/// in list order), laid out as its shard.
torch::Tensor expectedShard(const ShardLayout& l, int rank, const torch::Tensor& whole) {
  auto shard = torch::zeros({l.slice});
  for (const auto& piece : l.piecesOf(rank)) {
    const auto i = static_cast<std::size_t>(piece.param);
    shard.narrow(0, piece.owned, piece.length)
        .copy_(whole.narrow(0, l.packed[i] + piece.offset, piece.length));
  }
  return shard;
}

/// The gradient of `losses` summed over the ranks, flat, by plain autograd and an allreduce.
torch::Tensor summedGradient(collective::Communicator& c, const std::vector<torch::Tensor>& ps,
                             const std::vector<torch::Tensor>& losses) {
  for (const auto& loss : losses) loss.backward();
  std::vector<torch::Tensor> flat;
  for (const auto& p : ps) flat.push_back(p.grad().reshape({-1}).clone());
  auto whole = torch::cat(flat);
  c.allreduce(whole, collective::ReduceOp::kSum);
  return whole;
}

}  // namespace

// The initial order is the wrong one for a model registered last layer first:
// in the first step every buffer fills before the first segment may start. From
// the second step on, rank 0's order: every segment starts from a hook, at most
// kInFlight + 1 buffers live at once, and the shard is the summed gradient's.
TEST(GradientScatter, LearnsTheReadyOrderThenHoldsFewBuffers) {
  runRanks(3, [&](collective::Communicator& c) {
    const Chain model(0);
    const auto ps = model.params(/*reversed=*/true);
    // A segment per weight (1024 floats), the biases with the next weight.
    const auto layout = makeShardLayout(numels(ps), c.size(), kWidth * kWidth + kWidth);
    auto shard = torch::zeros({layout.slice});
    GradientScatter scatter(c, ps, layout, shard, /*overlap=*/true);
    const auto segments = static_cast<int64_t>(layout.segments.size());
    ASSERT_GE(segments, kLayers);
    int64_t segment_bytes = 0, all_bytes = 0;
    for (const auto& s : layout.segments) {
      segment_bytes = std::max<int64_t>(segment_bytes, s.chunk * c.size() * 4);
      all_bytes += s.chunk * c.size() * 4;
    }
    for (int step = 0; step < 3; ++step) {
      const int64_t before = scatter.startedFromHooks();
      scatter.beginStep();
      scatter.beginRound();
      model.loss(c.rank(), step).backward();
      scatter.endStep(1);
      for (const auto& p : ps) EXPECT_FALSE(p.grad().defined()) << "a whole gradient was kept";
      if (step == 0) {
        EXPECT_EQ(scatter.peakBufferBytes(), all_bytes) << "started before the first segment was full";
        EXPECT_TRUE(scatter.learnedOrder());
        continue;
      }
      EXPECT_EQ(scatter.startedFromHooks() - before, segments) << "step " << step;
      EXPECT_LE(scatter.peakBufferBytes(),
                static_cast<int64_t>(GradientScatter::kInFlight + 1) * segment_bytes)
          << "step " << step << ": of " << all_bytes << " bytes of gradient";
      const Chain plain(0);
      const auto want = expectedShard(
          layout, c.rank(), summedGradient(c, plain.params(true), {plain.loss(c.rank(), step)}));
      EXPECT_TRUE(torch::allclose(shard, want, 1e-6, 1e-7))
          << "step " << step << ": max diff " << (shard - want).abs().max().item<double>();
    }
  });
}

// Accumulation: each micro-batch's round adds to the shard; dist.overlap off
// starts nothing from a hook and sums the same.
TEST(GradientScatter, SumsTheMicroBatchesWithAndWithoutOverlap) {
  for (const bool overlap : {true, false}) {
    runRanks(2, [&](collective::Communicator& c) {
      const Chain model(1);
      const auto ps = model.params(/*reversed=*/false);
      const auto layout = makeShardLayout(numels(ps), c.size(), 700);
      auto shard = torch::zeros({layout.slice});
      GradientScatter scatter(c, ps, layout, shard, overlap);
      scatter.setMeasureNorms(true);
      scatter.beginStep();
      double own_sq = 0;
      for (int64_t k = 0; k < 3; ++k) {
        scatter.beginRound();
        const Chain probe(1);  // this micro-batch's own gradient, for |g|^2
        probe.loss(c.rank(), k).backward();
        for (const auto& p : probe.params(false)) own_sq += p.grad().to(torch::kDouble).square().sum().item<double>();
        model.loss(c.rank(), k).backward();
      }
      scatter.endStep(3);
      EXPECT_EQ(scatter.started(), 3 * static_cast<int64_t>(layout.segments.size()));
      EXPECT_EQ(scatter.startedFromHooks(), overlap ? scatter.started() : 0) << "overlap " << overlap;
      EXPECT_NEAR(scatter.localSq().item<double>(), own_sq, 1e-9 * own_sq);
      const Chain plain(1);
      std::vector<torch::Tensor> losses;
      for (int64_t k = 0; k < 3; ++k) losses.push_back(plain.loss(c.rank(), k));
      const auto want = expectedShard(layout, c.rank(), summedGradient(c, plain.params(false), losses));
      EXPECT_TRUE(torch::allclose(shard, want, 1e-5, 1e-6))
          << "overlap " << overlap << ": max diff " << (shard - want).abs().max().item<double>();
    });
  }
}

// A rank whose backward throws halfway (after the later layers' segments have
// started from hooks) closes its round with what it has and makes the round it
// missed: both ranks make the same reduce-scatters and neither waits forever; the
// next step is whole again.
TEST(GradientScatter, ARankFailingHalfwayMakesTheSameCollectives) {
  std::vector<int64_t> started(2);
  runRanks(2, [&](collective::Communicator& c) {
    const Chain model(2);
    const auto ps = model.params(false);
    const auto layout = makeShardLayout(numels(ps), c.size(), kWidth * kWidth + kWidth);
    auto shard = torch::zeros({layout.slice});
    GradientScatter scatter(c, ps, layout, shard, /*overlap=*/true);
    scatter.beginStep();
    scatter.beginRound();
    if (c.rank() == 1) {
      EXPECT_THROW(model.loss(c.rank(), 0, /*fail_at=*/kLayers / 2).backward(), std::exception);
      EXPECT_GT(scatter.startedFromHooks(), 0) << "the failure came before any segment started";
    } else {
      model.loss(c.rank(), 0).backward();
      scatter.beginRound();
      model.loss(c.rank(), 1).backward();
    }
    scatter.endStep(2);
    started[static_cast<std::size_t>(c.rank())] = scatter.started();
    scatter.beginStep();
    scatter.beginRound();
    model.loss(c.rank(), 0).backward();
    scatter.endStep(1);
    const Chain plain(2);
    const auto want = expectedShard(layout, c.rank(), summedGradient(c, plain.params(false), {plain.loss(c.rank(), 0)}));
    EXPECT_TRUE(torch::allclose(shard, want, 1e-6, 1e-7)) << (shard - want).abs().max().item<double>();
  }, std::chrono::seconds(60));
  EXPECT_EQ(started[0], started[1]);
}
