#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cstdio>
#include <filesystem>

#include "common/error.h"
#include "tests/image_fixtures.h"
#include "tests/scratch_dir.h"
#include "worker/data/data.h"
#include "worker/data/pipeline.h"
#include "worker/model/model.h"

using batchdist::ConfigError;
using namespace batchdist::worker;
namespace fs = std::filesystem;
namespace t = batchdist::testing;

namespace {

/// The ConfigError loadData throws ("<no error>" if none).
std::string loadError(const DataConfig& cfg, const DataContext& ctx = {}) {
  try {
    loadData(cfg, 0, "", ctx);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "<no error>";
}

std::string jpeg(int cls, uint64_t seed) {
  const auto rgb = t::patternRgb(40, 32, cls, seed);
  return t::encodeJpeg(rgb.data(), 40, 32, 3);
}

DataConfig decodedConfig(DataName name, const std::string& path) {
  DataConfig cfg;
  cfg.name = name;
  cfg.path = path;
  cfg.image_size = 24;
  cfg.resize = 27;
  cfg.val_fraction = 0.25;
  cfg.workers_auto = false;
  return cfg;
}

/// A shard of 24 samples, labels i % 8, one of them `wild` (at key s000013).
std::string shardWithLabel(const std::string& dir, int64_t wild) {
  std::vector<std::pair<std::string, std::string>> members;
  for (int i = 0; i < 24; ++i) {
    char key[16];
    std::snprintf(key, sizeof key, "s%06d", i);
    members.push_back({std::string(key) + ".jpg", jpeg(i % 8, i)});
    members.push_back({std::string(key) + ".cls", std::to_string(i == 13 ? wild : i % 8)});
  }
  const auto path = dir + "/shard-000.tar";
  t::writeFile(path, t::makeTar(members));
  return path;
}

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
  EXPECT_EQ(d.target.min().item<int64_t>(), 0);
  EXPECT_EQ(d.target.max().item<int64_t>(), 9);
  EXPECT_GE(d.x.min().item<float>(), 0.0f);
  EXPECT_LE(d.x.max().item<float>(), 1.0f);
  // Every class is present in roughly equal numbers (~180 each).
  const auto counts = torch::bincount(d.target);
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
  const batchdist::testsupport::ScratchDir base("data_missing");  // the config's directory: relative paths resolve there
  try {
    loadData(cfg, 0, base.string());
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find(base.string() + "/no/such/file.csv"), std::string::npos)
        << e.what();
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

namespace {

// Note [class count]: one corrupted `cls` does not make a 1,000,000-way head.
TEST(Labels, AWildWebdatasetLabelIsRefusedUnlessDataClassesSaysSo) {
  const auto dir = batchdist::testsupport::scratchDir("data_labels_wds").string();
  const auto shard = shardWithLabel(dir, 999999);
  auto cfg = decodedConfig(DataName::kWebdataset, shard);
  const auto error = loadError(cfg);
  EXPECT_NE(error.find("label 999999 in " + shard + " member s000013.cls: 9 distinct labels would "
                       "make a 1000000-way head"), std::string::npos) << error;
  EXPECT_NE(error.find("set data.classes if that is intended"), std::string::npos) << error;
  cfg.classes_given = true;
  cfg.classes = 1000000;
  EXPECT_EQ(loadData(cfg, 0, "").train.classes, 1000000);
  cfg.classes = 8;
  EXPECT_NE(loadError(cfg).find("label 999999 in " + shard + " member s000013.cls is outside 0..7 "
                                "(data.classes: 8)"), std::string::npos) << loadError(cfg);
  shardWithLabel(dir, 5);
  cfg.classes = 12;  // a head larger than the labels, as asked
  EXPECT_EQ(loadData(cfg, 0, "").train.classes, 12);
}

void writeNpyPair(const std::string& dir, const std::vector<int64_t>& labels) {
  const auto n = static_cast<int64_t>(labels.size());
  t::writeFile(dir + "/x.npy", t::makeNpy(NpyType::kFloat32, {n, 2}, std::string(n * 8, '\0')));
  std::string y(reinterpret_cast<const char*>(labels.data()), labels.size() * 8);
  t::writeFile(dir + "/y.npy", t::makeNpy(NpyType::kInt64, {n}, y));
}

// An npy label 7 among 0..5 leaves class 6 empty: said, naming it.
TEST(Labels, EmptyClassesAreWarnedAboutAndDataClassesApplies) {
  const auto dir = batchdist::testsupport::scratchDir("data_labels_npy").string();
  std::vector<int64_t> labels;
  for (int i = 0; i < 30; ++i) labels.push_back(i % 6);
  labels[17] = 7;
  writeNpyPair(dir, labels);
  DataConfig cfg;
  cfg.name = DataName::kNpy;
  cfg.path = dir;
  std::vector<std::string> warnings;
  DataContext ctx;
  ctx.warn = [&](const std::string& w) { warnings.push_back(w); };
  EXPECT_EQ(loadData(cfg, 0, "", ctx).train.classes, 8);
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find("data: class 6 of 0..7 has no sample in " + dir + "/y.npy (7 of 8 "
                             "classes used)"), std::string::npos) << warnings[0];
  EXPECT_NE(warnings[0].find("set data.classes: 8 if that is intended"), std::string::npos);
  cfg.classes_given = true;
  cfg.classes = 6;
  EXPECT_NE(loadError(cfg).find("label 7 in " + dir + "/y.npy row 17 is outside 0..5"),
            std::string::npos) << loadError(cfg);
  labels[17] = 900;
  writeNpyPair(dir, labels);
  cfg.classes_given = false;
  EXPECT_NE(loadError(cfg).find("label 900 in " + dir + "/y.npy row 17: 7 distinct labels"),
            std::string::npos) << loadError(cfg);
}

// Note [list paths stay under the root], through the config key.
TEST(Labels, ListPathsOutsideTheRootNeedTheConfigKey) {
  const auto dir = batchdist::testsupport::scratchDir("data_list_root").string();
  fs::create_directories(dir + "/root/a");
  for (int i = 0; i < 6; ++i) t::writeFile(dir + "/root/a/" + std::to_string(i) + ".jpg", jpeg(i % 2, i));
  t::writeFile(dir + "/outside.jpg", jpeg(1, 9));
  std::string list;
  for (int i = 0; i < 6; ++i) list += "a/" + std::to_string(i) + ".jpg " + std::to_string(i % 2) + "\n";
  t::writeFile(dir + "/root/list.txt", list + "../outside.jpg 1\n");
  auto cfg = decodedConfig(DataName::kImageFolder, "");
  cfg.list = dir + "/root/list.txt";
  EXPECT_NE(loadError(cfg).find(dir + "/root/list.txt:7: '../outside.jpg' leaves the data root"),
            std::string::npos) << loadError(cfg);
  cfg.list_outside_root = true;
  const auto split = loadData(cfg, 0, "");
  EXPECT_EQ(split.train.size() + split.val.size(), 7);
}

// Note [each file once] and [bad files named]: the walk's bad files reach the
// split (and rank 0's warnings).
TEST(Labels, AWalksBadFilesAreNamedInTheSplit) {
  const auto dir = batchdist::testsupport::scratchDir("data_walk_bad").string();
  for (int c = 0; c < 2; ++c) {
    fs::create_directories(dir + "/train/c" + std::to_string(c));
    for (int i = 0; i < 4; ++i) {
      t::writeFile(dir + "/train/c" + std::to_string(c) + "/" + std::to_string(i) + ".jpg", jpeg(c, i));
    }
  }
  fs::create_symlink("missing.jpg", dir + "/train/c0/x.jpg");
  ASSERT_EQ(::mkfifo((dir + "/train/c1/p.png").c_str(), 0600), 0);
  fs::create_directory_symlink("..", dir + "/train/c1/up");
  std::vector<std::string> warnings;
  DataContext ctx;
  ctx.warn = [&](const std::string& w) { warnings.push_back(w); };
  const auto split = loadData(decodedConfig(DataName::kImageFolder, dir), 0, "", ctx);
  EXPECT_EQ(split.train.size() + split.val.size(), 8);
  ASSERT_EQ(split.bad_files.size(), 2u);
  EXPECT_EQ(split.bad_files[0].where, dir + "/train/c1/p.png");  // found in walk order
  EXPECT_EQ(split.bad_files[0].reason, "FIFO, not a regular file: not a sample");
  EXPECT_EQ(split.bad_files[1].where, dir + "/train/c0/x.jpg");
  EXPECT_EQ(split.bad_files[1].reason, "dangling symlink (to missing.jpg), not a regular file: not a sample");
  ASSERT_EQ(warnings.size(), 2u);
  EXPECT_NE(warnings[1].find("data: skipping " + dir + "/train/c0/x.jpg: dangling symlink"), std::string::npos);
}

// Note [bad files named]: the walk's first, then each rank's in turn, each once.
TEST(Labels, DataErrorsOfEveryRankAreMergedInTurn) {
  const std::vector<DataErrorRecord> walk{{"w.jpg", "FIFO", -1}};
  const std::vector<std::vector<DataErrorRecord>> ranks{
      {{"a.jpg", "r0", 1}, {"b.jpg", "r0", 2}, {"c.jpg", "r0", 3}},
      {},
      {{"b.jpg", "r2", 2}, {"z.jpg", "r2", 9}}};
  std::vector<std::string> names;
  for (const auto& e : mergeDataErrors(walk, ranks)) names.push_back(e.where);
  EXPECT_EQ(names, (std::vector<std::string>{"w.jpg", "a.jpg", "b.jpg", "z.jpg", "c.jpg"}));
  EXPECT_EQ(mergeDataErrors(walk, ranks, 3).size(), 3u);
}

}  // namespace
