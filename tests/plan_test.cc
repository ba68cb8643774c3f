#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <map>
#include <set>

#include "common/error.h"
#include "worker/plan/plan.h"

using batchdist::ConfigError;
using namespace batchdist::worker;

namespace {

Config batchConfig(int64_t global, int64_t per_gpu, int64_t accum, LastBatch policy) {
  Config cfg = parseConfig("", "t.yaml");
  cfg.batch.global = global;
  cfg.batch.per_gpu = per_gpu;
  cfg.batch.accum = accum;
  cfg.batch.last_batch = policy;
  return cfg;
}

std::string planError(const Config& cfg, int64_t world, int64_t n, bool bn) {
  try {
    makePlan(cfg, world, n, bn);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "<no error>";
}

}  // namespace

TEST(Plan, AnyTwoOfTheTripleDeriveTheThird) {
  struct Row {
    int64_t G, m, a, W;
    int64_t wantG, wantM, wantA;
  };
  const Row rows[] = {
      {64, 16, 0, 2, 64, 16, 2},  {64, 0, 2, 2, 64, 16, 2}, {0, 16, 2, 2, 64, 16, 2},
      {64, 16, 2, 2, 64, 16, 2},  {64, 0, 0, 4, 64, 16, 1}, {0, 8, 0, 3, 24, 8, 1},
      {0, 0, 0, 1, 32, 32, 1},    {96, 32, 0, 3, 96, 32, 1},
  };
  for (const auto& r : rows) {
    SCOPED_TRACE(::testing::Message() << "G=" << r.G << " m=" << r.m << " a=" << r.a
                                      << " W=" << r.W);
    const auto p = makePlan(batchConfig(r.G, r.m, r.a, LastBatch::kDrop), r.W, 1000, false);
    EXPECT_EQ(p.global, r.wantG);
    EXPECT_EQ(p.per_gpu, r.wantM);
    EXPECT_EQ(p.accum, r.wantA);
    EXPECT_EQ(p.global, p.per_gpu * p.accum * p.world_size);
  }
}

TEST(Plan, NonDivisibleGlobalPrintsArithmeticAndNearestValues) {
  const auto msg = planError(batchConfig(100, 32, 0, LastBatch::kDrop), 3, 1000, false);
  EXPECT_NE(msg.find("batch.global=100 is not divisible by world size 3 x batch.per_gpu 32 (= 96); "
                     "use 96 or 192"),
            std::string::npos)
      << msg;
  const auto msg2 = planError(batchConfig(64, 16, 3, LastBatch::kDrop), 2, 1000, false);
  EXPECT_NE(msg2.find("!= batch.per_gpu 16 x batch.accum 3 x world size 2 (= 96)"),
            std::string::npos)
      << msg2;
  EXPECT_NE(planError(batchConfig(10, 0, 0, LastBatch::kDrop), 4, 1000, false).find("use 8 or 12"),
            std::string::npos);
}

TEST(Plan, BatchNormNeedsTwoSamplesPerGpuAndRefusesKeep) {
  auto msg = planError(batchConfig(4, 1, 0, LastBatch::kDrop), 4, 1000, true);
  EXPECT_NE(msg.find("batch.per_gpu=1 is below 2: BatchNorm in training mode needs at least 2"), std::string::npos) << msg;
  EXPECT_NO_THROW(makePlan(batchConfig(4, 1, 0, LastBatch::kDrop), 4, 1000, false));
  msg = planError(batchConfig(64, 0, 0, LastBatch::kKeep), 2, 1000, true);
  EXPECT_NE(msg.find("batch.last_batch: keep"), std::string::npos) << msg;
  EXPECT_NO_THROW(makePlan(batchConfig(64, 0, 0, LastBatch::kKeep), 2, 1000, false));
}

TEST(Plan, BatchNormFloorIsTwoEvenWhenMinPerGpuIsOne) {
  // A TorchScript model's BatchNorm is found only when the plan is made; with
  // batch.min_per_gpu: 1 a per-GPU batch of 1 used to pass (1 < 1 is false).
  const Config cfg = parseConfig("model: {name: torchscript, path: m.pt}\n"
                                 "batch: {global: 4, min_per_gpu: 1}\n",
                                 "t.yaml");
  const auto msg = planError(cfg, 4, 1000, true);
  EXPECT_NE(msg.find("t.yaml: batch.per_gpu=1 is below 2: BatchNorm in training mode needs at least "
                     "2 samples per GPU per micro-batch (batch.min_per_gpu, never below 2)"),
            std::string::npos)
      << msg;
  EXPECT_NO_THROW(makePlan(cfg, 4, 1000, false));
}

TEST(Plan, HugeBatchesOverflowWithAMessageNotSigfpe) {
  // per_gpu 2^62 x world 4 wrapped to 0 and the plan divided by it (SIGFPE).
  constexpr int64_t kHuge = int64_t{1} << 62;
  auto msg = planError(batchConfig(0, kHuge, 0, LastBatch::kDrop), 4, 1000, false);
  EXPECT_NE(msg.find("t.yaml: batch.per_gpu x batch.accum x world size overflows (4611686018427387904 "
                     "x 4)"),
            std::string::npos)
      << msg;
  msg = planError(batchConfig(64, kHuge, 0, LastBatch::kDrop), 4, 1000, false);
  EXPECT_NE(msg.find("batch.per_gpu x world size overflows"), std::string::npos) << msg;
  msg = planError(batchConfig(64, 0, kHuge, LastBatch::kDrop), 4, 1000, false);
  EXPECT_NE(msg.find("batch.accum x world size overflows"), std::string::npos) << msg;
  msg = planError(batchConfig(0, int64_t{1} << 40, int64_t{1} << 30, LastBatch::kPad), 1, 1000, false);
  EXPECT_NE(msg.find("batch.per_gpu x batch.accum overflows"), std::string::npos) << msg;
}

TEST(Plan, PaddingMoreThanTheDataIsRefused) {
  // pad used to accept any global batch: 4000 on 1000 samples pads 3000 a step.
  const auto msg = planError(batchConfig(4000, 0, 0, LastBatch::kPad), 4, 1000, false);
  EXPECT_NE(msg.find("t.yaml: batch.global=4000 with batch.last_batch: pad would add 3000 padding "
                     "samples to the 1000 of the training set each epoch (more padding than data)"),
            std::string::npos)
      << msg;
  const auto p = makePlan(batchConfig(1500, 0, 0, LastBatch::kPad), 3, 1000, false);
  EXPECT_EQ(p.samples_padded, 500);  // as much padding as half the data is still allowed
}

TEST(Plan, DropWithFewerSamplesThanOneBatchIsRefused) {
  const auto msg = planError(batchConfig(64, 0, 0, LastBatch::kDrop), 2, 50, false);
  EXPECT_NE(msg.find("50 samples, fewer than batch.global=64"), std::string::npos) << msg;
  EXPECT_NO_THROW(makePlan(batchConfig(64, 0, 0, LastBatch::kPad), 2, 50, false));
}

// Property test over many (N, W, m, a, policy): Note [equal shards].
TEST(Plan, ShardsAreEqualDisjointAndCoverTheDataSet) {
  int combos = 0;
  for (int64_t n : {2, 7, 64, 65, 97, 129, 300}) {
    for (int64_t W : {1, 2, 3, 4, 5}) {
      for (int64_t m : {1, 2, 3, 8}) {
        for (int64_t a : {1, 2, 3}) {
          for (auto policy : {LastBatch::kDrop, LastBatch::kPad, LastBatch::kKeep}) {
            const int64_t G = m * a * W;
            if (policy == LastBatch::kDrop && n < G) continue;
            if (policy == LastBatch::kPad && (G - n % G) % G > n) continue;  // refused
            SCOPED_TRACE(::testing::Message() << "N=" << n << " W=" << W << " m=" << m << " a=" << a
                                              << " policy=" << toString(policy));
            auto cfg = batchConfig(G, m, 0, policy);
            const auto plan = makePlan(cfg, W, n, false);
            ASSERT_EQ(plan.accum, a);
            Sharder sharder(plan, 42);
            for (int64_t epoch = 0; epoch < 2; ++epoch) {
              sharder.setEpoch(epoch);
              std::map<int64_t, int> real_count;  // index -> times seen with weight 1
              int64_t padded = 0;
              int64_t real_total = 0;
              for (int64_t s = 0; s < plan.steps_per_epoch; ++s) {
                int64_t step_real = 0;
                for (int64_t r = 0; r < W; ++r) {
                  for (int64_t k = 0; k < a; ++k) {
                    const auto mb = sharder.micro(s, k, r);
                    ASSERT_EQ(mb.indices.size(), mb.weights.size());
                    if (policy != LastBatch::kKeep) {
                      ASSERT_EQ(static_cast<int64_t>(mb.indices.size()), m);
                    }
                    for (std::size_t i = 0; i < mb.indices.size(); ++i) {
                      ASSERT_GE(mb.indices[i], 0);
                      ASSERT_LT(mb.indices[i], n);
                      if (mb.weights[i] > 0) {
                        ++real_count[mb.indices[i]];
                        ++step_real;
                      } else {
                        ++padded;
                      }
                    }
                  }
                }
                ASSERT_EQ(step_real, sharder.realSamples(s));
                real_total += step_real;
              }
              // Every sample with weight 1 appears at most once per epoch ...
              for (const auto& [idx, c] : real_count) ASSERT_EQ(c, 1) << "index " << idx;
              // ... and their union is the data set minus the dropped tail.
              ASSERT_EQ(real_total, n - plan.samples_dropped);
              ASSERT_EQ(static_cast<int64_t>(real_count.size()), n - plan.samples_dropped);
              ASSERT_EQ(padded, plan.samples_padded);
              if (policy == LastBatch::kDrop) {
                // The dropped ones are exactly the permutation's tail.
                const auto& perm = sharder.permutation();
                for (int64_t i = n - plan.samples_dropped; i < n; ++i) {
                  ASSERT_EQ(real_count.count(perm[i]), 0u);
                }
              }
            }
            // Every rank runs the same number of steps; under drop/pad the same samples.
            for (int64_t r = 0; r < W; ++r) {
              if (policy != LastBatch::kKeep) {
                ASSERT_EQ(plan.rankSamplesPerEpoch(r), plan.steps_per_epoch * a * m);
              }
            }
            ++combos;
          }
        }
      }
    }
  }
  EXPECT_GT(combos, 1000);
}

TEST(Plan, PaddingRepeatsFromTheStartOfThePermutationWithWeightZero) {
  const auto plan = makePlan(batchConfig(8, 2, 0, LastBatch::kPad), 2, 13, true);
  EXPECT_EQ(plan.steps_per_epoch, 2);
  EXPECT_EQ(plan.samples_padded, 3);
  Sharder sharder(plan, 3);
  const auto& perm = sharder.permutation();
  // Global step 1 covers positions 8..15; 13, 14, 15 are padding = perm[0..2].
  const auto last = sharder.micro(1, 1, 1);  // slot 3 -> positions 14, 15
  ASSERT_EQ(last.indices.size(), 2u);
  EXPECT_EQ(last.indices[0], perm[1]);
  EXPECT_EQ(last.indices[1], perm[2]);
  EXPECT_EQ(last.weights[0], 0.0f);
  EXPECT_EQ(last.weights[1], 0.0f);
  const auto mixed = sharder.micro(1, 0, 1);  // slot 2 -> positions 12, 13
  EXPECT_EQ(mixed.weights[0], 1.0f);
  EXPECT_EQ(mixed.weights[1], 0.0f);
  EXPECT_EQ(mixed.indices[1], perm[0]);
}

TEST(Plan, PermutationIsSeededPerEpoch) {
  const auto a = seededPermutation(100, 5, 0);
  EXPECT_EQ(a, seededPermutation(100, 5, 0));
  EXPECT_NE(a, seededPermutation(100, 5, 1));
  EXPECT_NE(a, seededPermutation(100, 6, 0));
  auto sorted = a;
  std::sort(sorted.begin(), sorted.end());
  for (int64_t i = 0; i < 100; ++i) EXPECT_EQ(sorted[i], i);
}

TEST(Plan, EvalShardsPartitionTheValidationSet) {
  for (int64_t n : {0, 1, 5, 359, 360}) {
    for (int64_t W : {1, 2, 3, 4, 7}) {
      int64_t next = 0;
      for (int64_t r = 0; r < W; ++r) {
        const auto [b, e] = evalShard(n, W, r);
        EXPECT_EQ(b, next);
        EXPECT_LE(e - b, n / W + 1);
        EXPECT_GE(e - b, n / W);
        next = e;
      }
      EXPECT_EQ(next, n);
    }
  }
}

TEST(Plan, JsonHasTheDocumentedKeys) {
  const auto plan = makePlan(batchConfig(96, 0, 0, LastBatch::kPad), 3, 1438, true);
  const auto node = YAML::Load(planJson(plan).dump());
  for (const char* key : {"world_size", "per_gpu_batch", "accum_steps", "global_batch",
                          "steps_per_epoch", "samples_dropped", "samples_padded", "lr",
                          "warmup_steps", "ranks"}) {
    EXPECT_TRUE(node[key].IsDefined()) << key;
  }
  EXPECT_EQ(node["world_size"].as<int>(), 3);
  EXPECT_EQ(node["per_gpu_batch"].as<int>(), 32);
  EXPECT_EQ(node["samples_padded"].as<int>(), 2);
  ASSERT_EQ(node["ranks"].size(), 3u);
  EXPECT_EQ(node["ranks"][2]["samples_per_epoch"].as<int>(), 15 * 32);
}

// Note [oom back-off]: the step is redone with the largest proper divisor of m,
// never below the BatchNorm minimum.
TEST(Plan, BackOffTakesTheLargestProperDivisorDownToTheMinimum) {
  EXPECT_EQ(backedOffPerGpu(32, 2), 16);
  EXPECT_EQ(backedOffPerGpu(12, 2), 6);
  EXPECT_EQ(backedOffPerGpu(9, 2), 3);
  EXPECT_EQ(backedOffPerGpu(7, 1), 1);   // prime, no BatchNorm
  EXPECT_EQ(backedOffPerGpu(7, 2), 0);   // prime, BatchNorm: nothing left
  EXPECT_EQ(backedOffPerGpu(4, 2), 2);
  EXPECT_EQ(backedOffPerGpu(2, 2), 0);   // the BatchNorm minimum reached
  EXPECT_EQ(backedOffPerGpu(8, 8), 0);   // batch.min_per_gpu 8
  EXPECT_EQ(backedOffPerGpu(1, 1), 0);
}

// Note [oom back-off] relies on Note [equal shards]: for a fixed G, rank r's
// samples in step s (and their weights) are the same whatever the split m x a;
// only how they are cut into micro-batches changes.
TEST(Plan, ARanksSamplesOfAStepDoNotDependOnTheSplit) {
  for (auto policy : {LastBatch::kDrop, LastBatch::kPad}) {
    for (int64_t W : {1, 2, 3}) {
      const int64_t n = 301;
      const auto base = makePlan(batchConfig(24 * W, 24, 0, policy), W, n, true);
      Sharder a(base, 7);
      a.setEpoch(1);
      for (int64_t m = backedOffPerGpu(24, 2); m > 0; m = backedOffPerGpu(m, 2)) {
        const auto split = withPerGpu(base, m);
        ASSERT_EQ(split.global, base.global);
        ASSERT_EQ(split.per_gpu * split.accum, 24);
        ASSERT_EQ(split.steps_per_epoch, base.steps_per_epoch);
        Sharder b(split, 7);
        b.setEpoch(1);
        for (int64_t s = 0; s < base.steps_per_epoch; ++s) {
          ASSERT_EQ(a.realSamples(s), b.realSamples(s));
          for (int64_t r = 0; r < W; ++r) {
            std::vector<int64_t> ia, ib;
            std::vector<float> wa, wb;
            for (int64_t k = 0; k < base.accum; ++k) {
              const auto mb = a.micro(s, k, r);
              ia.insert(ia.end(), mb.indices.begin(), mb.indices.end());
              wa.insert(wa.end(), mb.weights.begin(), mb.weights.end());
            }
            for (int64_t k = 0; k < split.accum; ++k) {
              const auto mb = b.micro(s, k, r);
              ib.insert(ib.end(), mb.indices.begin(), mb.indices.end());
              wb.insert(wb.end(), mb.weights.begin(), mb.weights.end());
            }
            ASSERT_EQ(ia, ib) << "W=" << W << " m=" << m << " step " << s << " rank " << r;
            ASSERT_EQ(wa, wb);
          }
        }
      }
    }
  }
}

namespace {

/// A byte-level language model's config (Note [tokens]) with `batch` as its
/// batch section; the token file is not read by the config or the plan.
Config tokensConfig(const std::string& batch, int64_t seq_len = 64) {
  return parseConfig("model: {name: gpt, seq_len: " + std::to_string(seq_len) +
                         "}\ndata: {name: tokens, path: t.bin}\nbatch: " + batch,
                     "t.yaml");
}

}  // namespace

// Note [global tokens]: the nearest whole number of windows (a half rounds up, at
// least one), and the plan says how it rounded.
TEST(Plan, GlobalTokensRoundToWholeWindowsAndThePlanSaysHow) {
  struct Row {
    int64_t tokens, seq_len, want_global;
    std::string line;
  };
  const Row rows[] = {
      {2048, 64, 32, "  tokens: batch.global_tokens 2048 = 32 windows of 64 tokens "
                     "(model.seq_len): global batch 32 (2048 tokens per step)\n"},
      {2070, 64, 32, "  tokens: batch.global_tokens 2070 = 32.34 windows of 64 tokens "
                     "(model.seq_len), rounded down to whole windows: global batch 32 (2048 "
                     "tokens per step)\n"},
      {2080, 64, 33, "  tokens: batch.global_tokens 2080 = 32.50 windows of 64 tokens "
                     "(model.seq_len), rounded up to whole windows: global batch 33 (2112 tokens "
                     "per step)\n"},
      {10, 64, 1, "  tokens: batch.global_tokens 10 = 0.16 windows of 64 tokens (model.seq_len), "
                  "rounded up to whole windows: global batch 1 (64 tokens per step)\n"},
      {500000, 1024, 488, "  tokens: batch.global_tokens 500000 = 488.28 windows of 1024 tokens "
                          "(model.seq_len), rounded down to whole windows: global batch 488 "
                          "(499712 tokens per step)\n"},
  };
  for (const auto& r : rows) {
    SCOPED_TRACE(::testing::Message() << r.tokens << " tokens, seq_len " << r.seq_len);
    const auto cfg = tokensConfig("{global_tokens: " + std::to_string(r.tokens) + "}", r.seq_len);
    EXPECT_EQ(cfg.batch.global, r.want_global);
    const auto plan = makePlan(cfg, 1, 100000, false);
    EXPECT_EQ(plan.global, r.want_global);
    EXPECT_EQ(plan.tokens_per_sample, r.seq_len);
    EXPECT_EQ(plan.tokensPerStep(), r.want_global * r.seq_len);
    const auto text = planText(plan);
    // The line follows the split's line and replaces the plain tokens line.
    EXPECT_EQ(text.find(r.line), text.find('\n') + 1) << text;
    EXPECT_EQ(text.find("x " + std::to_string(r.seq_len) + " tokens (model.seq_len) ="),
              std::string::npos)
        << text;
    const auto json = planJson(plan);
    EXPECT_EQ(json.at("global_tokens_asked").get<int64_t>(), r.tokens);
    EXPECT_EQ(json.at("tokens_per_step").get<int64_t>(), r.want_global * r.seq_len);
  }
}

// A global batch from batch.global_tokens that does not split over the ranks is
// named by that key, with the nearest valid values in tokens.
TEST(Plan, AGlobalTokensBatchThatDoesNotSplitIsNamedInTokens) {
  const auto msg = planError(tokensConfig("{global_tokens: 2080}"), 2, 100000, false);
  EXPECT_EQ(msg, "t.yaml: batch.global_tokens=2080 (33 windows of 64 tokens) is not divisible by "
                 "world size 2; use 2048 or 2176 for batch.global_tokens")
      << msg;
  const auto msg2 = planError(tokensConfig("{global_tokens: 2048, per_gpu: 5}"), 2, 100000, false);
  EXPECT_EQ(msg2, "t.yaml: batch.global_tokens=2048 (32 windows of 64 tokens) is not divisible by "
                  "world size 2 x batch.per_gpu 5 (= 10); use 1920 or 2560 for batch.global_tokens")
      << msg2;
  // The same numbers given in samples read as before.
  EXPECT_EQ(planError(tokensConfig("{global: 33}"), 2, 100000, false),
            "t.yaml: batch.global=33 is not divisible by world size 2; use 32 or 34");
  EXPECT_NE(planError(tokensConfig("{global_tokens: 6400}"), 1, 50, false)
                .find("fewer than batch.global_tokens=6400 (100 windows of 64 tokens)"),
            std::string::npos);
}

// Note [tokens per sample]: token windows add tokens to the plan's text and JSON;
// other samples leave both exactly as they were.
TEST(Plan, TokensPerStepOnlyWhenSamplesAreTokens) {
  const auto plan = makePlan(tokensConfig("{global: 32}"), 2, 494, false);
  EXPECT_EQ(plan.tokens_per_sample, 64);
  EXPECT_EQ(plan.global_tokens, 0);
  const auto text = planText(plan);
  EXPECT_EQ(text.find("  tokens: global batch 32 x 64 tokens (model.seq_len) = 2048 tokens per "
                      "step\n"),
            text.find('\n') + 1)
      << text;
  EXPECT_EQ(text.find("global_tokens"), std::string::npos) << text;
  const auto json = planJson(plan);
  EXPECT_EQ(json.at("tokens_per_sample").get<int64_t>(), 64);
  EXPECT_EQ(json.at("tokens_per_step").get<int64_t>(), 2048);
  EXPECT_FALSE(json.contains("global_tokens_asked"));
  // An adaptive run's later split keeps the tokens of a sample; the step's follow G.
  const auto wider = withGlobal(plan, 64, 32, 1);
  EXPECT_EQ(wider.tokensPerStep(), 64 * 64);

  const auto samples = makePlan(batchConfig(96, 0, 0, LastBatch::kPad), 3, 1438, false);
  EXPECT_EQ(samples.tokens_per_sample, 0);
  EXPECT_EQ(samples.tokensPerStep(), 0);
  EXPECT_EQ(planText(samples).find("token"), std::string::npos) << planText(samples);
  const auto keys = planJson(samples);
  EXPECT_FALSE(keys.contains("tokens_per_sample") || keys.contains("tokens_per_step"));
  EXPECT_EQ(tokensPerSample(batchConfig(96, 0, 0, LastBatch::kDrop)), 0);
  EXPECT_EQ(tokensPerSample(tokensConfig("{global: 8}", 128)), 128);
}
