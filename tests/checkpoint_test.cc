// Checkpoints (Note [checkpoint]): format, verification, round trip of model and
// optimizer state, and the config section. Ranks as threads over a HashStore + Gloo.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <ATen/CPUGeneratorImpl.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "tests/scratch_dir.h"
#include "tests/thread_ranks.h"
#include "common/error.h"
#include "collective/process_group.h"
#include "collective/torch_compat.h"
#include "worker/common/console.h"
#include "worker/config/config.h"
#include "worker/model/model.h"
#include "worker/model/optimizer.h"
#include "worker/train/checkpoint.h"

using namespace batchdist;
using namespace batchdist::worker;
namespace fs = std::filesystem;

namespace {

/// These tests read the files right after save(): written in the foreground
/// (Note [background checkpoint]; the background's own test is in checkpoint_test.cc).
batchdist::worker::CheckpointConfig foreground(batchdist::worker::CheckpointConfig c) {
  c.background = false;
  return c;
}

using testsupport::runRanks;

/// A checkpoint directory not made yet, in a scratch directory of this test
/// process's own (Note [scratch dirs]), removed when it ends.
fs::path freshDir(const std::string& name) {
  return testsupport::scratchDir("ckpt_test_" + name) / "checkpoints";
}

/// One SGD-with-momentum step of an mlp on random data.
void step(Model& model, Optimizer& opt) {
  auto x = torch::randn({8, 4});
  auto y = torch::randint(0, 3, {8});
  opt.zeroGrad();
  torch::nn::functional::cross_entropy(model.forward(x), y).backward();
  opt.step(0.1);
}

}  // namespace

TEST(Checkpoint, Fnv1a64KnownValues) {
  EXPECT_EQ(fnv1a64("", 0), 0xcbf29ce484222325ull);
  EXPECT_EQ(fnv1a64("a", 1), 0xaf63dc4c8601ec8cull);
  EXPECT_EQ(fnv1a64("foobar", 6), 0x85944171f73967e8ull);
  EXPECT_EQ(checkpointName(40), "step-00000040");
}

TEST(Checkpoint, ConfigSectionDefaultsAndValues) {
  const auto d = parseConfig("{}", "t.yaml");
  EXPECT_EQ(d.checkpoint.every_steps, 0);
  EXPECT_EQ(d.checkpoint.every_minutes, 30);
  EXPECT_EQ(d.checkpoint.keep, 2);
  EXPECT_EQ(d.checkpoint.resume, ResumeMode::kOff);
  const auto c = parseConfig("checkpoint: {every_steps: 50, keep: 3, dir: /x, resume: auto}", "t.yaml");
  EXPECT_EQ(c.checkpoint.every_steps, 50);
  EXPECT_EQ(c.checkpoint.keep, 3);
  EXPECT_EQ(c.checkpoint.dir, "/x");
  EXPECT_EQ(c.checkpoint.resume, ResumeMode::kAuto);
  EXPECT_THROW(parseConfig("checkpoint: {resume: yes please}", "t.yaml"), ConfigError);
  EXPECT_THROW(parseConfig("checkpoint: {keep: 0}", "t.yaml"), ConfigError);
}

// Save after some steps, load into a fresh model and optimizer, take two more steps
// on both: bitwise the same (the state went into the optimizer's own tensors).
class CheckpointRoundTrip : public ::testing::TestWithParam<const char*> {};

TEST_P(CheckpointRoundTrip, ContinuesBitwiseAndDamageIsRefused) {
  const auto dir = freshDir(std::string("roundtrip_") + GetParam());
  Config cfg = parseConfig(std::string("model: {hidden: [16], batchnorm: false}\noptim: {name: ") +
                               GetParam() + ", momentum: 0.9, weight_decay: 0.01}",
                           "t.yaml");
  cfg.checkpoint.keep = 1;
  runRanks(2, [&](collective::Communicator& comm) {
    torch::manual_seed(3);
    auto a = buildModel(cfg.model, {4}, 3);
    auto opt_a = makeOptimizer(cfg.optim, a->trainableParameters());
    for (int i = 0; i < 3; ++i) step(*a, *opt_a);
    Console console(false, ProgressStyle::kOff);
    CheckpointIdentity id;
    id.plan.global = 16;
    id.plan.world_size = 2;
    id.plan.steps_per_epoch = 10;
    id.config = cfg.resolved;
    Checkpointer ck(foreground(cfg.checkpoint), dir.string(), id, comm);
    TrainState st{a.get(), opt_a.get(), nullptr, at::kCPU};
    TrainPosition pos;
    pos.global_step = 3;
    for (int64_t s : {1, 3}) {
      pos.global_step = s;
      const auto rec = ck.save(st, pos, false, console);
      ASSERT_TRUE(rec.error.empty()) << rec.error;
    }
    if (comm.rank() != 0) return;
    EXPECT_FALSE(fs::exists(dir / "step-00000001")) << "keep: 1";
    std::vector<std::string> rejected;
    const auto found = findLatestCheckpoint(dir.string(), &rejected);
    ASSERT_TRUE(found.has_value());
    EXPECT_EQ(positionOf(found->manifest).global_step, 3);
    // Note [rng records]: what rng.pt holds, in the manifest; its size follows.
    const auto& rng = found->manifest["rng"];
    EXPECT_EQ(rng.value("layout", ""), "records");
    EXPECT_EQ(rng.value("ranks", 0), 2);
    EXPECT_EQ(rng.value("cpu", false), true);
    EXPECT_EQ(rng.value("cuda", true), false) << "a CPU run has no CUDA generator state";
    EXPECT_EQ(rng.value("cuda_bytes", -1), 0);
    EXPECT_EQ(rng.value("cpu_bytes", 0), at::detail::getDefaultCPUGenerator().get_state().numel());
    EXPECT_EQ(rng.value("record_bytes", 0), 16 + (rng.value("cpu_bytes", 0) + 7) / 8 * 8);
    EXPECT_EQ(static_cast<int64_t>(fs::file_size(dir / "step-00000003" / "rng.pt")),
              32 + 2 * rng.value("record_bytes", 0));
    std::printf("[ rng ] CPU generator state %d bytes, record %d bytes\n",
                rng.value("cpu_bytes", 0), rng.value("record_bytes", 0));

    torch::manual_seed(99);  // other initial weights, no optimizer state
    auto b = buildModel(cfg.model, {4}, 3);
    auto opt_b = makeOptimizer(cfg.optim, b->trainableParameters());
    restoreState(*found, {b.get(), opt_b.get(), nullptr, at::kCPU}, 0, 2);
    for (int i = 0; i < 2; ++i) {
      torch::manual_seed(5 + i);
      step(*a, *opt_a);
      torch::manual_seed(5 + i);
      step(*b, *opt_b);
    }
    for (std::size_t i = 0; i < a->parameters().size(); ++i) {
      EXPECT_TRUE(torch::equal(a->parameters()[i], b->parameters()[i])) << "parameter " << i;
    }

    // One flipped byte in the optimizer state: refused, named.
    const auto f = dir / "step-00000003" / "optimizer.pt";
    std::fstream io(f, std::ios::in | std::ios::out | std::ios::binary);
    io.seekg(64);
    char ch = 0;
    io.read(&ch, 1);
    ch ^= 1;
    io.seekp(64);
    io.write(&ch, 1);
    io.close();
    const auto bad = verifyCheckpoint((dir / "step-00000003").string());
    EXPECT_NE(bad.problem.find("optimizer.pt: checksum mismatch"), std::string::npos) << bad.problem;
    EXPECT_FALSE(findLatestCheckpoint(dir.string(), &rejected).has_value());
    ASSERT_EQ(rejected.size(), 1u);
    fs::remove(dir / "step-00000003" / "manifest.json");
    EXPECT_NE(verifyCheckpoint((dir / "step-00000003").string()).problem.find("no manifest.json"),
              std::string::npos);
  });
}

// SGD momentum, Adam moments and step counts, LARS momentum.
INSTANTIATE_TEST_SUITE_P(Optimizers, CheckpointRoundTrip, ::testing::Values("sgd", "adamw", "lars"));

// A format 1 checkpoint (rng.pt a torch archive of every rank's CPU generator,
// no "rng" in the manifest) still verifies and restores this rank's generator.
TEST(Checkpoint, Format1RngArchiveIsStillRead) {
  const auto dir = freshDir("format1");
  Config cfg = parseConfig("model: {hidden: [8], batchnorm: false}", "t.yaml");
  runRanks(1, [&](collective::Communicator& comm) {
    torch::manual_seed(3);
    auto model = buildModel(cfg.model, {4}, 3);
    auto opt = makeOptimizer(cfg.optim, model->trainableParameters());
    CheckpointIdentity id;
    id.plan.world_size = 2;
    id.config = cfg.resolved;
    Checkpointer ck(foreground(cfg.checkpoint), dir.string(), id, comm);
    Console quiet(false, ProgressStyle::kOff);
    TrainPosition pos;
    pos.global_step = 1;
    ASSERT_TRUE(ck.save({model.get(), opt.get(), nullptr, at::kCPU}, pos, false, quiet).error.empty());
    const auto step = dir / "step-00000001";
    // Rewrite it as format 1: rank 1's generator is the one a resume must take.
    torch::manual_seed(41);
    const auto expected = torch::rand({4});
    torch::manual_seed(41);
    torch::serialize::OutputArchive archive;
    archive.write("r0", torch::zeros({1}, torch::kByte), /*is_buffer=*/true);
    archive.write("r1", at::detail::getDefaultCPUGenerator().get_state(), /*is_buffer=*/true);
    std::ostringstream bytes;
    archive.save_to(bytes);
    { std::ofstream(step / "rng.pt", std::ios::binary) << bytes.str(); }
    auto m = nlohmann::ordered_json::parse(std::ifstream(step / "manifest.json"));
    m["format"] = 1;
    m.erase("rng");
    for (auto& f : m["files"]) {
      if (f["name"] != "rng.pt") continue;
      f["bytes"] = bytes.str().size();
      char hash[20];
      std::snprintf(hash, sizeof hash, "%016llx",
                    static_cast<unsigned long long>(fnv1a64(bytes.str().data(), bytes.str().size())));
      f["fnv1a64"] = hash;
    }
    m.erase("checksum");
    char sum[20];
    const std::string dump = m.dump();
    std::snprintf(sum, sizeof sum, "%016llx",
                  static_cast<unsigned long long>(fnv1a64(dump.data(), dump.size())));
    m["checksum"] = sum;
    { std::ofstream(step / "manifest.json") << m.dump(1) << "\n"; }
    const auto c = verifyCheckpoint(step.string());
    ASSERT_TRUE(c.problem.empty()) << c.problem;
    torch::manual_seed(0);
    restoreState(c, {model.get(), opt.get(), nullptr, at::kCPU}, /*rank=*/1, /*world=*/2);
    EXPECT_TRUE(torch::equal(torch::rand({4}), expected));
  });
}

TEST(Checkpoint, ResumeOfAnAdaptiveRunKeepsAdaptAndItsGainRule) {
  const auto adaptive = [](const std::string& extra) {
    return parseConfig("batch: {global: 64, adapt: goodput" + extra + "}", "t.yaml");
  };
  const auto then = adaptive("");
  nlohmann::ordered_json m{{"config", then.resolved}, {"plan", {{"global", 64}}},
                           {"adapt", nlohmann::ordered_json::object()}};
  EXPECT_NO_THROW(checkResumable(m, adaptive(", adapt_every_steps: 50, adapt_max: 512"), "ck"));
  const auto message = [&](const Config& now) -> std::string {
    try {
      checkResumable(m, now, "ck");
    } catch (const ConfigError& e) {
      return e.what();
    }
    return "no error";
  };
  EXPECT_NE(message(adaptive(", adapt_gain: linear"))
                .find("batch.adapt_gain = linear now, adascale in the checkpoint (its progress "
                      "counts G0-equivalent steps by that rule)"),
            std::string::npos)
      << message(adaptive(", adapt_gain: linear"));
  EXPECT_NE(message(parseConfig("batch: {global: 64}", "t.yaml"))
                .find("batch.adapt = off now, goodput in the checkpoint"),
            std::string::npos);
  // goodput <-> warmup (Note [batch-size warmup]): the same record and progress,
  // only the next decisions differ; a warmup checkpoint says so when refused.
  EXPECT_NO_THROW(checkResumable(m, parseConfig("batch: {global: 64, adapt: warmup}", "t.yaml"), "ck"));
  auto warm = m;
  warm["config"] = parseConfig("batch: {global: 64, adapt: warmup}", "t.yaml").resolved;
  EXPECT_NO_THROW(checkResumable(warm, adaptive(""), "ck"));
  const auto off = [&]() -> std::string {
    try {
      checkResumable(warm, parseConfig("batch: {global: 64}", "t.yaml"), "ck");
    } catch (const ConfigError& e) {
      return e.what();
    }
    return "no error";
  }();
  EXPECT_NE(off.find("batch.adapt = off now, warmup in the checkpoint"), std::string::npos) << off;
  // A checkpoint written before batch.adapt_gain existed was AdaScale's.
  m["config"]["batch"].erase("adapt_gain");
  EXPECT_NO_THROW(checkResumable(m, adaptive(""), "ck"));
  EXPECT_EQ(message(adaptive(", adapt_gain: linear")).find("no error"), std::string::npos);
}

// Note [global tokens]: a resumed run reads the same config, so batch.global_tokens
// gives the checkpoint's global batch again; one that rounds to another is refused,
// naming both keys.
TEST(Checkpoint, ResumeWithGlobalTokensKeepsTheRoundedBatch) {
  const auto lm = [](const std::string& batch) {
    return parseConfig("model: {name: gpt, seq_len: 64}\ndata: {name: tokens, path: t.bin}\n"
                       "batch: " + batch, "t.yaml");
  };
  const auto then = lm("{global_tokens: 2070}");
  nlohmann::ordered_json m{{"config", then.resolved}, {"plan", {{"global", then.batch.global}}}};
  EXPECT_NO_THROW(checkResumable(m, lm("{global_tokens: 2070}"), "ck"));
  EXPECT_NO_THROW(checkResumable(m, lm("{global_tokens: 2060}"), "ck"));  // 32 windows too
  try {
    checkResumable(m, lm("{global_tokens: 2100}"), "ck");
    FAIL() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("batch.global = 33 (batch.global_tokens 2100) now, 32 in "
                                         "the checkpoint"),
              std::string::npos)
        << e.what();
  }
}

// Note [activation recompute]: the same weights and arithmetic, so a resume may switch it
// either way; another model key still may not change.
TEST(Checkpoint, ResumeMaySwitchActivationRecompute) {
  const auto mlp = [](const std::string& extra) {
    return parseConfig("model: {hidden: [16], batchnorm: false" + extra + "}\nbatch: {global: 64}",
                       "t.yaml");
  };
  for (const auto& [then, now] : {std::pair{"", ", recompute: on"}, std::pair{", recompute: on", ""}}) {
    const auto c = mlp(then);
    nlohmann::ordered_json m{{"config", c.resolved}, {"plan", {{"global", 64}}}};
    EXPECT_NO_THROW(checkResumable(m, mlp(now), "ck")) << then << " -> " << now;
    EXPECT_THROW(checkResumable(m, mlp(std::string(now) + ", dropout: 0.5"), "ck"), ConfigError);
  }
}

TEST(Checkpoint, ResumeRefusesAnotherModelNamingTheKey) {
  const auto then = parseConfig("model: {hidden: [16]}\nbatch: {global: 64}", "t.yaml");
  nlohmann::ordered_json m{{"config", then.resolved}, {"plan", {{"global", 64}}}};
  const auto same_but_more_ranks = parseConfig("model: {hidden: [16]}\nbatch: {global: 64, per_gpu: 8}\ntrain: {epochs: 3}", "t.yaml");
  EXPECT_NO_THROW(checkResumable(m, same_but_more_ranks, "ck"));
  try {
    checkResumable(m, parseConfig("model: {hidden: [32]}\nbatch: {global: 64}", "t.yaml"), "ck");
    FAIL() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("model.hidden = [32] now, [16] in the checkpoint"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(checkResumable(m, parseConfig("model: {hidden: [16]}\nbatch: {global: 128}", "t.yaml"), "ck"),
               ConfigError);
  EXPECT_THROW(checkResumable(m, parseConfig("model: {hidden: [16]}\noptim: {name: adamw}\nbatch: {global: 64}", "t.yaml"), "ck"),
               ConfigError);
}

// Note [background checkpoint]: a periodic checkpoint's files are written on a
// thread while training goes on; the next save waits for the write in flight,
// settle() lands the last one and fills in its record; the checkpoint verifies,
// holds the weights of its step (not of a later one), and retention runs.
TEST(Checkpoint, BackgroundWritesLandWithTheWeightsOfTheirStep) {
  const auto dir = freshDir("background");
  Config cfg = parseConfig("model: {hidden: [8], batchnorm: false}", "t.yaml");
  cfg.checkpoint.keep = 2;
  ASSERT_TRUE(cfg.checkpoint.background) << "the default";
  runRanks(2, [&](collective::Communicator& comm) {
    torch::manual_seed(5);
    auto model = buildModel(cfg.model, {4}, 3);
    auto opt = makeOptimizer(cfg.optim, model->trainableParameters());
    CheckpointIdentity id;
    id.plan.world_size = 2;
    id.plan.steps_per_epoch = 10;
    id.config = cfg.resolved;
    Checkpointer ck(cfg.checkpoint, dir.string(), id, comm);
    Console quiet(false, ProgressStyle::kOff);
    TrainState st{model.get(), opt.get(), nullptr, at::kCPU};
    std::vector<CheckpointRecord> records;
    torch::Tensor at_step_3;
    for (int64_t s : {1, 2, 3}) {
      TrainPosition pos;
      pos.global_step = s;
      records.push_back(ck.save(st, pos, false, quiet));
      EXPECT_TRUE(records.back().background);
      EXPECT_TRUE(records.back().error.empty()) << records.back().error;
      // Training goes on: the weights change while the write may still run.
      auto p = model->namedParameters().begin()->second;
      if (s == 3) at_step_3 = p.detach().clone();
      torch::NoGradGuard no_grad;
      p.add_(1.0);
    }
    ck.settle(quiet, &records);
    if (comm.rank() != 0) return;
    for (const auto& r : records) {
      EXPECT_TRUE(r.error.empty()) << r.error;
      EXPECT_GT(r.bytes, 0) << "step " << r.step;
      EXPECT_GT(r.write_seconds, 0) << "step " << r.step;
    }
    EXPECT_FALSE(fs::exists(dir / "step-00000001")) << "keep: 2";
    const auto check = verifyCheckpoint((dir / "step-00000003").string());
    ASSERT_TRUE(check.problem.empty()) << check.problem;
    auto restored = buildModel(cfg.model, {4}, 3);
    auto opt_b = makeOptimizer(cfg.optim, restored->trainableParameters());
    TrainState into{restored.get(), opt_b.get(), nullptr, at::kCPU};
    restoreState(check, into, 0, 1);
    EXPECT_TRUE(torch::equal(restored->namedParameters().begin()->second, at_step_3));
  });
}
