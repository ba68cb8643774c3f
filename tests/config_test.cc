#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>

#include <filesystem>

#include "common/error.h"
#include "tests/config_errors.h"
#include "worker/config/config.h"
#include "worker/model/model.h"

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
  EXPECT_NE(errorOf("dist: {backend: tcp}").find("'tcp' is not one of auto | gloo | mpi | nccl"),
            std::string::npos);
  EXPECT_NE(errorOf("batch: {last_batch: pda}").find("did you mean 'pad'"), std::string::npos);
  EXPECT_NE(errorOf("batch: {global: 64, adapt: fast}")
                .find("batch.adapt: 'fast' is not one of off | goodput | warmup"),
            std::string::npos);
  EXPECT_NE(errorOf("batch: {global: 64, adapt: warmpu}").find("did you mean 'warmup'"),
            std::string::npos);
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

// The C++ library's overrides are named as its user wrote them.
TEST(Config, SettingsOverridesAreNamedAsSettingsSet) {
  const auto errorFrom = [](const std::string& yaml, const std::vector<std::string>& sets) {
    try {
      parseConfig(yaml, "the program's settings", sets, SetsFrom::kSettings);
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  const std::string gpt = "model: {name: gpt, heads: 3}\n";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {errorFrom("", {"batch.global=x"}), "Settings::set(\"batch.global\"): expected an integer"},
      {errorFrom("", {"batch.globl=1"}), "Settings::set(\"batch.globl\"): unknown key"},
      {errorFrom("", {"model.embed=[1"}), "Settings::set(\"model.embed\"): cannot parse value"},
      {errorFrom("", {"=1"}), "Settings::set(\"\"): keys have the form section.key"},
      {errorFrom(gpt, {"model.embed=64"}), "Settings::set(\"model.embed\"): 64 is not divisible"},
      // A key of the file is still named by the file.
      {errorFrom(gpt, {}), "the program's settings: model.embed: 64 is not divisible"},
  };
  for (const auto& [message, start] : cases) EXPECT_EQ(message.rfind(start, 0), 0u) << message;
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

// --- Bugs found by new users (each test fails on the code before 1958dcc) ---

TEST(Config, AMappingUsedAsAKeyIsRefused) {
  // Used to escape as YAML::TypedBadConversion ("terminate called" in `plan`).
  auto msg = errorOf("? [a, b]\n: 1\n");
  EXPECT_NE(msg.find("test.yaml:1: a key must be a plain name, got a list (in top level)"),
            std::string::npos)
      << msg;
  msg = errorOf("batch:\n  global: 64\n  ? {x: 1}\n  : 2\n");
  EXPECT_NE(msg.find("test.yaml:3: batch: a key must be a plain name, got a mapping (in batch)"),
            std::string::npos)
      << msg;
  msg = errorOf("batch: {global: 64}\n", {"batch.per_gpu=16"});
  EXPECT_EQ(msg, "<no error>");
}

TEST(Config, DuplicateKeysAndSectionsAreRefusedNamingBothLines) {
  // yaml-cpp keeps the first of two equal keys; both used to pass silently.
  auto msg = errorOf("batch: {global: 64, global: 128}\n");
  EXPECT_NE(msg.find("test.yaml:1: batch.global: 'global' is given twice (first on line 1); keep one"),
            std::string::npos)
      << msg;
  msg = errorOf("batch:\n  global: 64\nmodel:\n  name: mlp\nbatch:\n  per_gpu: 8\n");
  EXPECT_NE(msg.find("test.yaml:5: batch: 'batch' is given twice (first on line 1)"),
            std::string::npos)
      << msg;
}

TEST(Config, SeveralYamlDocumentsAreRefused) {
  // YAML::Load used to read the first document and drop the rest silently.
  const auto msg = errorOf("batch: {global: 64}\n---\nbatch: {global: 128}\n");
  EXPECT_NE(msg.find("test.yaml:2: holds 2 YAML documents"), std::string::npos) << msg;
}

TEST(Config, UnknownYamlDirectivesAreRefused) {
  // Note [YAML directives]: yaml-cpp dropped "% oops" and loaded the rest.
  auto msg = errorOf("% oops\nbatch: {global: 64}\n");
  EXPECT_NE(msg.find("test.yaml:1: '% oops' is not a YAML directive (YAML has only %YAML and "
                     "%TAG); a comment starts with '#'"),
            std::string::npos)
      << msg;
  msg = errorOf("# a comment\n\n%FOO bar\n---\nbatch: {global: 64}\n");
  EXPECT_NE(msg.find("test.yaml:3: '%FOO bar' is not a YAML directive"), std::string::npos) << msg;
  // The two YAML defines stay accepted, and '%' inside the document is YAML's business.
  EXPECT_EQ(parseConfig("%YAML 1.2\n%TAG !e! tag:example.com,2000:\n---\nbatch: {global: 64}\n",
                        "t.yaml")
                .batch.global,
            64);
  EXPECT_EQ(parseConfig("batch: {global: 64}\ndata: {path: '%x'}\n", "t.yaml").data.path, "%x");
}

TEST(Config, TextAfterTheDocumentIsMalformedNotIgnoredOrEndless) {
  // Note [one YAML document]: YAML::LoadAll loops (allocating) forever on a
  // stray ',' after a document, and YAML::Load drops it. Found by the fuzzer.
  auto msg = errorOf("- model\n, batch");
  EXPECT_NE(msg.find("test.yaml:2:1: malformed YAML: unexpected text after the end of the document"),
            std::string::npos)
      << msg;
  msg = errorOf("batch: {global: 64}, model: {}\n");
  EXPECT_NE(msg.find("malformed YAML"), std::string::npos) << msg;
  msg = errorOf("", {"model.hidden=[8], 4"});
  EXPECT_NE(msg.find("--set model.hidden: cannot parse value '[8], 4'"), std::string::npos) << msg;
}

TEST(Config, TextValuesMustBeUtf8) {
  // The resolved config is JSON (report, cross-rank check); a Latin-1 path used
  // to end the run with nlohmann's "invalid UTF-8 byte". Found by the fuzzer.
  auto msg = errorOf("data:\n  name: csv\n  path: donn\xE9" "es.csv\n");
  EXPECT_NE(msg.find("test.yaml:3: data.path: is not valid UTF-8 (byte 0xE9 at offset 4 of the "
                     "value)"),
            std::string::npos)
      << msg;
  msg = errorOf("", {"dist.interface=eth\xC0\xAF"});  // overlong '/'
  EXPECT_NE(msg.find("--set dist.interface: is not valid UTF-8 (byte 0xC0 at offset 3"),
            std::string::npos)
      << msg;
  const auto cfg = parseConfig("data: {name: csv, path: \"donn\xC3\xA9" "es/\xF0\x9F\x99\x82.csv\"}\n",
                               "t.yaml");
  EXPECT_EQ(cfg.data.path, "donn\xC3\xA9" "es/\xF0\x9F\x99\x82.csv");
  EXPECT_NO_THROW((void)cfg.resolved.dump());
}

TEST(Config, ADirectoryIsNotAConfigFile) {
  // std::ifstream opened the directory, read nothing, and trained with defaults.
  try {
    loadConfig(::testing::TempDir());
    FAIL() << "a directory loaded as a config";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find(": is a directory, not a config file"), std::string::npos)
        << e.what();
  }
}

TEST(Config, AnEndlessConfigFileIsRefusedBeforeReading) {
  // std::ifstream read /dev/zero until std::bad_alloc; then 4 MiB of it were read.
  // Note [input files are regular files]: now not a byte.
  try {
    loadConfig("/dev/zero");
    FAIL() << "/dev/zero loaded as a config";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("/dev/zero: config file is a character device, not a "
                                         "regular file; every rank reads the config"),
              std::string::npos)
        << e.what();
  }
}

TEST(Config, BatchNormNeedsTwoSamplesPerMicroBatch) {
  // The quickstart's mlp has BatchNorm; min_per_gpu: 1 and per_gpu: 1 used to load.
  auto msg = errorOf("batch: {min_per_gpu: 1}\n");
  EXPECT_NE(msg.find("test.yaml: batch.min_per_gpu: 1 is too small for a model with BatchNorm"),
            std::string::npos)
      << msg;
  msg = errorOf("model: {name: cnn}\nbatch: {per_gpu: 1}\n");
  EXPECT_NE(msg.find("test.yaml: batch.per_gpu: 1 is too small for a model with BatchNorm"),
            std::string::npos)
      << msg;
  msg = errorOf("model: {name: resnet18}\n", {"batch.per_gpu=1"});
  EXPECT_NE(msg.find("--set batch.per_gpu: 1 is too small"), std::string::npos) << msg;
  // Without BatchNorm one sample is fine.
  EXPECT_EQ(errorOf("model: {batchnorm: false}\nbatch: {per_gpu: 1, min_per_gpu: 1}\n"),
            "<no error>");
}

TEST(Config, SearchWithGlobalAndAccumFixedIsRefusedAtLoad) {
  // per-GPU = global / (accum x world) leaves the search nothing to choose; this
  // used to fail only after start-up, repeating the value given.
  const auto msg = errorOf("batch: {global: 64, accum: 2, per_gpu: auto}\n");
  EXPECT_NE(msg.find("test.yaml: batch.per_gpu: auto with both batch.global (64) and batch.accum "
                     "(2) set leaves nothing to search"),
            std::string::npos)
      << msg;
  EXPECT_NE(msg.find("Drop batch.accum"), std::string::npos) << msg;
  EXPECT_EQ(errorOf("batch: {global: 64, per_gpu: auto}\n"), "<no error>");
}

TEST(Config, UnknownSectionFromSetIsBlamedOnTheSet) {
  // Used to read "test.yaml: foo: unknown section 'foo'": the file has no foo.
  const auto msg = errorOf("batch: {global: 64}\n", {"foo.x=1"});
  EXPECT_EQ(msg.rfind("--set foo: unknown section 'foo'", 0), 0u) << msg;
  EXPECT_EQ(msg.find("test.yaml"), std::string::npos) << msg;
}

// Note [oom back-off]: retrying the larger batch is off by default.
TEST(Config, OomRecoverAfterStepsIsOffByDefaultAndValidated) {
  EXPECT_EQ(parseConfig("", "t.yaml").train.oom_recover_after_steps, 0);
  EXPECT_EQ(parseConfig("train: {oom_recover_after_steps: 200}", "t.yaml").train.oom_recover_after_steps,
            200);
  EXPECT_NE(errorOf("train: {oom_recover_after_steps: -1}")
                .find("train.oom_recover_after_steps: must be >= 0, got -1"),
            std::string::npos)
      << errorOf("train: {oom_recover_after_steps: -1}");
  EXPECT_NE(errorOf("train: {oom_recover_after_steps: soon}")
                .find("train.oom_recover_after_steps: expected an integer"),
            std::string::npos);
  EXPECT_NE(errorOf("train: {oom_recover_after: 5}").find("unknown key; did you mean 'train.oom_recover_after_steps'"),
            std::string::npos)
      << errorOf("train: {oom_recover_after: 5}");
}

TEST(Config, NoiseScaleEveryDefaultsToFourAndIsValidated) {
  EXPECT_EQ(parseConfig("", "t.yaml").train.noise_scale_every, 4);
  EXPECT_EQ(parseConfig("train: {noise_scale_every: 1}", "t.yaml").train.noise_scale_every, 1);
  EXPECT_NE(errorOf("train: {noise_scale_every: 0}").find("train.noise_scale_every: must be >= 1, got 0"),
            std::string::npos)
      << errorOf("train: {noise_scale_every: 0}");
  EXPECT_NE(errorOf("train: {noise_scale_every: often}").find("train.noise_scale_every: expected an integer"),
            std::string::npos)
      << errorOf("train: {noise_scale_every: often}");
}

// Note [global tokens]: batch.global_tokens becomes batch.global in whole windows
// of model.seq_len tokens, once, at load; the resolved config has both.
TEST(Config, GlobalTokensBecomeWholeWindowsOfTheGlobalBatch) {
  const std::string lm = "model: {name: gpt, seq_len: 64}\ndata: {name: tokens, path: t.bin}\n";
  const auto cfg = parseConfig(lm + "batch: {global_tokens: 2070}", "t.yaml");
  EXPECT_EQ(cfg.batch.global, 32);
  EXPECT_EQ(cfg.batch.global_tokens, 2070);
  EXPECT_FALSE(cfg.batch.global_auto);
  EXPECT_EQ(cfg.resolved["batch"]["global"], 32);
  EXPECT_EQ(cfg.resolved["batch"]["global_tokens"], 2070);
  // The adaptive batch starts from it (G0 is batch.global).
  const auto adaptive = parseConfig(lm + "batch: {global_tokens: 2048, adapt: goodput}", "t.yaml");
  EXPECT_EQ(adaptive.batch.global, 32);
  // --set may swap a file's batch.global for it (null removes a key).
  const auto swapped = parseConfig(lm + "batch: {global: 16}", "t.yaml",
                                   {"batch.global=null", "batch.global_tokens=4096"});
  EXPECT_EQ(swapped.batch.global, 64);
  // Without it the resolved batch section has no such key: other configs resolve
  // (and key their search cache entries) as before.
  EXPECT_FALSE(parseConfig("batch: {global: 64}", "t.yaml").resolved["batch"].contains("global_tokens"));
  EXPECT_FALSE(parseConfig(lm + "batch: {global: 32}", "t.yaml").resolved["batch"].contains("global_tokens"));
}

TEST(Config, GlobalTokensWithGlobalOrWithoutTokenDataIsRefused) {
  const std::string lm = "model: {name: gpt, seq_len: 64}\ndata: {name: tokens, path: t.bin}\n";
  EXPECT_EQ(errorOf(lm + "batch: {global: 32, global_tokens: 2048}"),
            "test.yaml: batch.global_tokens: 2048 and batch.global (32) both set the global batch; "
            "give one: batch.global in samples, or batch.global_tokens in tokens");
  EXPECT_EQ(errorOf(lm + "batch: {global: auto, global_tokens: 2048}"),
            "test.yaml: batch.global_tokens: 2048 and batch.global (auto) both set the global "
            "batch; give one: batch.global in samples, or batch.global_tokens in tokens");
  EXPECT_EQ(errorOf(lm + "batch: {global: 32}", {"batch.global_tokens=2048"})
                .rfind("--set batch.global_tokens: 2048 and batch.global (32) both set", 0),
            0u)
      << errorOf(lm + "batch: {global: 32}", {"batch.global_tokens=2048"});
  EXPECT_EQ(errorOf("batch: {global_tokens: 2048}"),
            "test.yaml: batch.global_tokens: needs data.name: tokens (samples that are windows of "
            "model.seq_len tokens), but data.name is digits, whose samples are not tokens; give the "
            "global batch in samples with batch.global");
  EXPECT_NE(errorOf(lm + "batch: {global_tokens: -5}").find("batch.global_tokens: must be >= 0, got -5"),
            std::string::npos)
      << errorOf(lm + "batch: {global_tokens: -5}");
  EXPECT_NE(errorOf(lm + "batch: {global_tokens: many}").find("batch.global_tokens: expected an integer"),
            std::string::npos);
}

// Note [channels last]: train.memory_format is for the convolutional models; auto
// picks channels_last for cnn and resnet on CUDA only. optim.kernels: its names.
TEST(Config, MemoryFormatAndOptimizerKernels) {
  using batchdist::testsupport::configError;
  for (const std::string model : {"mlp", "gpt"}) {
    const auto e = configError("model: {name: " + model + "}\ntrain: {memory_format: channels_last}");
    EXPECT_NE(e.find("train.memory_format"), std::string::npos) << e;
    EXPECT_NE(e.find("not model.name: " + model), std::string::npos) << e;
    EXPECT_NE(e.find("use auto or contiguous"), std::string::npos) << e;
  }
  const auto typo = configError("train: {memory_format: nhwc}");
  EXPECT_NE(typo.find("not one of"), std::string::npos) << typo;
  const auto cnn = parseConfig("model: {name: cnn}", "t.yaml");
  EXPECT_EQ(cnn.train.memory_format, MemoryFormat::kAuto);
  EXPECT_TRUE(channelsLast(cnn.train, cnn.model, /*on_cuda=*/true));
  EXPECT_FALSE(channelsLast(cnn.train, cnn.model, /*on_cuda=*/false));
  const auto mlp = parseConfig("model: {name: mlp}", "t.yaml");
  EXPECT_FALSE(channelsLast(mlp.train, mlp.model, true));
  const auto forced = parseConfig("model: {name: resnet18}\ntrain: {memory_format: channels_last}", "t.yaml");
  EXPECT_TRUE(channelsLast(forced.train, forced.model, false));
  const auto off = parseConfig("model: {name: resnet50}\ntrain: {memory_format: contiguous}", "t.yaml");
  EXPECT_FALSE(channelsLast(off.train, off.model, true));
  EXPECT_EQ(parseConfig("optim: {kernels: multi_tensor}", "t.yaml").optim.kernels, StepKernels::kMultiTensor);
  EXPECT_EQ(parseConfig("optim: {kernels: fused}", "t.yaml").optim.kernels, StepKernels::kFused);
  const auto bad = configError("optim: {kernels: foreach}");
  EXPECT_NE(bad.find("optim.kernels"), std::string::npos) << bad;
}

// Note [parameter units]: dist.shard: parameters on the models with units, and a
// clear refusal, naming the key, for what it does not take yet.
TEST(Config, ShardParametersAndWhatItRefuses) {
  const auto cfg = parseConfig("model: {name: mlp}\ndist: {shard: parameters, reshard_after_forward: false}",
                               "test.yaml");
  EXPECT_EQ(cfg.dist.shard, Shard::kParameters);
  EXPECT_FALSE(cfg.dist.reshard_after_forward);
  EXPECT_EQ(cfg.resolved["dist"]["reshard_after_forward"], false);
  const auto plain = parseConfig("model: {name: mlp}\ndist: {shard: parameters}", "test.yaml");
  EXPECT_FALSE(plain.resolved["dist"].contains("reshard_after_forward")) << "the default is erased";
  const auto refused = [](const std::string& yaml, const std::string& want) {
    const auto e = errorOf("dist: {shard: parameters}\n" + yaml);
    EXPECT_NE(e.find(want), std::string::npos) << e;
    EXPECT_NE(e.find("use dist.shard: gradients"), std::string::npos) << e;
  };
  refused("model: {name: resnet18}", "model.name: resnet18 has no parameter units");
  refused("model: {name: mlp}\noptim: {name: lars}", "optim.name: lars reads each layer's whole weight norm");
  refused("model: {name: mlp, sync_batchnorm: true}", "model.sync_batchnorm: its allreduces would interleave");
  EXPECT_EQ(errorOf("dist: {shard: parameters}\nmodel: {name: mlp}\nbatch: {per_gpu: auto}"), "<no error>")
      << "the batch search runs under parameters";
  refused("model: {name: mlp}\nbatch: {global: 64, adapt: goodput}", "batch.adapt: goodput changes the batch");
  refused("model: {name: mlp}\nbatch: {last_batch: keep}", "batch.last_batch: keep gives some ranks");
  EXPECT_NE(errorOf("dist: {shard: gradients, reshard_after_forward: false}")
                .find("dist.reshard_after_forward: applies to dist.shard: parameters only"),
            std::string::npos);
}
