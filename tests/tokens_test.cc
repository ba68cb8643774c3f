// Note [tokens]: token files as windows (x and target shifted by one, views of
// the mapped file), their validation split, the ids as batches gather them and
// every bad input's message; Note [language model]: the task's loss and metrics;
// Note [task choice]: tokens pick the language model, and the mismatches of data,
// model and task are named.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "common/error.h"
#include "tests/config_errors.h"
#include "tests/image_fixtures.h"
#include "tests/scratch_dir.h"
#include "worker/data/data.h"
#include "worker/data/loader.h"
#include "worker/data/measure.h"
#include "worker/data/sources/npy.h"
#include "worker/plan/plan.h"
#include "worker/task/task.h"

using namespace batchdist::worker;
using batchdist::testsupport::errorOf;
namespace t = batchdist::testing;

namespace {

template <typename T>
std::string bytesOf(const std::vector<T>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
}

/// 0, 1, 2, ... n-1 as uint16, with `high` values placed at their positions.
std::vector<uint16_t> ramp(int64_t n, const std::vector<std::pair<int64_t, uint16_t>>& high = {}) {
  std::vector<uint16_t> v(static_cast<std::size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[static_cast<std::size_t>(i)] = static_cast<uint16_t>(i);
  for (const auto& [at, value] : high) v[static_cast<std::size_t>(at)] = value;
  return v;
}

DataConfig tokensConfig(const std::string& path, int64_t seq_len, int64_t vocab) {
  DataConfig cfg;
  cfg.name = DataName::kTokens;
  cfg.path = path;
  cfg.seq_len = seq_len;
  cfg.vocab = vocab;
  return cfg;
}

std::string loadError(const DataConfig& cfg) {
  try {
    loadData(cfg, 1, "");
  } catch (const batchdist::ConfigError& e) {
    return e.what();
  }
  return "(no error)";
}

at::Tensor longs(const std::vector<std::vector<int64_t>>& rows) {
  std::vector<at::Tensor> out;
  for (const auto& r : rows) out.push_back(torch::tensor(r, torch::kLong));
  return torch::stack(out);
}

at::Tensor indices(const std::vector<int64_t>& v) { return torch::tensor(v, torch::kLong); }

}  // namespace

// Sample i is tokens [i*T, i*T + T]: x the first T, target the last T. Ids from
// 32768 up (int16 in memory, LibTorch 1.13 has no uint16) come out positive.
TEST(Tokens, BinWindowsAreShiftedViewsOfTheFileAndHighIdsReadPositive) {
  const batchdist::testsupport::ScratchDir dir("tokens_bin");
  const auto d = dir.string();
  t::writeFile(d + "/train.bin", bytesOf(ramp(21, {{5, 40000}, {9, 65535}})));
  t::writeFile(d + "/val.bin", bytesOf(ramp(9)));
  auto cfg = tokensConfig(d + "/train.bin", 4, 65536);
  cfg.val_path = d + "/val.bin";
  const auto split = loadData(cfg, 1, "");
  const auto& train = split.train;
  EXPECT_EQ(train.size(), 5);  // (21 - 1) / 4
  EXPECT_EQ(split.val.size(), 2);
  EXPECT_EQ(train.sample_shape, (std::vector<int64_t>{4}));
  EXPECT_EQ(train.classes, 65536);
  // No copy of the file: x and target are views of one mapped tensor.
  EXPECT_TRUE(train.x.is_alias_of(train.target));
  EXPECT_EQ(train.x.storage_offset(), 0);
  EXPECT_EQ(train.target.storage_offset(), 1);
  EXPECT_EQ(train.x.stride(0), 4);

  const auto x = train.inputs(indices({4, 0, 1, 2}));
  const auto y = train.targets(indices({4, 0, 1, 2}));
  EXPECT_EQ(x.scalar_type(), torch::kLong);
  EXPECT_EQ(y.scalar_type(), torch::kLong);
  EXPECT_TRUE(torch::equal(x, longs({{16, 17, 18, 19}, {0, 1, 2, 3}, {4, 40000, 6, 7}, {8, 65535, 10, 11}})));
  EXPECT_TRUE(torch::equal(y, longs({{17, 18, 19, 20}, {1, 2, 3, 4}, {40000, 6, 7, 8}, {65535, 10, 11, 12}})));
  EXPECT_TRUE(torch::equal(split.val.targets(indices({1})), longs({{5, 6, 7, 8}})));
  EXPECT_EQ(split.origin.find("tokens " + d + "/train.bin (21 uint16 tokens, 5 windows of 4 + 1"), 0u)
      << split.origin;

  // A seeded subset (rows) selects x and target alike, still without a copy.
  const auto sub = subset(train, {3, 1});
  EXPECT_EQ(sub.size(), 2);
  EXPECT_TRUE(sub.target.is_alias_of(train.target));
  EXPECT_TRUE(torch::equal(sub.inputs(indices({1, 0})), longs({{4, 40000, 6, 7}, {12, 13, 14, 15}})));
  EXPECT_TRUE(torch::equal(sub.targets(indices({0})), longs({{13, 14, 15, 16}})));
}

// The loader hands the model int64 ids, never float, and the targets likewise.
TEST(Tokens, TheLoaderGivesInt64IdsForInputsAndTargets) {
  const batchdist::testsupport::ScratchDir dir("tokens_loader");
  const auto d = dir.string();
  t::writeFile(d + "/train.bin", bytesOf(ramp(41, {{2, 50000}})));
  auto cfg = tokensConfig(d + "/train.bin", 4, 65536);
  cfg.val_fraction = 0.2;
  const auto split = loadData(cfg, 1, "");
  for (int workers : {0, 1}) {
    auto o = loaderOptions(cfg, split.train, true, torch::kCPU, 7, nullptr);
    o.workers = workers;
    Loader loader(split.train, o);
    MicroBatch m;
    m.indices = {1, 0};
    m.weights = {1.0f, 1.0f};
    loader.start({m}, 0, 0);
    const auto b = loader.next();
    EXPECT_EQ(b.x.scalar_type(), torch::kLong) << workers;
    EXPECT_TRUE(torch::equal(b.x, longs({{4, 5, 6, 7}, {0, 1, 50000, 3}}))) << workers;
    EXPECT_TRUE(torch::equal(b.target, longs({{5, 6, 7, 8}, {1, 50000, 3, 4}}))) << workers;
  }
}

// .npy of uint16, int32 or int64, 1-D; without data.val_path the last
// val_fraction of the windows are validation, contiguous, still views.
TEST(Tokens, NpyOfEachIntegerTypeAndTheContiguousValidationSplit) {
  const batchdist::testsupport::ScratchDir dir("tokens_npy");
  const auto d = dir.string();
  std::vector<int64_t> ids(41);
  for (int64_t i = 0; i < 41; ++i) ids[static_cast<std::size_t>(i)] = 1000 + i;
  std::vector<int32_t> ids32(ids.begin(), ids.end());
  std::vector<uint16_t> ids16(ids.begin(), ids.end());
  t::writeFile(d + "/i64.npy", t::makeNpy(NpyType::kInt64, {41}, bytesOf(ids)));
  t::writeFile(d + "/i32.npy", t::makeNpy(NpyType::kInt32, {41}, bytesOf(ids32)));
  t::writeFile(d + "/u16.npy", t::makeNpy(NpyType::kUint16, {41}, bytesOf(ids16)));
  for (const char* name : {"i64.npy", "i32.npy", "u16.npy"}) {
    SCOPED_TRACE(name);
    auto cfg = tokensConfig(d + "/" + name, 4, 2000);
    cfg.val_fraction = 0.2;  // 10 windows: 8 train, the last 2 validation
    const auto split = loadData(cfg, 1, "");
    EXPECT_EQ(split.train.size(), 8);
    EXPECT_EQ(split.val.size(), 2);
    EXPECT_EQ(split.val.x.storage_offset(), 32);  // window 8 begins at token 32
    EXPECT_TRUE(split.val.x.is_alias_of(split.train.x));
    EXPECT_TRUE(torch::equal(split.train.inputs(indices({7})), longs({{1028, 1029, 1030, 1031}})));
    EXPECT_TRUE(torch::equal(split.val.inputs(indices({0})), longs({{1032, 1033, 1034, 1035}})));
    EXPECT_TRUE(torch::equal(split.val.targets(indices({1})), longs({{1037, 1038, 1039, 1040}})));
    EXPECT_EQ(split.val.classes, 2000);
  }
  // val_fraction 0: no validation windows.
  auto cfg = tokensConfig(d + "/i64.npy", 4, 2000);
  cfg.val_fraction = 0.0;
  const auto all = loadData(cfg, 1, "");
  EXPECT_EQ(all.train.size(), 10);
  EXPECT_EQ(all.val.size(), 0);
  EXPECT_EQ(all.val.sample_shape, (std::vector<int64_t>{4}));
}

// Note [tokens per sample]: the `data` verb counts a window's tokens as the plan
// and the trainer do: model.seq_len (the targets a window trains on), not the
// seq_len + 1 it reads; its text says so, its JSON gives that count.
TEST(Tokens, TheDataVerbCountsTheTokensOfASampleAsTrainingDoes) {
  const batchdist::testsupport::ScratchDir dir("tokens_data_verb");
  const auto d = dir.string();
  t::writeFile(d + "/train.bin", bytesOf(ramp(41)));  // 10 windows of 4 + 1
  const auto cfg = parseConfig("model: {name: gpt, seq_len: 4, vocab: 64}\n"
                               "data: {name: tokens, path: " + d + "/train.bin, val_fraction: 0.2, "
                               "workers: 0}\nbatch: {global: 2}",
                               "t.yaml");
  const auto split = loadData(cfg.data, 1, "");
  const auto plan = makePlan(cfg, 1, split.train.size(), false);
  ASSERT_EQ(plan.tokens_per_sample, 4);
  // What a step trains on: a window's targets, model.seq_len of them.
  EXPECT_EQ(split.train.targets(indices({0, 1})).size(1), plan.tokens_per_sample);
  const auto m = measureLoader(cfg, split.train, plan, 0, 0.05);
  ASSERT_GT(m.samplesPerSecond(), 0);
  const auto text = dataReport({m}, split, cfg, false, plan.tokens_per_sample);
  EXPECT_NE(text.find("\n  tokens: 4 per sample (model.seq_len: the next-token targets a window of "
                      "4 + 1 tokens trains on); tokens/s = samples/s x 4, as in training\n"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("rank 0: "), std::string::npos) << text;
  EXPECT_NE(text.find(" tokens/s) ("), std::string::npos) << text;  // beside rank 0's samples/s
  const auto json = nlohmann::json::parse(dataReport({m}, split, cfg, true, plan.tokens_per_sample));
  EXPECT_EQ(json.at("tokens_per_sample").get<int64_t>(), 4);
  EXPECT_DOUBLE_EQ(json.at("tokens_per_s").get<double>(), 4 * json.at("samples_per_s").get<double>());
  // Samples that are not tokens (0): no tokens line, no rate in tokens.
  const auto plain = dataReport({m}, split, cfg, false, 0);
  EXPECT_EQ(plain.find("  tokens:"), std::string::npos) << plain;
  EXPECT_EQ(plain.find("tokens/s"), std::string::npos) << plain;
}

// Note [tokens]: an id outside 0..vocab-1 is named when a batch gathers it: the
// file, the token's offset (and its byte offset, past a .npy's header), its value.
TEST(Tokens, AnIdOutsideTheVocabularyIsNamedWithItsOffsetAndValue) {
  const batchdist::testsupport::ScratchDir dir("tokens_vocab");
  const auto d = dir.string();
  t::writeFile(d + "/train.bin", bytesOf(ramp(21, {{12, 300}})));
  auto cfg = tokensConfig(d + "/train.bin", 4, 256);
  cfg.val_fraction = 0.0;
  const auto split = loadData(cfg, 1, "");  // the file is not scanned at load
  const std::string want = d + "/train.bin: token 12 (byte offset 24) is 300, outside model.vocab's "
                               "0..255; raise model.vocab to the tokenizer's vocabulary size (at "
                               "least 301)";
  EXPECT_EQ(errorOf<batchdist::ConfigError>([&] { split.train.inputs(indices({0, 3})); }), want);
  EXPECT_EQ(errorOf<batchdist::ConfigError>([&] { split.train.targets(indices({2})); }), want);  // 9..12
  EXPECT_NO_THROW(split.train.inputs(indices({0, 1, 2, 4})));
  // Through the loader too (the training path).
  auto o = loaderOptions(cfg, split.train, true, torch::kCPU, 7, nullptr);
  Loader loader(split.train, o);
  MicroBatch m;
  m.indices = {3};
  m.weights = {1.0f};
  loader.start({m}, 0, 0);
  EXPECT_EQ(errorOf<batchdist::ConfigError>([&] { loader.next(); }), want);

  // A negative id of an int64 .npy: the byte offset counts the header.
  std::vector<int64_t> ids(9, 1);
  ids[5] = -1;
  const auto npy = t::makeNpy(NpyType::kInt64, {9}, bytesOf(ids));
  t::writeFile(d + "/neg.npy", npy);
  const auto header = static_cast<int64_t>(npy.size()) - 9 * 8;
  const auto neg = loadData(tokensConfig(d + "/neg.npy", 4, 256), 1, "");
  EXPECT_EQ(errorOf<batchdist::ConfigError>([&] { neg.train.inputs(indices({1})); }),
            d + "/neg.npy: token 5 (byte offset " + std::to_string(header + 40) +
                ") is -1, outside model.vocab's 0..255; token ids are not negative: is the file "
                "token ids?");
}

TEST(Tokens, BadFilesAreNamed) {
  const batchdist::testsupport::ScratchDir dir("tokens_bad");
  const auto d = dir.string();
  const std::string expected = "expected token ids: a .bin of little-endian uint16, or a 1-D .npy "
                               "of uint16, int32 or int64)";
  const auto error = [&](const std::string& path) { return loadError(tokensConfig(path, 4, 256)); };
  EXPECT_EQ(error(d + "/none.bin"),
            d + "/none.bin: cannot open: No such file or directory (check data.path; " + expected);
  std::filesystem::create_directories(d + "/folder.bin");
  EXPECT_EQ(error(d + "/folder.bin"),
            d + "/folder.bin: is a directory, not a regular file (check data.path; " + expected);
  t::writeFile(d + "/empty.bin", "");
  EXPECT_EQ(error(d + "/empty.bin"), d + "/empty.bin: empty file (check data.path; " + expected);
  t::writeFile(d + "/odd.bin", std::string(9, 'a'));
  EXPECT_EQ(error(d + "/odd.bin").find(d + "/odd.bin: 9 bytes is not a whole number of 2-byte tokens"),
            0u);
  t::writeFile(d + "/short.bin", bytesOf(ramp(4)));
  EXPECT_EQ(error(d + "/short.bin"),
            d + "/short.bin: 4 tokens, fewer than one sample's window of model.seq_len + 1 = 5 "
                "tokens; give a longer file, or lower model.seq_len");
  t::writeFile(d + "/float.npy", t::makeNpy(NpyType::kFloat32, {8}, std::string(32, '\0')));
  EXPECT_NE(error(d + "/float.npy")
                .find("float.npy: dtype float32 ('<f4') is not accepted here; expected one of "
                      "uint16, int32, int64"),
            std::string::npos)
      << error(d + "/float.npy");
  t::writeFile(d + "/square.npy", t::makeNpy(NpyType::kInt64, {3, 4}, std::string(96, '\0')));
  EXPECT_EQ(error(d + "/square.npy").find(d + "/square.npy: expected a 1-D array of token ids, got "
                                              "shape (3, 4)"),
            0u);
  // A .npy by its magic, whatever its name: still checked as one.
  t::writeFile(d + "/named.bin", t::makeNpy(NpyType::kFloat64, {8}, std::string(64, '\0')));
  EXPECT_NE(error(d + "/named.bin").find("dtype float64"), std::string::npos);
  // data.val_path is named as such.
  t::writeFile(d + "/ok.bin", bytesOf(ramp(21)));
  auto cfg = tokensConfig(d + "/ok.bin", 4, 256);
  cfg.val_path = d + "/gone.bin";
  EXPECT_EQ(loadError(cfg),
            d + "/gone.bin: cannot open: No such file or directory (check data.val_path; " + expected);
  // One window and val_fraction 0.9: nothing left to train on.
  t::writeFile(d + "/one.bin", bytesOf(ramp(5)));
  cfg = tokensConfig(d + "/one.bin", 4, 256);
  cfg.val_fraction = 0.9;
  EXPECT_NE(loadError(cfg).find("1 window(s) of model.seq_len + 1 = 5 tokens, and data.val_fraction: "
                                "0.9 keeps 1 for validation; training needs at least one"),
            std::string::npos)
      << loadError(cfg);
}

// Note [language model]: a window's loss is the mean of its tokens' cross-entropies.
TEST(LanguageModelTask, PerSampleLossIsTheMeanTokenCrossEntropy) {
  const auto task = makeTask(TaskKind::kLanguageModel);
  EXPECT_EQ(task->kind(), TaskKind::kLanguageModel);
  // [2 windows, 2 tokens, vocab 3].
  const auto out = torch::tensor({2.0f, 0.0f, 0.0f, 0.0f, 1.0f, 3.0f,   // window 0
                                  0.0f, 0.0f, 0.0f, 1.0f, 1.0f, 1.0f})  // window 1: uniform
                       .reshape({2, 2, 3});
  const auto target = longs({{0, 2}, {1, 0}});
  const double l00 = std::log(std::exp(2.0) + 2.0) - 2.0;
  const double l01 = std::log(1.0 + std::exp(1.0) + std::exp(3.0)) - 3.0;
  const auto loss = task->perSampleLoss(out, target);
  EXPECT_EQ(loss.scalar_type(), torch::kFloat);
  ASSERT_EQ(loss.sizes(), (std::vector<int64_t>{2}));
  EXPECT_NEAR(loss[0].item<double>(), (l00 + l01) / 2, 1e-6);
  EXPECT_NEAR(loss[1].item<double>(), std::log(3.0), 1e-6);
  EXPECT_EQ(task->perSampleLoss(out.to(torch::kBFloat16), target).scalar_type(), torch::kFloat);
  // The trainer's weighted sum over the real windows (padding 0) is the mean over
  // the real windows' tokens (Note [loss normalisation]).
  const auto w = torch::tensor({1.0f, 0.0f});
  const auto weighted = (loss * w).sum() / 1.0;
  const auto tokens_mean = torch::nn::functional::cross_entropy(out[0], target[0]);
  EXPECT_NEAR(weighted.item<double>(), tokens_mean.item<double>(), 1e-6);

  std::vector<double> sums(task->sumCount(), 0.0);
  ASSERT_EQ(sums.size(), 1u);
  task->addEvalSums(out, target, sums);
  EXPECT_NEAR(sums[0], (l00 + l01) / 2 + std::log(3.0), 1e-6);
  auto m = task->metrics(sums, 2);
  ASSERT_EQ(m.size(), 2u);
  EXPECT_EQ(m[0].name, "loss");
  EXPECT_EQ(m[1].name, "perplexity");
  EXPECT_NEAR(m[0].value, sums[0] / 2, 1e-12);
  EXPECT_NEAR(m[1].value, std::exp(sums[0] / 2), 1e-12);
  EXPECT_EQ(task->best().name, "loss");
  EXPECT_FALSE(task->best().higher_is_better);
  EXPECT_EQ(task->targetDtype(), torch::kLong);
  m = task->metrics({4.69}, 2);  // loss 2.345, perplexity e^2.345 = 10.433
  EXPECT_EQ(task->describe(m), "eval loss 2.345, perplexity 10.43");
  EXPECT_EQ(task->epochFigures(m), "eval_perplexity 10.43");
}

TEST(LanguageModelTask, TokensChooseItAndMismatchesAreNamed) {
  const std::string tokens = "model: {name: gpt, vocab: 300, seq_len: 16}\ndata: {name: tokens, path: t.bin}";
  auto cfg = parseConfig(tokens, "t.yaml");
  EXPECT_EQ(cfg.data.seq_len, 16);  // the window follows model.seq_len (Note [tokens])
  EXPECT_EQ(cfg.data.vocab, 300);
  auto c = chooseTask(cfg, DataSplit{});
  EXPECT_EQ(c.kind, TaskKind::kLanguageModel);
  EXPECT_EQ(c.outputs, 300);
  EXPECT_EQ(c.why, "task.name: auto; tokens are token windows");
  c = chooseTask(parseConfig("task: {name: language_model}\n" + tokens, "t.yaml"), DataSplit{});
  EXPECT_EQ(c.kind, TaskKind::kLanguageModel);
  EXPECT_EQ(c.why, "task.name: language_model");
  EXPECT_EQ(parseEnum<TaskKind>("language_model"), TaskKind::kLanguageModel);

  const auto parseError = [](const std::string& yaml) {
    return errorOf<batchdist::ConfigError>([&] { parseConfig(yaml, "t.yaml"); });
  };
  const std::string token_data = "data.name: tokens (a .bin or .npy of token ids: docs/data.md)";
  EXPECT_EQ(parseError("data: {name: tokens, path: t.bin}"),
            "t.yaml: model.name: mlp, but data.name: tokens gives token ids, which only model.name: "
            "gpt reads (or a TorchScript module with its own loss: docs/models.md); use model.name: gpt");
  EXPECT_EQ(parseError("model: {name: gpt}"),
            "t.yaml: data.name: digits, but model.name: gpt reads token ids and trains as a language "
            "model; use " + token_data);
  EXPECT_EQ(parseError("task: {name: language_model}\ndata: {name: npy, path: d}"),
            "t.yaml: task.name: language_model trains on token windows, but data.name is npy; use " +
                token_data);
  EXPECT_EQ(parseError("task: {name: classification}\n" + tokens),
            "t.yaml: task.name: classification does not fit data.name: tokens, whose targets are the "
            "next tokens; use task.name: language_model (or auto)");
  EXPECT_EQ(parseError("model: {name: gpt}\ndata: {name: tokens}").find("t.yaml: data.path: data.name: "
                                                                        "tokens needs the token file"),
            0u);
  EXPECT_EQ(parseError("model: {name: gpt}\ndata: {name: tokens, path: t.bin, hflip: true}"),
            "t.yaml: data.hflip: does not apply to data.name: tokens (token ids are not cropped, "
            "flipped, resized or normalised); remove it");
  // chooseTask checks the same on a config built in code, and the head's width.
  cfg.model.name = ModelName::kMlp;
  EXPECT_EQ(errorOf<batchdist::ConfigError>([&] { chooseTask(cfg, DataSplit{}); }),
            "t.yaml: model.name: mlp, but data.name: tokens gives token ids, which only model.name: "
            "gpt reads (or a TorchScript module with its own loss: docs/models.md); use model.name: gpt");
  cfg.model.name = ModelName::kGpt;
  cfg.model.outputs = 5;
  EXPECT_EQ(errorOf<batchdist::ConfigError>([&] { chooseTask(cfg, DataSplit{}); }),
            "t.yaml: model.outputs: 5, but a language model's head is model.vocab (300) wide, one "
            "logit per token id; leave model.outputs out");
}
