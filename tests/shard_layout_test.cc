// Note [shard layout]: the pieces of every rank tile the parameters exactly once,
// in flat order, with the pad at the end (one segment) or in every segment's. Note [sharded optimizer]: the config key
// and what a sharded optimizer refuses.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>
#include <vector>

#include "common/error.h"
#include "tests/config_errors.h"
#include "tests/gpt_fixtures.h"
#include "tests/thread_ranks.h"
#include "worker/config/config.h"
#include "worker/model/optimizer.h"
#include "worker/search/cache.h"
#include "worker/train/shard/shard_layout.h"
#include "worker/train/shard/sharded_optimizer.h"

using namespace batchdist;
using namespace batchdist::worker;
using batchdist::testsupport::configError;

namespace {

/// Every element of every parameter is in exactly one rank's piece, at the flat
/// position its parameter's start gives it, within that rank's slice.
void expectTiles(const std::vector<int64_t>& numels, int ranks) {
  const auto l = makeShardLayout(numels, ranks);
  int64_t total = 0;
  for (const auto n : numels) total += n;
  ASSERT_EQ(l.total, total);
  EXPECT_EQ(l.slice, (total + ranks - 1) / ranks);
  std::vector<int> seen(static_cast<std::size_t>(total), 0);
  int64_t filled = 0;
  for (int r = 0; r < ranks; ++r) {
    int64_t next = r * l.slice;  // pieces are in flat order, without gaps
    for (const auto& p : l.piecesOf(r)) {
      ASSERT_GT(p.length, 0);
      EXPECT_EQ(p.flat, next) << "rank " << r;
      EXPECT_EQ(p.flat, l.starts[p.param] + p.offset);
      EXPECT_LE(p.offset + p.length, numels[p.param]);
      EXPECT_LE(p.flat + p.length, (r + 1) * l.slice) << "a piece past rank " << r << "'s slice";
      for (int64_t i = 0; i < p.length; ++i) ++seen[p.flat + i];
      next = p.flat + p.length;
    }
    filled += l.filled(r);
  }
  EXPECT_EQ(filled, total);
  for (std::size_t i = 0; i < seen.size(); ++i) ASSERT_EQ(seen[i], 1) << "element " << i;
}

TEST(ShardLayout, PiecesTileTheParametersOnce) {
  expectTiles({384, 32, 544, 17, 85, 5}, 1);
  expectTiles({384, 32, 544, 17, 85, 5}, 2);
  expectTiles({384, 32, 544, 17, 85, 5}, 3);
  expectTiles({384, 32, 544, 17, 85, 5}, 4);
  expectTiles({384, 32, 544, 17, 85, 5}, 7);
  expectTiles({1, 0, 2}, 8);  // more ranks than elements: empty slices, an empty parameter
}

/// Segmented (Note [sharded gradients]): every element of every parameter is in
/// exactly one rank's piece, each piece inside its rank's chunk of its segment,
/// at its packed position; a rank's pieces fill its shard in order, without gaps
/// but the pads.
void expectSegmentedTiles(const std::vector<int64_t>& numels, int ranks, int64_t segment) {
  const auto l = makeShardLayout(numels, ranks, segment);
  std::vector<int> seen(static_cast<std::size_t>(l.total), 0);
  int64_t filled = 0, shard = 0;
  for (const auto& s : l.segments) {
    EXPECT_TRUE(s.elements <= segment || s.end - s.first == 1) << "a segment over the size";
    EXPECT_EQ(s.chunk, (s.elements + ranks - 1) / ranks);
    EXPECT_EQ(s.owned, shard);
    shard += s.chunk;
  }
  EXPECT_EQ(l.slice, shard);
  for (int r = 0; r < ranks; ++r) {
    int64_t owned = -1;
    for (const auto& p : l.piecesOf(r)) {
      ASSERT_GT(p.length, 0);
      EXPECT_EQ(p.packed, l.packed[p.param] + p.offset);
      EXPECT_EQ(p.flat, l.starts[p.param] + p.offset);
      EXPECT_GT(p.owned, owned) << "rank " << r << ": pieces out of order";
      EXPECT_LE(p.owned + p.length, l.slice);
      owned = p.owned;
      for (int64_t i = 0; i < p.length; ++i) ++seen[p.packed + i];
    }
    filled += l.filled(r);
  }
  EXPECT_EQ(filled, l.total);
  for (std::size_t i = 0; i < seen.size(); ++i) ASSERT_EQ(seen[i], 1) << "element " << i;
}

TEST(ShardLayout, SegmentsTileTheParametersOnce) {
  const std::vector<int64_t> mlp{384, 32, 544, 17, 85, 5};
  for (int ranks : {1, 2, 3, 4, 7}) {
    expectSegmentedTiles(mlp, ranks, 262);  // 384 | 32 | 544 | 17 85 5
    expectSegmentedTiles(mlp, ranks, 100);
    expectSegmentedTiles(mlp, ranks, 1);    // a segment per parameter
  }
  expectSegmentedTiles({1, 0, 2}, 8, 2);
  EXPECT_EQ(makeShardLayout(mlp, 2, 262).segments.size(), 4u);
  EXPECT_EQ(makeShardLayout(mlp, 2, 0).segments.size(), 1u) << "ZeRO-1: one segment";
}

TEST(ShardLayout, AParameterStraddlingSlicesIsSplitAtTheBoundary) {
  // 10 + 6 elements over 4 ranks: n = 4; rank 2 owns [8, 12): 2 of the first, 2 of the second.
  const auto l = makeShardLayout({10, 6}, 4);
  const auto p = l.piecesOf(2);
  ASSERT_EQ(p.size(), 2u);
  EXPECT_EQ(p[0].param, 0);
  EXPECT_EQ(p[0].offset, 8);
  EXPECT_EQ(p[0].length, 2);
  EXPECT_EQ(p[1].param, 1);
  EXPECT_EQ(p[1].offset, 0);
  EXPECT_EQ(p[1].length, 2);
  // 17 elements over 4: n = 5, the last rank holds 2 elements and 3 of pad.
  const auto q = makeShardLayout({17}, 4);
  EXPECT_EQ(q.slice, 5);
  EXPECT_EQ(q.filled(3), 2);
  EXPECT_EQ(q.piecesOf(3).at(0).length, 2);
}

TEST(ShardConfig, DefaultsToNoneAndStaysOutOfTheResolvedConfig) {
  const auto plain = parseConfig("model: {name: mlp}", "test.yaml");
  EXPECT_EQ(plain.dist.shard, Shard::kNone);
  EXPECT_FALSE(plain.resolved["dist"].contains("shard")) << "earlier runs' cache keys would change";
  const auto on = parseConfig("dist: {shard: optimizer}", "test.yaml");
  EXPECT_EQ(on.dist.shard, Shard::kOptimizer);
  EXPECT_EQ(on.resolved["dist"]["shard"], "optimizer");
}

TEST(ShardConfig, GradientsIsAcceptedAndATypoListsTheChoices) {
  const auto on = parseConfig("dist: {shard: gradients}", "test.yaml");
  EXPECT_EQ(on.dist.shard, Shard::kGradients);
  EXPECT_EQ(on.resolved["dist"]["shard"], "gradients");
  const auto typo = configError("dist: {shard: zero1}");
  EXPECT_NE(typo.find("not one of"), std::string::npos) << typo;
  EXPECT_NE(typo.find("gradients"), std::string::npos) << typo;
}

// Sharding changes what fits: a search cached without it is not reused with it,
// and an unsharded key is the one earlier runs wrote.
TEST(ShardConfig, SearchCacheKeyIncludesTheShardSetting) {
  SearchCacheInputs in;
  in.world = 2;
  in.device = "cpu";
  const auto none = searchCacheKey(parseConfig("dist: {shard: none}", "t.yaml"), in);
  const auto absent = searchCacheKey(parseConfig("model: {name: mlp}", "t.yaml"), in);
  const auto sharded = searchCacheKey(parseConfig("dist: {shard: optimizer}", "t.yaml"), in);
  EXPECT_EQ(none, absent);
  EXPECT_NE(sharded, none);
  EXPECT_EQ(none.find("shard"), std::string::npos) << none;
}

// The flat buffer holds one dtype: a model with two is refused by name.
TEST(ShardedOptimizerAlone, ParametersOfTwoDtypesAreRefused) {
  const auto cfg = parseConfig("optim: {name: sgd, momentum: 0.9}", "test.yaml");
  testsupport::runRanks(1, [&](collective::Communicator& c) {
    auto a = torch::zeros({3}, torch::requires_grad());
    auto b = torch::zeros({2}, torch::TensorOptions().dtype(torch::kDouble).requires_grad(true));
    try {
      ShardedOptimizer opt(cfg.optim, c, {a, b});
      ADD_FAILURE() << "two dtypes accepted";
    } catch (const ConfigError& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("one dtype"), std::string::npos) << what;
      EXPECT_NE(what.find("Double"), std::string::npos) << what;
    }
  });
}

// The parameters become views of one buffer and keep their values; a step moves
// them in place (the same parameter objects the model holds).
TEST(ShardedOptimizerAlone, ParametersKeepTheirValuesAndIdentity) {
  const auto cfg = parseConfig("optim: {name: sgd, lr: 0.5, momentum: 0.0}", "test.yaml");
  testsupport::runRanks(1, [&](collective::Communicator& c) {
    auto a = torch::arange(6, torch::kFloat).reshape({2, 3}).requires_grad_();
    auto b = torch::full({4}, 2.0f).requires_grad_();
    const auto* impl = a.unsafeGetTensorImpl();
    ShardedOptimizer opt(cfg.optim, c, {a, b});
    EXPECT_EQ(a.unsafeGetTensorImpl(), impl);
    EXPECT_TRUE(torch::equal(a.detach(), torch::arange(6, torch::kFloat).reshape({2, 3})));
    EXPECT_TRUE(torch::equal(b.detach(), torch::full({4}, 2.0f)));
    a.mutable_grad() = torch::ones({2, 3});
    b.mutable_grad() = torch::ones({4});
    opt.step(0.5);
    EXPECT_TRUE(torch::equal(a.detach(), torch::arange(6, torch::kFloat).reshape({2, 3}) - 0.5f));
    EXPECT_TRUE(torch::equal(b.detach(), torch::full({4}, 1.5f)));
  });
}

// adamw over a GPT's weights (decayed) and its LayerNorm gains and biases (not)
// on 3 ranks, pieces straddling both kinds: 5 steps of the same gradients give
// every rank the whole optimizer's weights, bit for bit.
TEST(ShardedOptimizerAlone, GptAdamwOnThreeRanksStepsAsTheWholeOptimizer) {
  const auto cfg = parseConfig("optim: {name: adamw, lr: 0.01, weight_decay: 0.1}", "t.yaml");
  const auto grads = [](const std::vector<at::Tensor>& params, int step) {
    auto gen = at::detail::createCPUGenerator(100 + step);
    for (auto& p : params) p.mutable_grad() = at::randn(p.sizes(), gen);
  };
  torch::manual_seed(1);
  auto whole_model = buildGpt(smallGptShape());
  const auto whole_params = whole_model->trainableParameters();
  auto whole = makeOptimizer(cfg.optim, whole_params);
  for (int s = 0; s < 5; ++s) {
    grads(whole_params, s);
    whole->step(0.01);
  }
  // The ranks' models are built here: the threads would share the global generator.
  std::vector<std::unique_ptr<Model>> models;
  for (int r = 0; r < 3; ++r) {
    torch::manual_seed(1);
    models.push_back(buildGpt(smallGptShape()));
  }
  testsupport::runRanks(3, [&](collective::Communicator& c) {
    const auto params = models[static_cast<std::size_t>(c.rank())]->trainableParameters();
    ShardedOptimizer opt(cfg.optim, c, params);
    for (int s = 0; s < 5; ++s) {
      grads(params, s);
      opt.step(0.01);
    }
    for (std::size_t i = 0; i < params.size(); ++i) {
      EXPECT_TRUE(torch::equal(params[i].detach(), whole_params[i].detach()))
          << "rank " << c.rank() << " parameter " << i << " (" << params[i].sizes()
          << "): max |diff| "
          << (params[i].detach() - whole_params[i].detach()).abs().max().item<double>();
    }
  });
}

}  // namespace
