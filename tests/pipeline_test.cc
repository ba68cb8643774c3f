// The input pipeline end to end on one process: image folders, tar shards and
// .npy arrays made by the test, loaded, sharded into batches by the loader with
// 0..3 threads, decoded, cropped, flipped and normalised; bad files; the list cache.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <torch/torch.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "common/error.h"
#include "tests/fifo_watch.h"
#include "tests/image_fixtures.h"
#include "tests/scratch_dir.h"
#include "worker/data/data.h"
#include "worker/data/loader.h"
#include "worker/data/source.h"

using namespace batchdist::worker;
namespace fs = std::filesystem;
namespace t = batchdist::testing;

namespace {

/// A new directory of this test process's own (Note [scratch dirs]), removed when it ends.
std::string tempDir(const std::string& name) {
  return batchdist::testsupport::scratchDir("pipeline_" + name).string();
}

std::string jpeg(int w, int h, int cls, uint64_t seed) {
  const auto rgb = t::patternRgb(w, h, cls, seed);
  return t::encodeJpeg(rgb.data(), w, h, 3);
}

/// ROOT/{train,val}/<class>/...: 3 classes, `per_class` train images each (one a
/// PNG, one in a sub-folder), 2 val images each, and a README that is skipped.
std::string makeFolder(const std::string& name, int per_class = 6, bool val = true) {
  const auto root = tempDir(name);
  const char* classes[] = {"ant", "bee", "cat"};
  for (int c = 0; c < 3; ++c) {
    const auto dir = fs::path(root) / "train" / classes[c];
    fs::create_directories(dir / "sub");
    for (int i = 0; i < per_class; ++i) {
      const int w = 40 + 7 * i, h = 36 + 5 * (i % 3);
      if (i == 1) {
        const auto rgb = t::patternRgb(w, h, c, i);
        t::writeFile((dir / "b.PNG").string(), t::encodePng(rgb.data(), w, h, t::PngKind::kRgba8));
      } else if (i == 2) {
        t::writeFile((dir / "sub" / "c.jpg").string(), jpeg(w, h, c, i));
      } else {
        t::writeFile((dir / ("i" + std::to_string(i) + ".jpeg")).string(), jpeg(w, h, c, i));
      }
    }
    if (val) {
      const auto vdir = fs::path(root) / "val" / classes[c];
      fs::create_directories(vdir);
      for (int i = 0; i < 2; ++i) t::writeFile((vdir / ("v" + std::to_string(i) + ".jpg")).string(), jpeg(50, 40, c, 100 + i));
    }
  }
  t::writeFile((fs::path(root) / "train" / "ant" / "README.txt").string(), "not an image");
  return root;
}

DataConfig imageConfig(const std::string& root, int size = 24) {
  DataConfig cfg;
  cfg.name = DataName::kImageFolder;
  cfg.path = root;
  cfg.image_size = size;
  cfg.resize = size * 256 / 224;
  cfg.hflip = true;
  cfg.mean = {0.485, 0.456, 0.406};
  cfg.std = {0.229, 0.224, 0.225};
  cfg.workers_auto = false;
  return cfg;
}

std::vector<MicroBatch> jobsOf(int64_t n, int64_t batch) {
  std::vector<MicroBatch> jobs;
  for (int64_t b = 0; b + batch <= n; b += batch) {
    MicroBatch m;
    for (int64_t i = b; i < b + batch; ++i) m.indices.push_back((i * 7) % n);
    m.weights.assign(batch, 1.0f);
    jobs.push_back(m);
  }
  return jobs;
}

/// Every batch of one epoch, as one tensor.
/// `channels_last`: Note [channels last]; every batch is checked to be so laid out.
torch::Tensor epochOf(const DataConfig& cfg, const Dataset& d, int64_t workers, int64_t epoch,
                      bool training = true, std::vector<std::string>* warnings = nullptr,
                      int64_t first_job = 0, bool channels_last = false) {
  auto o = loaderOptions(cfg, d, training, torch::kCPU, 7,
                         [warnings](const std::string& w) { if (warnings) warnings->push_back(w); });
  o.workers = workers;
  o.transform.channels_last = channels_last;
  o.prefetch = 2;
  Loader loader(d, o);
  auto jobs = jobsOf(d.size(), 4);
  jobs.erase(jobs.begin(), jobs.begin() + first_job);
  const auto count = jobs.size();
  loader.start(jobs, epoch, first_job);
  std::vector<torch::Tensor> xs;
  for (std::size_t k = 0; k < count; ++k) {
    xs.push_back(loader.next().x);
    EXPECT_EQ(xs.back().is_contiguous(at::MemoryFormat::ChannelsLast), channels_last) << "batch " << k;
    EXPECT_TRUE(xs.back().is_contiguous(channels_last ? at::MemoryFormat::ChannelsLast
                                                      : at::MemoryFormat::Contiguous));
  }
  return torch::cat(xs);
}

}  // namespace

TEST(Pipeline, ImageFolderListsClassesFilesAndSkips) {
  const auto root = makeFolder("list");
  const auto split = loadData(imageConfig(root), 0, "");
  EXPECT_EQ(split.train.size(), 18);
  EXPECT_EQ(split.val.size(), 6);
  EXPECT_EQ(split.train.classes, 3);
  EXPECT_EQ(split.skipped_files, 1);  // README.txt
  EXPECT_EQ(split.train.sample_shape, (std::vector<int64_t>{3, 24, 24}));
  EXPECT_TRUE(torch::equal(torch::bincount(split.train.target), torch::full({3}, 6, torch::kLong)));
  // Sorted, recursive: ant's files are b.PNG, i0.jpeg, i3..i5.jpeg, sub/c.jpg.
  EXPECT_NE(split.train.source->where(0).find("train/ant/b.PNG"), std::string::npos);
  EXPECT_NE(split.train.source->where(5).find("train/ant/sub/c.jpg"), std::string::npos);
}

// Note [channels last]: asked for NHWC, the decoded CPU path writes each sample
// NHWC straight from the decoder, and an in-memory image set comes out of its
// transform so: the same values as the NCHW batches, bit for bit.
TEST(Pipeline, ChannelsLastBatchesHoldTheSameValues) {
  const auto root = makeFolder("nhwc");
  const auto cfg = imageConfig(root);
  const auto split = loadData(cfg, 0, "");
  for (const int64_t workers : {0, 2}) {
    const auto nchw = epochOf(cfg, split.train, workers, 1, true, nullptr, 0, false);
    const auto nhwc = epochOf(cfg, split.train, workers, 1, true, nullptr, 0, true);
    EXPECT_TRUE(torch::equal(nchw, nhwc)) << workers << " workers";
  }
  DataConfig synthetic = parseConfig("data: {name: synthetic_images, samples: 40, shape: [3, 10, 10], "
                                     "classes: 2, crop_padding: 2, hflip: true}",
                                     "t.yaml").data;
  const auto images = loadData(synthetic, 0, "");
  EXPECT_TRUE(torch::equal(epochOf(synthetic, images.train, 0, 1, true, nullptr, 0, false),
                           epochOf(synthetic, images.train, 0, 1, true, nullptr, 0, true)));
}

TEST(Pipeline, BatchesAreTheSameWhateverTheThreadCount) {
  const auto root = makeFolder("threads");
  const auto cfg = imageConfig(root);
  const auto split = loadData(cfg, 0, "");
  const auto a = epochOf(cfg, split.train, 0, 1);
  EXPECT_EQ(a.sizes(), (std::vector<int64_t>{16, 3, 24, 24}));
  EXPECT_EQ(a.scalar_type(), torch::kFloat);
  for (int workers : {1, 3}) {
    EXPECT_TRUE(torch::equal(a, epochOf(cfg, split.train, workers, 1))) << workers << " threads";
  }
  // Another epoch crops and flips differently; a run resumed at job 2 makes the same rest.
  EXPECT_FALSE(torch::equal(a, epochOf(cfg, split.train, 1, 2)));
  EXPECT_TRUE(torch::equal(a.slice(0, 8), epochOf(cfg, split.train, 2, 1, true, nullptr, 2)));
  // Normalised with ImageNet's statistics: roughly centred, not in [0, 1].
  EXPECT_LT(a.min().item<float>(), -0.5f);
  EXPECT_GT(a.max().item<float>(), 1.0f);
}

TEST(Pipeline, EvalIsResizeThenCentreCropAndNotRandom) {
  const auto root = makeFolder("eval");
  const auto cfg = imageConfig(root);
  const auto split = loadData(cfg, 0, "");
  const auto a = epochOf(cfg, split.val, 0, 1, /*training=*/false);
  EXPECT_TRUE(torch::equal(a, epochOf(cfg, split.val, 2, 5, /*training=*/false)));
  // The eval crop of a 50x40 image: shorter side 40 -> 27 (24 * 256 / 224), centre 24x24,
  // i.e. the centre 35.6 x 35.6 of the source: its mean colour is the class pattern's.
  EXPECT_EQ(a.size(0), 4);
}

TEST(Pipeline, ABadFileIsSkippedOnceOrFailsNamingIt) {
  const auto root = makeFolder("bad");
  t::writeFile(root + "/train/bee/i0.jpeg", "this is text, not a JPEG");
  auto cfg = imageConfig(root);
  const auto split = loadData(cfg, 0, "");
  std::vector<std::string> warnings;
  const auto a = epochOf(cfg, split.train, 2, 1, true, &warnings);
  EXPECT_EQ(a.size(0), 16);
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find("train/bee/i0.jpeg"), std::string::npos) << warnings[0];
  EXPECT_NE(warnings[0].find("not a JPEG or PNG"), std::string::npos) << warnings[0];
  // Deterministic: the same replacement whatever the threads.
  EXPECT_TRUE(torch::equal(a, epochOf(cfg, split.train, 0, 1)));
  cfg.on_error = OnError::kFail;
  try {
    epochOf(cfg, split.train, 2, 1);
    FAIL() << "a bad file with on_error: fail must stop the run";
  } catch (const batchdist::Error& e) {
    EXPECT_NE(std::string(e.what()).find("train/bee/i0.jpeg"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("on_error"), std::string::npos) << e.what();
  }
}

// Note [input files are regular files]: a data.list may name a FIFO (the walk
// never lists one): reading it waited in open() for a writer, in a loader thread,
// and training with it. It is a bad sample, named by what it is.
TEST(Pipeline, AListedImageThatIsAPipeIsABadSampleNotAWait) {
  const auto root = tempDir("list_fifo");
  t::writeFile(root + "/ok.jpg", jpeg(40, 36, 0, 1));
  ASSERT_EQ(::mkfifo((root + "/pipe.jpg").c_str(), 0600), 0) << std::strerror(errno);
  const auto source = imageFileSource(root, {ImageEntry{"ok.jpg", 0}, ImageEntry{"pipe.jpg", 1}});
  std::string bytes;
  batchdist::testsupport::expectNoWaitOn(root + "/pipe.jpg", [&] {
    try {
      source->read(1, &bytes);
      ADD_FAILURE() << "a FIFO was read as an image";
    } catch (const SampleError& e) {
      EXPECT_EQ(std::string(e.what()), root + "/pipe.jpg: is a pipe (FIFO), not a regular file");
    }
  });
  source->read(0, &bytes);
  EXPECT_EQ(bytes, jpeg(40, 36, 0, 1));
}

// Note [replacement's target]: with on_error skip, the good sample that takes a bad
// one's place brings its own target. Here the bad file is the last of class "ant"
// (index 5, sub/c.jpg), so its replacement is the first "bee" (index 6).
TEST(Pipeline, ASkippedFilesReplacementBringsItsOwnLabel) {
  const auto root = makeFolder("bad_label");
  t::writeFile(root + "/train/ant/sub/c.jpg", "this is text, not a JPEG");
  const auto cfg = imageConfig(root);
  const auto split = loadData(cfg, 0, "");
  ASSERT_EQ(split.train.target[5].item<int64_t>(), 0);
  ASSERT_EQ(split.train.target[6].item<int64_t>(), 1);
  const auto batchOf = [&](std::vector<int64_t> indices) {
    auto o = loaderOptions(cfg, split.train, true, torch::kCPU, 7, [](const std::string&) {});
    o.workers = 1;
    Loader loader(split.train, o);
    MicroBatch m;
    m.indices = std::move(indices);
    m.weights.assign(m.indices.size(), 1.0f);
    loader.start({m}, 1, 0);
    return loader.next();
  };
  const auto replaced = batchOf({5, 0}), direct = batchOf({6, 0});
  EXPECT_TRUE(torch::equal(replaced.x, direct.x));  // the same sample decoded in its place
  EXPECT_EQ(replaced.target[0].item<int64_t>(), 1) << "the replacement kept the bad file's label";
  EXPECT_TRUE(torch::equal(replaced.target, direct.target));
}

TEST(Pipeline, NoValFolderSplitsTrainSeeded) {
  const auto root = makeFolder("noval", 6, /*val=*/false);
  auto cfg = imageConfig(root);
  cfg.val_fraction = 1.0 / 3;
  const auto a = loadData(cfg, 3, "");
  EXPECT_EQ(a.train.size(), 12);
  EXPECT_EQ(a.val.size(), 6);
  const auto b = loadData(cfg, 3, "");
  EXPECT_EQ(a.val.source->where(0), b.val.source->where(0));
}

TEST(Pipeline, ClassMissingFromOneSplitIsNamed) {
  const auto root = makeFolder("missing");
  fs::remove_all(root + "/val/cat");
  try {
    loadData(imageConfig(root), 0, "");
    FAIL();
  } catch (const batchdist::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("cat"), std::string::npos) << e.what();
  }
}

TEST(Pipeline, ListIsCachedUntilTheFolderChanges) {
  const auto root = makeFolder("cache");
  const auto cache = tempDir("cache_out");
  std::vector<std::string> notes;
  DataContext ctx;
  ctx.cache_dir = cache;
  ctx.note = [&](const std::string& n) { notes.push_back(n); };
  const auto cfg = imageConfig(root);
  EXPECT_EQ(loadData(cfg, 0, "", ctx).train.size(), 18);
  ASSERT_FALSE(notes.empty());
  EXPECT_NE(notes.back().find("listed"), std::string::npos) << notes.back();
  EXPECT_EQ(loadData(cfg, 0, "", ctx).train.size(), 18);
  EXPECT_NE(notes.back().find("unchanged"), std::string::npos) << notes.back();
  // A new image changes its folder's time: listed again, and found.
  t::writeFile(root + "/train/cat/sub/new.jpg", jpeg(40, 40, 2, 9));
  fs::last_write_time(root + "/train/cat/sub", fs::file_time_type::clock::now() + std::chrono::seconds(5));
  EXPECT_EQ(loadData(cfg, 0, "", ctx).train.size(), 19);
  EXPECT_NE(notes.back().find("listed"), std::string::npos) << notes.back();
}

TEST(Pipeline, WebdatasetShardsLoadAndDecode) {
  const auto dir = tempDir("wds");
  for (int s = 0; s < 2; ++s) {
    std::vector<std::pair<std::string, std::string>> members;
    for (int k = 0; k < 6; ++k) {
      const int i = s * 6 + k;
      const auto key = "s" + std::to_string(1000 + i);
      members.push_back({key + ".jpg", jpeg(48, 40, i % 3, i)});
      members.push_back({key + ".cls", std::to_string(i % 3)});
    }
    t::writeFile(dir + "/train-00000" + std::to_string(s) + ".tar", t::makeTar(members));
  }
  DataConfig cfg = imageConfig("");
  cfg.name = DataName::kWebdataset;
  cfg.path = dir + "/train-{000000..000001}.tar";
  cfg.val_fraction = 0.25;
  const auto split = loadData(cfg, 0, "");
  EXPECT_EQ(split.train.size() + split.val.size(), 12);
  EXPECT_EQ(split.val.size(), 3);
  EXPECT_EQ(split.train.classes, 3);
  const auto x = epochOf(cfg, split.train, 2, 0);
  EXPECT_EQ(x.sizes(), (std::vector<int64_t>{8, 3, 24, 24}));
  EXPECT_TRUE(torch::equal(x, epochOf(cfg, split.train, 0, 0)));
}

TEST(Pipeline, NpyIsMappedAndSplitWithoutCopies) {
  const auto dir = tempDir("npy");
  const int64_t n = 20;
  std::string xs(n * 2 * 3, '\0'), ys(n * 8, '\0');
  for (int64_t i = 0; i < n; ++i) {
    for (int k = 0; k < 6; ++k) xs[i * 6 + k] = static_cast<char>(i * 10 + k);
    const int64_t label = i % 4;
    std::memcpy(&ys[i * 8], &label, 8);
  }
  t::writeFile(dir + "/x.npy", t::makeNpy(NpyType::kUint8, {n, 2, 3}, xs));
  t::writeFile(dir + "/y.npy", t::makeNpy(NpyType::kInt64, {n}, ys));
  DataConfig cfg;
  cfg.name = DataName::kNpy;
  cfg.path = dir;
  cfg.val_fraction = 0.25;
  const auto split = loadData(cfg, 5, "");
  EXPECT_EQ(split.train.size(), 15);
  EXPECT_EQ(split.val.size(), 5);
  EXPECT_EQ(split.train.classes, 4);
  EXPECT_EQ(split.train.sample_shape, (std::vector<int64_t>{2, 3}));
  // The split shares the mapping: gathered rows are the file's rows.
  EXPECT_EQ(split.train.x.data_ptr(), split.val.x.data_ptr());
  const auto rows = split.train.rows;
  for (int64_t i = 0; i < split.train.size(); ++i) {
    const int64_t r = rows[i].item<int64_t>();
    EXPECT_EQ(split.train.gather(torch::tensor({i})).view(-1)[0].item<uint8_t>(), r * 10 % 256);
    EXPECT_EQ(split.train.target[i].item<int64_t>(), r % 4);
  }
  // y with the wrong length is named.
  t::writeFile(dir + "/y.npy", t::makeNpy(NpyType::kInt64, {n - 1}, ys.substr(8)));
  try {
    loadData(cfg, 5, "");
    FAIL();
  } catch (const batchdist::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("19 labels for 20 samples"), std::string::npos) << e.what();
  }
}

TEST(Pipeline, RamCacheKeepsBytesWithinItsBoundAndChangesNothing) {
  const auto root = makeFolder("ram");
  auto cfg = imageConfig(root);
  const auto split = loadData(cfg, 0, "");
  const auto plain = epochOf(cfg, split.train, 2, 1);
  cfg.cache = DataCache::kRam;
  cfg.cache_mb = 1;
  auto o = loaderOptions(cfg, split.train, true, torch::kCPU, 7, nullptr);
  o.workers = 2;
  Loader loader(split.train, o);
  std::vector<torch::Tensor> xs;
  for (int epoch : {1, 1}) {
    const auto jobs = jobsOf(split.train.size(), 4);
    loader.start(jobs, epoch);
    xs.clear();
    for (std::size_t k = 0; k < jobs.size(); ++k) xs.push_back(loader.next().x);
  }
  EXPECT_TRUE(torch::equal(plain, torch::cat(xs)));
  // 16 samples of a few KB each: all cached after the first pass, read from RAM in the second.
  EXPECT_GT(loader.decoder()->cachedBytes(), 0);
  EXPECT_LE(loader.decoder()->cachedBytes(), 1 << 20);
  EXPECT_GE(loader.decoder()->cacheHits(), 16);
}
