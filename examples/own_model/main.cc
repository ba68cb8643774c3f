// A program's own module, loss function and in-memory data, trained by
// batchdist's whole run: rendezvous, the batch search, equal shards, lr scaling,
// overlapped gradient sync, checkpoints and resume (docs/library.md).
//   mpirun -np 2 own_model [OUTPUT [KEY=VALUE ...]]   (again after a stop: it resumes)
#include <batchdist/batchdist.h>
#include <torch/torch.h>

#include <string>

// A small convolutional net, defined here.
struct NetImpl : torch::nn::Module {
  NetImpl()
      : conv1(register_module("conv1", torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 8, 3).padding(1)))),
        conv2(register_module("conv2", torch::nn::Conv2d(torch::nn::Conv2dOptions(8, 16, 3).padding(1)))),
        head(register_module("head", torch::nn::Linear(16 * 4 * 4, 4))) {}
  torch::Tensor forward(torch::Tensor x) {
    x = torch::max_pool2d(torch::relu(conv1(x)), 2);  // 16 x 16 -> 8 x 8
    x = torch::max_pool2d(torch::relu(conv2(x)), 2);  // -> 4 x 4
    return head(x.flatten(1));
  }
  torch::nn::Conv2d conv1, conv2;
  torch::nn::Linear head;
};
TORCH_MODULE(Net);

// The program's own data: 16 x 16 images of noise with one bright quadrant, the label.
std::shared_ptr<batchdist::TensorDataset> quadrants(int64_t n, uint64_t seed) {
  torch::manual_seed(seed);
  auto y = torch::randint(0, 4, {n}, torch::kLong);
  auto x = torch::randn({n, 1, 16, 16}) * 0.5;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t q = y[i].item<int64_t>();
    x[i].narrow(1, q / 2 * 8, 8).narrow(2, q % 2 * 8, 8).add_(1.0);
  }
  return std::make_shared<batchdist::TensorDataset>(x, y);
}

int main(int argc, char** argv) {
  batchdist::Job job(argc, argv);  // one process per GPU (or CPU rank) under mpirun
  const auto train = quadrants(2048, 1), val = quadrants(512, 2);  // alike on every rank
  torch::manual_seed(0);
  Net net;
  auto loss = [](NetImpl& m, const torch::Tensor& x, const torch::Tensor& y) {
    const auto logits = m.forward(x);
    const auto per_sample = torch::nn::functional::cross_entropy(
        logits, y, torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kNone));
    return batchdist::Loss(per_sample, {{"accuracy", logits.argmax(1).eq(y).to(torch::kFloat).mean()}});
  };
  batchdist::Settings settings;
  settings.set("batch.global", 128)
      .set("batch.per_gpu", "auto")  // the coordinated search picks it
      .set("optim.name", "adamw")
      .set("optim.lr", 0.003)
      .set("train.epochs", 3);
  for (int i = 2; i < argc; ++i) {  // more settings: checkpoint.every_steps=8, ...
    const std::string kv = argv[i];
    settings.set(kv.substr(0, kv.find('=')), kv.find('=') == std::string::npos ? "" : kv.substr(kv.find('=') + 1));
  }
  batchdist::RunOptions options;
  options.output = argc > 1 ? argv[1] : "own_model-out";
  options.resume = "auto";  // a stopped run goes on from its newest checkpoint
  return job.train(net, loss, train, val, settings, options);
}
