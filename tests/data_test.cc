#include <gtest/gtest.h>

#include "collective/error.h"
#include "worker/data/data.h"
#include "worker/model/model.h"

using batchdist::ConfigError;
using namespace batchdist::worker;

namespace {
std::string csvError(const std::string& text, int64_t classes = 3) {
  try {
    parseCsv(text, "d.csv", classes, {2});
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "<no error>";
}
}  // namespace

TEST(Data, EmbeddedDigitsAreTheRealDataSet) {
  const auto d = parseCsv(embeddedDigitsCsv(), "digits", 10, {1, 8, 8}, 1.0 / 16);
  EXPECT_EQ(d.size(), 1797);
  EXPECT_EQ(d.x.sizes(), (std::vector<int64_t>{1797, 1, 8, 8}));
  EXPECT_EQ(d.y.min().item<int64_t>(), 0);
  EXPECT_EQ(d.y.max().item<int64_t>(), 9);
  EXPECT_GE(d.x.min().item<float>(), 0.0f);
  EXPECT_LE(d.x.max().item<float>(), 1.0f);
  // Every class is present in roughly equal numbers (~180 each).
  const auto counts = torch::bincount(d.y);
  EXPECT_GT(counts.min().item<int64_t>(), 170);
}

TEST(Data, SplitIsSeededAndDisjoint) {
  DataConfig cfg;
  const auto a = loadData(cfg, 1, "");
  const auto b = loadData(cfg, 1, "");
  const auto c = loadData(cfg, 2, "");
  EXPECT_EQ(a.train.size() + a.val.size(), 1797);
  EXPECT_EQ(a.val.size(), 359);
  EXPECT_TRUE(torch::equal(a.train.x, b.train.x));
  EXPECT_FALSE(torch::equal(a.train.x, c.train.x));
}

TEST(Data, CsvErrorsNameLineAndColumn) {
  EXPECT_NE(csvError("1,2,0\n3,x,1\n").find("d.csv:2: column 2: expected a number, got 'x'"),
            std::string::npos);
  EXPECT_NE(csvError("1,2,0\n3,1\n").find("d.csv:2: expected 3 columns"), std::string::npos);
  EXPECT_NE(csvError("1,2,7\n").find("d.csv:1: label 7 is not an integer in 0..2"),
            std::string::npos);
  EXPECT_NE(csvError("1,2,0.5\n").find("label 0.5"), std::string::npos);
  EXPECT_NE(csvError("\n\n").find("no data rows"), std::string::npos);
  const auto ok = parseCsv("1,2,0\n\n3,4,2\r\n", "d.csv", 3, {2});
  EXPECT_EQ(ok.size(), 2);
}

TEST(Data, MissingFileIsAConfigError) {
  DataConfig cfg;
  cfg.name = DataName::kCsv;
  cfg.path = "no/such/file.csv";
  try {
    loadData(cfg, 0, "/tmp");
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("/tmp/no/such/file.csv"), std::string::npos) << e.what();
  }
}

TEST(Data, SyntheticIsDeterministic) {
  DataConfig cfg;
  cfg.name = DataName::kSynthetic;
  cfg.samples = 100;
  cfg.shape = {3, 4};
  cfg.classes = 5;
  const auto a = loadData(cfg, 9, "");
  const auto b = loadData(cfg, 9, "");
  EXPECT_TRUE(torch::equal(a.train.x, b.train.x));
  EXPECT_EQ(a.train.x.sizes(), (std::vector<int64_t>{80, 3, 4}));
  const auto info = describeData(cfg, 9, "");
  EXPECT_EQ(info.train_size, 80);
  EXPECT_EQ(info.val_size, 20);
}

TEST(Model, ShapesAndBatchNormDetection) {
  ModelConfig mlp;
  auto net = buildModel(mlp, {1, 8, 8}, 10);
  EXPECT_EQ(net->forward(torch::randn({5, 1, 8, 8})).sizes(), (std::vector<int64_t>{5, 10}));
  EXPECT_TRUE(net->hasBatchNorm());
  mlp.batchnorm = false;
  EXPECT_FALSE(buildModel(mlp, {64}, 10)->hasBatchNorm());
  ModelConfig cnn;
  cnn.name = ModelName::kCnn;
  auto c = buildModel(cnn, {1, 8, 8}, 10);
  EXPECT_EQ(c->forward(torch::randn({4, 1, 8, 8})).sizes(), (std::vector<int64_t>{4, 10}));
  EXPECT_THROW(buildModel(cnn, {64}, 10), ConfigError);
}
