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
#include "worker/train/checkpoint/checkpoint.h"

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
    ASSERT_TRUE(found->manifest.rng.has_value()) << "layout: records";
    const auto& rng = *found->manifest.rng;
    EXPECT_EQ(rng.ranks, 2);
    EXPECT_EQ(rng.cpu_bytes > 0, true);
    EXPECT_EQ(rng.cuda_bytes > 0, false) << "a CPU run has no CUDA generator state";
    EXPECT_EQ(rng.cuda_bytes, 0);
    EXPECT_EQ(rng.cpu_bytes, at::detail::getDefaultCPUGenerator().get_state().numel());
    EXPECT_EQ(rng.record(), 16 + (rng.cpu_bytes + 7) / 8 * 8);
    EXPECT_EQ(static_cast<int64_t>(fs::file_size(dir / "step-00000003" / "rng.pt")),
              32 + 2 * rng.record());
    std::printf("[ rng ] CPU generator state %d bytes, record %d bytes\n",
                static_cast<int>(rng.cpu_bytes), static_cast<int>(rng.record()));

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

// optim.kernels (Note [multi-tensor step]) and model.flops_per_sample (Note
// [mfu]) change neither the state nor the updates' meaning: a checkpoint written
// under other values, or before the keys were, resumes; optim.lr still refuses.
TEST(Checkpoint, OptimizerKernelsAndFlopsDoNotBlockAResume) {
  CheckpointManifest m;
  m.config = parseConfig("optim: {name: adamw, kernels: per_tensor}", "t.yaml").resolved;
  m.plan.global = 256;
  EXPECT_NO_THROW(checkResumable(m, parseConfig("optim: {name: adamw, kernels: fused}", "t.yaml"), "ck"));
  m.config["optim"].erase("kernels");
  m.config["model"].erase("flops_per_sample");
  EXPECT_NO_THROW(checkResumable(m, parseConfig("optim: {name: adamw}", "t.yaml"), "ck"));
  EXPECT_THROW(checkResumable(m, parseConfig("optim: {name: adamw, lr: 0.5}", "t.yaml"), "ck"), ConfigError);
}

TEST(Checkpoint, ResumeOfAnAdaptiveRunKeepsAdaptAndItsGainRule) {
  const auto adaptive = [](const std::string& extra) {
    return parseConfig("batch: {global: 64, adapt: goodput" + extra + "}", "t.yaml");
  };
  const auto then = adaptive("");
  CheckpointManifest m;
  m.config = then.resolved;
  m.plan.global = 64;
  m.adapt = nlohmann::ordered_json::object();
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
  warm.config = parseConfig("batch: {global: 64, adapt: warmup}", "t.yaml").resolved;
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
  m.config["batch"].erase("adapt_gain");
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
  CheckpointManifest m;
  m.config = then.resolved;
  m.plan.global = then.batch.global;
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
    CheckpointManifest m;
    m.config = c.resolved;
    m.plan.global = 64;
    EXPECT_NO_THROW(checkResumable(m, mlp(now), "ck")) << then << " -> " << now;
    EXPECT_THROW(checkResumable(m, mlp(std::string(now) + ", dropout: 0.5"), "ck"), ConfigError);
  }
}

TEST(Checkpoint, ResumeRefusesAnotherModelNamingTheKey) {
  const auto then = parseConfig("model: {hidden: [16]}\nbatch: {global: 64}", "t.yaml");
  CheckpointManifest m;
  m.config = then.resolved;
  m.plan.global = 64;
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

namespace {

/// A manifest with every field set, the optional ones included.
CheckpointManifest fullManifest() {
  CheckpointManifest m;
  m.batchdist_version = "9.9.9";
  m.torch_version = "2.1.0";
  m.created_unix = 1700000000;
  m.step = 30;
  m.epoch = 2;
  m.step_in_epoch = 10;
  m.lr_next = 0.0125;
  m.samples = 640;
  m.epoch_samples = 160;
  m.epoch_loss_sum = 123.456;
  EpochStats e;
  e.epoch = 1;
  e.train_loss = 0.7;
  e.eval_loss = 0.65;
  e.eval_metrics = {{"accuracy", 0.8}, {"top5", 0.99}};
  e.samples_per_s = 1234.5;
  e.seconds = 3.25;
  e.noise_scale = 42.0;
  m.history = {e, e};
  m.plan = {32, 8, 2, 2, 20, 60, 640};
  m.searched_per_gpu = 8;
  m.levers = {Shard::kOptimizer, Recompute::kOn};
  m.config = parseConfig("batch: {global: 32}", "t.yaml").resolved;
  m.config_hash = fnv1a64Hex(m.config.dump());
  m.parameters = {"fc0.weight", "fc0.bias"};
  m.buffers = {};
  m.rng = RngLayout{2, 5056, 16, 206};
  m.adapt = {{"epoch", 2}, {"step_in_epoch", 10}, {"lr_next", 0.0125}, {"anything", {1, 2}}};
  m.optimizer_state = FlatStateEntry{{"momentum"}, 2, 100, "Float", 4, 2, 1 << 24,
                                     "optimizer_state.bin"};
  m.loss_scaler = ScalerEntry{65536.0, 3, 1};
  m.files = {{"rng.pt", 10176, "0123456789abcdef"}, {"model.pt", 1000, "fedcba9876543210"}};
  return m;
}

}  // namespace

// Note [manifest formats]: one writer and one reader. write -> read -> write gives
// the same document, for a manifest with every field and for one a Checkpointer wrote
// (the bytes of its manifest.json).
TEST(CheckpointManifest, WriteReadWriteIsTheSameDocument) {
  const auto first = manifestJson(fullManifest());
  EXPECT_EQ(first.at("checksum"), manifestChecksum(first));
  const auto again = manifestJson(readManifest(first));
  EXPECT_EQ(again.dump(1), first.dump(1));
  const auto back = readManifest(first);
  EXPECT_EQ(back.levers, (Levers{Shard::kOptimizer, Recompute::kOn}));
  ASSERT_TRUE(back.rng && back.optimizer_state && back.loss_scaler);
  EXPECT_EQ(back.rng->record(), 16 + 5056 + 16);
  EXPECT_EQ(back.history[1].eval_metrics[1].name, "top5");
  EXPECT_EQ(back.optimizer_state->names, std::vector<std::string>{"momentum"});

  const auto dir = freshDir("manifest_roundtrip");
  Config cfg = parseConfig("model: {hidden: [8], batchnorm: false}", "t.yaml");
  runRanks(1, [&](collective::Communicator& comm) {
    auto model = buildModel(cfg.model, {4}, 3);
    auto opt = makeOptimizer(cfg.optim, model->trainableParameters());
    CheckpointIdentity id;
    id.plan.world_size = 1;
    id.plan.steps_per_epoch = 4;
    id.config = cfg.resolved;
    Checkpointer ck(foreground(cfg.checkpoint), dir.string(), id, comm);
    Console quiet(false, ProgressStyle::kOff);
    TrainPosition pos;
    pos.global_step = 5;
    ASSERT_TRUE(ck.save({model.get(), opt.get(), nullptr, at::kCPU}, pos, false, quiet).error.empty());
  });
  const auto check = verifyCheckpoint((dir / "step-00000005").string());
  ASSERT_TRUE(check.problem.empty()) << check.problem;
  EXPECT_EQ(manifestJson(check.manifest).dump(1) + "\n", check.text);
  EXPECT_EQ(check.manifest.epoch, 1);
  EXPECT_EQ(check.manifest.step_in_epoch, 1);
}

// Formats 1 and 2 (Note [manifest formats]): positional history epochs with
// classification's accuracy and no noise scale, no levers; format 1 without "rng"
// (its rng.pt a torch archive). The reader converts them into today's fields.
TEST(CheckpointManifest, ReadsFormatsOneAndTwo) {
  auto j = manifestJson(fullManifest());
  j["format"] = 2;
  j.erase("levers");
  j.erase("optimizer_state");
  j["history"] = nlohmann::ordered_json::array({{0, 1.5, 1.25, 0.75, 1000.0, 2.0},
                                                {1, 1.0, 0.9, 0.8, 1100.0, 1.5}});
  auto m = readManifest(j);
  EXPECT_EQ(m.format, 2);
  EXPECT_EQ(m.levers, Levers{}) << "none and off before the levers were recorded";
  EXPECT_EQ(m.levers.shard, Shard::kNone);
  EXPECT_EQ(m.levers.recompute, Recompute::kOff);
  ASSERT_EQ(m.history.size(), 2u);
  EXPECT_EQ(m.history[1].epoch, 1);
  EXPECT_DOUBLE_EQ(m.history[1].train_loss, 1.0);
  EXPECT_DOUBLE_EQ(m.history[1].eval_loss, 0.9);
  ASSERT_EQ(m.history[1].eval_metrics.size(), 1u);
  EXPECT_EQ(m.history[1].eval_metrics[0].name, "accuracy");
  EXPECT_DOUBLE_EQ(m.history[1].eval_metrics[0].value, 0.8);
  EXPECT_DOUBLE_EQ(m.history[1].samples_per_s, 1100.0);
  EXPECT_DOUBLE_EQ(m.history[1].seconds, 1.5);
  EXPECT_DOUBLE_EQ(m.history[1].noise_scale, -1) << "not measured";
  ASSERT_TRUE(m.rng.has_value());
  EXPECT_EQ(m.rng->ranks, 2);
  EXPECT_FALSE(m.optimizer_state.has_value());
  // Written again, it is today's format with today's keys.
  const auto now = manifestJson(m);
  EXPECT_TRUE(now.at("history")[0].is_object());
  EXPECT_EQ(now.at("levers").at("shard"), "none");

  j["format"] = 1;
  j.erase("rng");
  m = readManifest(j);
  EXPECT_FALSE(m.rng.has_value()) << "format 1: rng.pt is a torch archive";
  EXPECT_EQ(m.history.size(), 2u);
  // A keyed epoch without noise_scale (written before it was measured): not measured.
  j["history"] = nlohmann::ordered_json::array(
      {{{"epoch", 0}, {"train_loss", 0.5}, {"eval_loss", 0.25}, {"eval", {{"mse", 0.25}}},
        {"samples_per_s", 10.0}, {"seconds", 3.0}}});
  EXPECT_DOUBLE_EQ(readManifest(j).history[0].noise_scale, -1);
}

// A manifest that passed its checksum but lacks a key: an Error naming the key (and
// verifyCheckpoint refuses the checkpoint saying so); a format it does not read, too.
TEST(CheckpointManifest, AMissingKeyIsNamed) {
  const auto message = [](const nlohmann::ordered_json& j) -> std::string {
    try {
      readManifest(j);
    } catch (const batchdist::Error& e) {
      return e.what();
    }
    return "no error";
  };
  const auto full = manifestJson(fullManifest());
  auto j = full;
  j["plan"].erase("world_size");
  EXPECT_NE(message(j).find("manifest.json has no \"plan.world_size\""), std::string::npos)
      << message(j);
  j = full;
  j.erase("step");
  EXPECT_NE(message(j).find("no \"step\""), std::string::npos) << message(j);
  j = full;
  j["history"][1].erase("eval_loss");
  EXPECT_NE(message(j).find("no \"history[1].eval_loss\""), std::string::npos) << message(j);
  j = full;
  j.erase("rng");
  EXPECT_NE(message(j).find("no \"rng\""), std::string::npos) << "format 2 on has rng.pt's records";
  j = full;
  j["files"][0]["bytes"] = "ten";
  EXPECT_NE(message(j).find("\"files[0].bytes\" is \"ten\""), std::string::npos) << message(j);
  j = full;
  j["levers"]["shard"] = "sideways";
  EXPECT_NE(message(j).find("\"levers.shard\" is \"sideways\""), std::string::npos) << message(j);
  j = full;
  j["format"] = 6;
  EXPECT_EQ(message(j), "format 6, this batchdist reads formats 1 to 5");

  const auto dir = freshDir("manifest_missing_key") / "step-00000001";
  fs::create_directories(dir);
  j = full;
  j["files"] = nlohmann::ordered_json::array();
  j.erase("searched_per_gpu");
  j["checksum"] = manifestChecksum(j);
  { std::ofstream(dir / "manifest.json") << j.dump(1) << "\n"; }
  const auto check = verifyCheckpoint(dir.string());
  EXPECT_NE(check.problem.find("no \"searched_per_gpu\""), std::string::npos) << check.problem;
}
