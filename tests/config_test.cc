#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>

#include <filesystem>

#include "collective/error.h"
#include "worker/config/config.h"

using batchdist::ConfigError;
using namespace batchdist::worker;

namespace {

/// The message of the ConfigError that parsing `yaml` (with overrides) throws.
std::string errorOf(const std::string& yaml, const std::vector<std::string>& sets = {}) {
  try {
    parseConfig(yaml, "test.yaml", sets);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "<no error>";
}

}  // namespace

TEST(Config, DefaultsFromEmptyFile) {
  const auto cfg = parseConfig("", "empty.yaml");
  EXPECT_STREQ(toString(cfg.model.name), "mlp");
  EXPECT_STREQ(toString(cfg.data.name), "digits");
  EXPECT_EQ(cfg.batch.global, 0);
  EXPECT_EQ(cfg.batch.last_batch, LastBatch::kDrop);
  EXPECT_STREQ(toString(cfg.optim.name), "sgd");
  EXPECT_STREQ(toString(cfg.dist.backend), "auto");
  EXPECT_EQ(cfg.train.epochs, 10);
}

TEST(Config, ReadsTypedValues) {
  const auto cfg = parseConfig(R"(
model: {name: cnn, channels: [8, 16], batchnorm: false}
data: {name: synthetic, samples: 1000, shape: [1, 8, 8], classes: 4}
batch: {global: 128, per_gpu: auto, last_batch: pad}
optim: {name: adamw, lr: 0.003, lr_scaling: sqrt, warmup_epochs: 2.5, schedule: cosine}
train: {epochs: 3, seed: 7}
dist: {backend: gloo, timeout_s: 30, interface: lo}
)",
                               "t.yaml");
  EXPECT_STREQ(toString(cfg.model.name), "cnn");
  EXPECT_EQ(cfg.model.channels, (std::vector<int64_t>{8, 16}));
  EXPECT_FALSE(cfg.model.batchnorm);
  EXPECT_EQ(cfg.data.samples, 1000);
  EXPECT_EQ(cfg.data.shape, (std::vector<int64_t>{1, 8, 8}));
  EXPECT_EQ(cfg.batch.global, 128);
  EXPECT_TRUE(cfg.batch.per_gpu_auto);
  EXPECT_EQ(cfg.batch.last_batch, LastBatch::kPad);
  EXPECT_EQ(cfg.optim.lr_scaling, LrScaling::kSqrt);
  EXPECT_DOUBLE_EQ(cfg.optim.warmup_epochs, 2.5);
  EXPECT_EQ(cfg.optim.schedule, Schedule::kCosine);
  EXPECT_EQ(cfg.train.seed, 7);
  EXPECT_EQ(cfg.dist.interface, "lo");
}

TEST(Config, UnknownKeySuggestsTheNearestKey) {
  const auto msg = errorOf("batch:\n  globl: 64\n");
  EXPECT_NE(msg.find("test.yaml:2: batch.globl: unknown key"), std::string::npos) << msg;
  EXPECT_NE(msg.find("did you mean 'batch.global'"), std::string::npos) << msg;
}

TEST(Config, KeyInTheWrongSectionPointsToTheRightOne) {
  const auto msg = errorOf("train:\n  lr: 0.1\n");
  EXPECT_NE(msg.find("did you mean 'optim.lr'"), std::string::npos) << msg;
}

TEST(Config, UnknownSectionSuggestsOne) {
  const auto msg = errorOf("bach:\n  global: 64\n");
  EXPECT_NE(msg.find("unknown section 'bach'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("did you mean 'batch'"), std::string::npos) << msg;
}

TEST(Config, WrongTypeNamesFileLineKeyAndValue) {
  const auto msg = errorOf("model:\n  name: mlp\nbatch:\n  global: lots\n");
  EXPECT_NE(msg.find("test.yaml:4: batch.global: expected an integer or 'auto', got 'lots'"),
            std::string::npos)
      << msg;
  EXPECT_NE(errorOf("optim: {lr: fast}").find("optim.lr: expected a number, got 'fast'"),
            std::string::npos);
  EXPECT_NE(errorOf("model: {hidden: 12}").find("model.hidden: expected a list of integers"),
            std::string::npos);
  EXPECT_NE(errorOf("model: {batchnorm: maybe}").find("expected true or false"), std::string::npos);
  EXPECT_NE(errorOf("batch: 64").find("batch: expected a mapping"), std::string::npos);
}

TEST(Config, OutOfRangeValuesAreRefused) {
  EXPECT_NE(errorOf("batch: {per_gpu: -4}").find("batch.per_gpu: must be >= 1, got -4"),
            std::string::npos);
  EXPECT_NE(errorOf("train: {epochs: 0}").find("train.epochs: must be >= 1, got 0"),
            std::string::npos);
  EXPECT_NE(errorOf("optim: {momentum: 1.5}").find("optim.momentum: 1.5 is out of range"),
            std::string::npos);
  EXPECT_NE(errorOf("dist: {backend: mpi}").find("'mpi' is not one of auto | gloo | nccl"),
            std::string::npos);
  EXPECT_NE(errorOf("batch: {last_batch: pda}").find("did you mean 'pad'"), std::string::npos);
}

TEST(Config, MalformedYamlNamesLineAndColumn) {
  const auto msg = errorOf("model:\n  name: [mlp\n");
  EXPECT_NE(msg.find("test.yaml:"), std::string::npos) << msg;
  EXPECT_NE(msg.find("malformed YAML"), std::string::npos) << msg;
}

TEST(Config, SetOverridesAreTypedLikeYaml) {
  const auto cfg = parseConfig("batch: {global: 64}\n", "t.yaml",
                               {"batch.global=128", "model.hidden=[32, 16]", "batch.per_gpu=auto",
                                "model.batchnorm=false", "optim.lr=0.5"});
  EXPECT_EQ(cfg.batch.global, 128);
  EXPECT_EQ(cfg.model.hidden, (std::vector<int64_t>{32, 16}));
  EXPECT_TRUE(cfg.batch.per_gpu_auto);
  EXPECT_FALSE(cfg.model.batchnorm);
  EXPECT_DOUBLE_EQ(cfg.optim.lr, 0.5);
}

TEST(Config, BadSetIsNamedAsSet) {
  EXPECT_NE(errorOf("", {"batch.global"}).find("--set expects key.path=value"), std::string::npos);
  EXPECT_NE(errorOf("", {"batch.global=x"}).find("--set batch.global: expected an integer"),
            std::string::npos);
  EXPECT_NE(errorOf("", {"batch.globl=1"}).find("--set batch.globl: unknown key"),
            std::string::npos);
  EXPECT_NE(errorOf("", {"global=1"}).find("keys have the form section.key"), std::string::npos);
}

TEST(Config, ResolvedConfigIsJsonWithEveryKey) {
  const auto cfg = parseConfig("batch: {global: 64}\n", "t.yaml");
  const auto node = YAML::Load(cfg.resolved.dump());
  EXPECT_EQ(node["batch"]["global"].as<int>(), 64);
  EXPECT_EQ(node["optim"]["name"].as<std::string>(), "sgd");
  EXPECT_EQ(node["dist"]["timeout_s"].as<double>(), 300);
  EXPECT_TRUE(node["batch"]["per_gpu"].IsNull());
}

TEST(Config, EditDistance) {
  EXPECT_EQ(editDistance("global", "globl"), 1u);
  EXPECT_EQ(editDistance("", "abc"), 3u);
  EXPECT_EQ(editDistance("same", "same"), 0u);
}

TEST(Config, EveryShippedConfigParses) {
  int seen = 0;
  for (const auto& entry :
       std::filesystem::directory_iterator(std::string(BATCHDIST_SOURCE_DIR) + "/configs")) {
    if (entry.path().extension() != ".yaml") continue;
    SCOPED_TRACE(entry.path().string());
    EXPECT_NO_THROW(loadConfig(entry.path().string()));
    ++seen;
  }
  EXPECT_GE(seen, 1);
}

TEST(Config, MissingFileIsAConfigError) {
  EXPECT_THROW(loadConfig("/nonexistent/x.yaml"), ConfigError);
}
