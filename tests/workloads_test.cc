// Real workloads: image readers (and corrupted files), ResNet, TorchScript,
// the loader, transforms and the fp16 loss scaler.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>
#include <fstream>
#include <thread>

#include "common/error.h"
#include "worker/common/files.h"
#include "worker/data/data.h"
#include "worker/data/loader.h"
#include "worker/model/model.h"
#include "worker/model/precision.h"
#include "worker/common/console.h"
#include "worker/config/config.h"
#include "worker/plan/plan.h"
#include "worker/train/trainer.h"
#include "collective/process_group.h"
#include "collective/torch_compat.h"
#include "config_errors.h"
#include "scratch_dir.h"

#include <torch/script.h>

using batchdist::ConfigError;
using batchdist::testsupport::errorOf;
using namespace batchdist::worker;
namespace fs = std::filesystem;

namespace {

/// A new directory of this test process's own (Note [scratch dirs]), removed when it ends.
fs::path tempDir(const std::string& name) {
  return batchdist::testsupport::scratchDir("workloads_" + name);
}

void writeBytes(const fs::path& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

/// `n` CIFAR records; record i has label (i % classes) and every pixel = i.
std::string cifarRecords(int n, int label_bytes, int classes) {
  std::string out;
  for (int i = 0; i < n; ++i) {
    if (label_bytes == 2) out.push_back(static_cast<char>(i % 20));  // coarse
    out.push_back(static_cast<char>(i % classes));
    out.append(3072, static_cast<char>(i));
  }
  return out;
}

std::string be32(uint32_t v) {
  return {static_cast<char>(v >> 24), static_cast<char>(v >> 16), static_cast<char>(v >> 8),
          static_cast<char>(v)};
}

const std::string kTinyCnn = std::string(BATCHDIST_SOURCE_DIR) + "/tests/data/tiny_cnn.pt";

}  // namespace

TEST(Readers, Cifar10BinaryLayout) {
  const auto dir = tempDir("cifar10");
  for (int f = 1; f <= 5; ++f) {
    writeBytes(dir / ("data_batch_" + std::to_string(f) + ".bin"), cifarRecords(4, 1, 10));
  }
  writeBytes(dir / "test_batch.bin", cifarRecords(3, 1, 10));
  DataConfig cfg;
  cfg.name = DataName::kCifar10;
  cfg.path = dir.string();
  const auto split = loadData(cfg, 0, "");
  EXPECT_EQ(split.train.size(), 20);
  EXPECT_EQ(split.val.size(), 3);
  EXPECT_EQ(split.train.x.sizes(), (std::vector<int64_t>{20, 3, 32, 32}));
  EXPECT_EQ(split.train.x.scalar_type(), torch::kByte);
  EXPECT_EQ(split.train.target[3].item<int64_t>(), 3);
  EXPECT_EQ(split.train.x[3][2][31][31].item<int>(), 3);  // channel-major copy
  EXPECT_DOUBLE_EQ(split.train.x_scale, 1.0 / 255.0);
}

TEST(Readers, Cifar100UsesTheFineLabel) {
  const auto d = parseCifar(cifarRecords(5, 2, 100), "train.bin", 2, 100);
  EXPECT_EQ(d.size(), 5);
  EXPECT_EQ(d.target[4].item<int64_t>(), 4);
}

TEST(Readers, CorruptCifarNamesFileAndOffset) {
  auto bytes = cifarRecords(3, 1, 10);
  auto msg = errorOf<ConfigError>([&] { parseCifar(bytes.substr(0, bytes.size() - 100), "b.bin", 1, 10); });
  EXPECT_NE(msg.find("b.bin: 9119 bytes is not a whole number of 3073-byte CIFAR records"),
            std::string::npos)
      << msg;
  EXPECT_NE(msg.find("record at offset 6146 is truncated"), std::string::npos) << msg;
  bytes[3073] = 42;  // label of record 1
  msg = errorOf<ConfigError>([&] { parseCifar(bytes, "b.bin", 1, 10); });
  EXPECT_NE(msg.find("b.bin: offset 3073: label 42 is outside 0..9"), std::string::npos) << msg;
  const auto dir = tempDir("cifar_missing");
  DataConfig cfg;
  cfg.name = DataName::kCifar10;
  cfg.path = dir.string();
  msg = errorOf<ConfigError>([&] { loadData(cfg, 0, ""); });
  EXPECT_NE(msg.find("data_batch_1.bin"), std::string::npos) << msg;
}

TEST(Readers, MnistIdxFiles) {
  const auto dir = tempDir("mnist");
  auto images = [](uint32_t n) {
    std::string s = be32(0x803) + be32(n) + be32(4) + be32(4);
    for (uint32_t i = 0; i < n * 16; ++i) s.push_back(static_cast<char>(i % 256));
    return s;
  };
  auto labels = [](uint32_t n) {
    std::string s = be32(0x801) + be32(n);
    for (uint32_t i = 0; i < n; ++i) s.push_back(static_cast<char>(i % 10));
    return s;
  };
  writeBytes(dir / "train-images-idx3-ubyte", images(12));
  writeBytes(dir / "train-labels-idx1-ubyte", labels(12));
  writeBytes(dir / "t10k-images-idx3-ubyte", images(5));
  writeBytes(dir / "t10k-labels-idx1-ubyte", labels(5));
  DataConfig cfg;
  cfg.name = DataName::kMnist;
  cfg.path = dir.string();
  const auto split = loadData(cfg, 0, "");
  EXPECT_EQ(split.train.size(), 12);
  EXPECT_EQ(split.val.size(), 5);
  EXPECT_EQ(split.train.sample_shape, (std::vector<int64_t>{1, 4, 4}));
  EXPECT_EQ(split.train.target[11].item<int64_t>(), 1);
  EXPECT_EQ(split.train.x[1][0][0][1].item<int>(), 17);

  auto msg = errorOf<ConfigError>([&] { parseIdx(images(3).substr(0, 40), "i", labels(3), "l"); });
  EXPECT_NE(msg.find("i: header says 3 images of 4x4 (64 bytes), but the file has 40 bytes "
                     "(truncated)"),
            std::string::npos)
      << msg;
  msg = errorOf<ConfigError>([&] { parseIdx(labels(3), "i", labels(3), "l"); });
  EXPECT_NE(msg.find("i: offset 0: expected the idx3-ubyte magic 0x00000803"), std::string::npos)
      << msg;
  msg = errorOf<ConfigError>([&] { parseIdx(images(3), "i", labels(4), "l"); });
  EXPECT_NE(msg.find("l: offset 4: 4 labels for 3 images"), std::string::npos) << msg;
}

TEST(Readers, MnistHeaderWithoutImagesIsRefused) {
  // A header declaring 0 images, or images of 0x0 pixels, matches a 16-byte file;
  // it used to load as an empty data set and fail later with torch's "from is
  // out of bounds for float".
  const auto header = [](uint32_t n, uint32_t rows, uint32_t cols) {
    return be32(0x803) + be32(n) + be32(rows) + be32(cols);
  };
  const auto labels = [](uint32_t n) { return be32(0x801) + be32(n) + std::string(n, '\1'); };
  auto msg = errorOf<ConfigError>([&] { parseIdx(header(3, 0, 0), "i", labels(3), "l"); });
  EXPECT_NE(msg.find("i: offset 4: the header declares 3 images of 0x0 pixels; a data set needs at "
                     "least one image of at least 1x1"),
            std::string::npos)
      << msg;
  msg = errorOf<ConfigError>([&] { parseIdx(header(0, 28, 28), "i", labels(0), "l"); });
  EXPECT_NE(msg.find("i: offset 4: the header declares 0 images of 28x28 pixels"), std::string::npos)
      << msg;
  msg = errorOf<ConfigError>([&] { parseIdx(header(0, 0, 0), "i", labels(0), "l"); });
  EXPECT_NE(msg.find("the header declares 0 images of 0x0 pixels"), std::string::npos) << msg;
}

TEST(Readers, SyntheticImagesAreDeterministicBytes) {
  DataConfig cfg;
  cfg.name = DataName::kSyntheticImages;
  cfg.samples = 40;
  cfg.shape = {3, 16, 16};
  const auto a = loadData(cfg, 4, "");
  const auto b = loadData(cfg, 4, "");
  EXPECT_TRUE(torch::equal(a.train.x, b.train.x));
  EXPECT_EQ(a.train.x.scalar_type(), torch::kByte);
  EXPECT_EQ(a.train.x.sizes(), (std::vector<int64_t>{32, 3, 16, 16}));
  cfg.shape = {64};
  EXPECT_NE(errorOf<ConfigError>([&] { loadData(cfg, 4, ""); }).find("synthetic_images needs [C, H, W]"),
            std::string::npos);
}

TEST(Models, ResNet18CifarForwardBackward) {
  ModelConfig cfg;
  cfg.name = ModelName::kResnet18;
  auto net = buildModel(cfg, {3, 32, 32}, 10);
  EXPECT_TRUE(net->hasBatchNorm());
  int64_t n = 0;
  for (const auto& p : net->parameters()) n += p.numel();
  EXPECT_EQ(n, 11173962);  // torchvision's resnet18 with a 3x3 stem and 10 classes
  net->train(true);
  auto out = net->forward(torch::randn({2, 3, 32, 32}));
  EXPECT_EQ(out.sizes(), (std::vector<int64_t>{2, 10}));
  out.sum().backward();
  for (const auto& [name, p] : net->namedParameters()) {
    ASSERT_TRUE(p.grad().defined()) << name;
  }
}

TEST(Models, ResNet50ImagenetStem) {
  ModelConfig cfg;
  cfg.name = ModelName::kResnet50;
  cfg.stem = ResnetStem::kImagenet;
  auto net = buildModel(cfg, {3, 64, 64}, 7);
  int64_t n = 0;
  for (const auto& p : net->parameters()) n += p.numel();
  EXPECT_EQ(n, 23522375);  // torchvision's resnet50 body + a 7-class head
  EXPECT_EQ(net->forward(torch::randn({2, 3, 64, 64})).sizes(), (std::vector<int64_t>{2, 7}));
  EXPECT_NE(errorOf<ConfigError>([&] { buildModel(cfg, {64}, 7); }).find("needs image samples"), std::string::npos);
}

TEST(Models, TorchScriptLoadsTrainsAndSaves) {
  ModelConfig cfg;
  cfg.name = ModelName::kTorchscript;
  cfg.path = kTinyCnn;
  EXPECT_TRUE(modelHasBatchNorm(cfg));
  auto net = buildModel(cfg, {1, 8, 8}, 10);
  EXPECT_NE(net->describe().find("torchscript"), std::string::npos);
  EXPECT_FALSE(net->namedBuffers().empty());  // BatchNorm running statistics
  net->train(true);
  auto out = net->forward(torch::randn({4, 1, 8, 8}));
  out.sum().backward();
  for (const auto& p : net->parameters()) ASSERT_TRUE(p.grad().defined());
  const auto saved = (tempDir("ts") / "again.pt").string();
  writeFileAtomic(saved, net->serialize());
  cfg.path = saved;
  EXPECT_NO_THROW(buildModel(cfg, {1, 8, 8}, 10));
}

// A TorchScript forward that raises during training (here: a batch of the
// wrong shape) names the model file, not only the Python line inside it.
TEST(Models, TorchScriptForwardFailureInTrainingNamesTheFile) {
  ModelConfig cfg;
  cfg.name = ModelName::kTorchscript;
  cfg.path = kTinyCnn;
  auto model = buildModel(cfg, {1, 8, 8}, 10);
  std::string msg = "<no error>";
  try {
    model->forward(torch::zeros({2, 3, 5, 5}));
  } catch (const batchdist::TrainingError& e) {
    msg = e.what();
  }
  EXPECT_NE(msg.find("model " + kTinyCnn + ": forward failed on input of shape [2, 3, 5, 5]"),
            std::string::npos)
      << msg;
}

TEST(Models, TorchScriptErrorsNameTheFileAndShape) {
  ModelConfig cfg;
  cfg.name = ModelName::kTorchscript;
  cfg.path = "/no/such/model.pt";
  EXPECT_NE(errorOf<ConfigError>([&] { buildModel(cfg, {1, 8, 8}, 10); }).find("no such file '/no/such/model.pt'"),
            std::string::npos);
  const auto junk = tempDir("ts_junk") / "junk.pt";
  writeBytes(junk, "not a zip archive");
  cfg.path = junk.string();
  EXPECT_NE(errorOf<ConfigError>([&] { buildModel(cfg, {1, 8, 8}, 10); }).find("is not a TorchScript module"),
            std::string::npos);
  cfg.path = kTinyCnn;
  auto msg = errorOf<ConfigError>([&] { buildModel(cfg, {64}, 10); });
  EXPECT_NE(msg.find("forward failed on a sample batch of shape [2, 64]"), std::string::npos) << msg;
  msg = errorOf<ConfigError>([&] { buildModel(cfg, {1, 8, 8}, 5); });
  EXPECT_NE(msg.find("returned [2, 10]; expected [2, 5]"), std::string::npos) << msg;
}

TEST(Models, SyncBatchNormFallsBackToLocalStatisticsOnOneRank) {
  ModelConfig cfg;
  cfg.name = ModelName::kCnn;
  cfg.sync_batchnorm = true;
  auto net = buildModel(cfg, {1, 8, 8}, 10, "", nullptr);
  EXPECT_TRUE(net->hasBatchNorm());
  EXPECT_EQ(net->forward(torch::randn({3, 1, 8, 8})).sizes(), (std::vector<int64_t>{3, 10}));
}

namespace {
Dataset imageSet(int64_t n) {
  DataConfig cfg;
  cfg.name = DataName::kSyntheticImages;
  cfg.samples = n;
  cfg.shape = {3, 8, 8};
  cfg.val_fraction = 0;
  return loadData(cfg, 1, "").train;
}

std::vector<MicroBatch> jobsFor(int64_t n, int64_t batch) {
  std::vector<MicroBatch> jobs;
  const auto perm = seededPermutation(n, 3, 0);
  for (int64_t b = 0; b + batch <= n; b += batch) {
    MicroBatch mb;
    for (int64_t i = 0; i < batch; ++i) {
      mb.indices.push_back(perm[b + i]);
      mb.weights.push_back(1.0f);
    }
    jobs.push_back(mb);
  }
  return jobs;
}
}  // namespace

TEST(Loader, SameBatchesInTheSameOrderWhateverTheWorkerCount) {
  const auto data = imageSet(256);
  std::vector<std::vector<torch::Tensor>> runs;
  for (int64_t workers : {0, 1, 4}) {
    LoaderOptions o;
    o.workers = workers;
    o.prefetch = 3;
    o.transform.crop_padding = 2;
    o.transform.hflip = true;
    o.transform.mean = {0.5, 0.5, 0.5};
    o.transform.std = {0.25, 0.25, 0.25};
    o.seed = 11;
    Loader loader(data, o);
    std::vector<torch::Tensor> xs;
    for (int64_t epoch = 0; epoch < 2; ++epoch) {
      loader.start(jobsFor(256, 16), epoch);
      for (int i = 0; i < 16; ++i) {
        auto b = loader.next();
        ASSERT_EQ(b.x.sizes(), (std::vector<int64_t>{16, 3, 8, 8}));
        xs.push_back(b.x);
      }
    }
    runs.push_back(xs);
  }
  for (std::size_t r = 1; r < runs.size(); ++r) {
    for (std::size_t i = 0; i < runs[0].size(); ++i) {
      ASSERT_TRUE(torch::equal(runs[0][i], runs[r][i])) << "run " << r << " batch " << i;
    }
  }
  // The random transforms did something, and differ between epochs.
  EXPECT_FALSE(torch::equal(runs[0][0], runs[0][16]));
}

TEST(Loader, QueueNeverExceedsPrefetch) {
  const auto data = imageSet(512);
  LoaderOptions o;
  o.workers = 4;
  o.prefetch = 2;
  Loader loader(data, o);
  loader.start(jobsFor(512, 8), 0);
  for (int i = 0; i < 64; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));  // a slow consumer
    loader.next();
  }
  EXPECT_GE(loader.maxQueued(), 1);
  EXPECT_LE(loader.maxQueued(), 2);
}

// A failing job (here: an index past the data set) is reported once, when its
// turn comes; the jobs after it and the next start() are unaffected (a search
// candidate after a failed one must not inherit its error).
TEST(Loader, AFailedJobFailsOnceAndTheNextEpochIsClean) {
  const auto data = imageSet(64);
  for (int64_t workers : {0, 2}) {
    SCOPED_TRACE(::testing::Message() << "workers=" << workers);
    LoaderOptions o;
    o.workers = workers;
    o.prefetch = 2;
    Loader loader(data, o);
    auto jobs = jobsFor(64, 8);
    jobs[1].indices[0] = 1000;  // out of range
    loader.start(jobs, 0);
    EXPECT_NO_THROW(loader.next());
    EXPECT_ANY_THROW(loader.next());
    for (int i = 2; i < 8; ++i) EXPECT_NO_THROW(loader.next()) << "job " << i;
    loader.start(jobsFor(64, 8), 1);
    for (int i = 0; i < 8; ++i) EXPECT_NO_THROW(loader.next()) << "epoch 1 job " << i;
  }
}

TEST(Transforms, CropFlipResizeNormalize) {
  auto x = torch::arange(2 * 1 * 4 * 4, torch::kFloat).view({2, 1, 4, 4});
  Transform flip;
  flip.hflip = true;
  const auto a = flip.apply(x, 5);
  EXPECT_TRUE(torch::equal(a, flip.apply(x, 5)));  // seeded
  for (int i = 0; i < 2; ++i) {
    EXPECT_TRUE(torch::equal(a[i], x[i]) || torch::equal(a[i], x[i].flip({2})));
  }
  Transform crop;
  crop.crop_padding = 1;
  const auto c = crop.apply(x, 7);
  EXPECT_EQ(c.sizes(), x.sizes());
  EXPECT_EQ(c.sum().item<float>() <= x.sum().item<float>(), true);  // zero padding enters
  Transform resize;
  resize.resize = 8;
  EXPECT_EQ(resize.apply(x, 0).sizes(), (std::vector<int64_t>{2, 1, 8, 8}));
  EXPECT_EQ(resize.outputShape({1, 4, 4}), (std::vector<int64_t>{1, 8, 8}));
  Transform norm;
  norm.mean = {1.0};
  norm.std = {2.0};
  EXPECT_TRUE(torch::allclose(norm.apply(x, 0), (x - 1.0) / 2.0));
}

TEST(Precision, LossScalerSkipsInfStepsAndHalvesThenGrows) {
  LossScaler s(1024, /*growth_interval=*/3);
  EXPECT_TRUE(s.update(false));
  EXPECT_FALSE(s.update(true));  // inf: skipped
  EXPECT_DOUBLE_EQ(s.scale(), 512);
  EXPECT_EQ(s.skippedSteps(), 1);
  EXPECT_TRUE(s.update(false));
  EXPECT_TRUE(s.update(false));
  EXPECT_TRUE(s.update(false));  // three finite steps in a row: grows
  EXPECT_DOUBLE_EQ(s.scale(), 1024);
}

TEST(Precision, AStepWithAnInfGradientIsSkippedAndTheScaleHalves) {
  LossScaler s(65536, 2000);
  auto w = torch::ones({3}, torch::requires_grad());
  w.mutable_grad() = torch::tensor({65536.0f, std::numeric_limits<float>::infinity(), 0.0f});
  EXPECT_FALSE(unscaleOrSkip(s, {w}));
  EXPECT_DOUBLE_EQ(s.scale(), 32768);
  w.mutable_grad() = torch::tensor({32768.0f, 65536.0f, 0.0f});
  EXPECT_TRUE(unscaleOrSkip(s, {w}));
  EXPECT_TRUE(torch::allclose(w.grad(), torch::tensor({1.0f, 2.0f, 0.0f})));  // unscaled
}

TEST(Precision, Fp16NeedsCudaAndBf16RunsOnCpu) {
  EXPECT_THROW(checkPrecision(Precision::kFp16, at::kCPU, "t.yaml"), ConfigError);
  EXPECT_NO_THROW(checkPrecision(Precision::kBf16, at::kCPU, "t.yaml"));
  ModelConfig cfg;
  auto net = buildModel(cfg, {1, 8, 8}, 10);
  torch::Tensor out;
  {
    AutocastScope scope(at::kCPU, Precision::kBf16);
    out = net->forward(torch::randn({4, 1, 8, 8}));
  }
  EXPECT_EQ(out.scalar_type(), torch::kBFloat16);
  EXPECT_EQ(net->forward(torch::randn({4, 1, 8, 8})).scalar_type(), torch::kFloat);  // scope ended
}

// Note [frozen parameters]: the usual fine-tuning set-up, a TorchScript model
// whose backbone has requires_grad=False, trained with weight decay: the frozen
// weights must come out bit-identical, the trainable head must move.
TEST(Trainer, FrozenParametersAreNeitherTrainedNorDecayed) {
  auto module = torch::jit::load(kTinyCnn);
  for (auto p : module.named_parameters()) {
    if (p.name.rfind("conv.", 0) == 0) p.value.set_requires_grad(false);
  }
  const auto path = (tempDir("frozen") / "frozen.pt").string();
  module.save(path);
  std::map<std::string, torch::Tensor> before;
  for (auto p : torch::jit::load(path).named_parameters()) before[p.name] = p.value.clone();
  ASSERT_FALSE(before.at("conv.weight").requires_grad());

  auto cfg = parseConfig("model: {name: torchscript, path: " + path + "}\n"
                         "optim: {name: sgd, lr: 0.5, weight_decay: 0.1}\n"
                         "batch: {global: 32}\ntrain: {epochs: 3, max_steps: 30}\n",
                         "t.yaml");
  auto store = c10::make_intrusive<c10d::HashStore>();
  batchdist::collective::BackendOptions o;
  o.backend = "gloo";
  o.address = "127.0.0.1";
  auto comm = batchdist::collective::createCommunicator(store, 0, 1, o);
  const auto data = loadData(cfg.data, cfg.train.seed, "");
  const auto plan = makePlan(cfg, 1, data.train.size(), true);
  Trainer trainer(cfg, *comm, data, at::kCPU, plan);
  Console quiet(false, ProgressStyle::kOff);
  const auto result = trainer.train(quiet);
  EXPECT_EQ(result.steps, 30);
  int frozen = 0, moved = 0;
  for (const auto& [name, t] : trainer.model().namedParameters()) {
    if (name.rfind("conv.", 0) == 0) {
      EXPECT_TRUE(torch::equal(t, before.at(name))) << name << " changed although frozen";
      EXPECT_FALSE(t.grad().defined()) << name << " got a gradient";
      ++frozen;
    } else if (!torch::equal(t, before.at(name))) {
      ++moved;
    }
  }
  EXPECT_EQ(frozen, 2);
  EXPECT_GT(moved, 0) << "the trainable parameters did not train";
}
