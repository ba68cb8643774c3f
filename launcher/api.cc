// The library's public API (launcher/include/batchdist/batchdist.h) on top of
// the launcher's own job (launcher/job.h): a program's parts travel into the run
// as Note [program parts] says (worker/model/program_model.h).

#include "batchdist/batchdist.h"

#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <stdexcept>

#include "common/error.h"
#include "common/stdlib_guard.h"
#include "launcher/api_job.h"
#include "launcher/job.h"
#include "launcher/mpi_scope.h"
#include "worker/common/faults.h"
#include "worker/common/util.h"
#include "worker/data/data.h"
#include "worker/model/program_model.h"
#include "worker/run.h"

namespace batchdist {

Settings Settings::fromFile(std::string path) {
  Settings s;
  s.file_ = std::move(path);
  return s;
}

Settings& Settings::set(const std::string& key, const std::string& value) {
  entries_.push_back(key + "=" + value);
  return *this;
}

std::string Settings::number(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

Example Dataset::get(const std::vector<int64_t>& indices) const {
  std::vector<torch::Tensor> xs, ts;
  xs.reserve(indices.size());
  ts.reserve(indices.size());
  for (const int64_t i : indices) {
    auto e = get(i);
    xs.push_back(std::move(e.x));
    ts.push_back(std::move(e.target));
  }
  return {torch::stack(xs), torch::stack(ts)};
}

TensorDataset::TensorDataset(torch::Tensor x, torch::Tensor target)
    : x_(std::move(x)), target_(std::move(target)) {
  if (!x_.defined() || !target_.defined() || x_.dim() == 0 || target_.dim() == 0 ||
      x_.size(0) != target_.size(0)) {
    const auto shape = [](const torch::Tensor& t) {
      return t.defined() ? worker::shapeText(t.sizes().vec()) : std::string("(undefined)");
    };
    throw std::invalid_argument(strCat("batchdist::TensorDataset: x and target need the examples "
                                       "first, as many of each; got x of shape ", shape(x_),
                                       " and target of shape ", shape(target_)));
  }
}

Example TensorDataset::get(const std::vector<int64_t>& indices) const {
  const auto idx = torch::tensor(indices, torch::kLong);
  return {x_.index_select(0, idx), target_.index_select(0, idx)};
}

namespace {

/// Note [program data]: a program's Dataset as the loader reads it.
class ProgramExamples final : public worker::ExampleSource {
 public:
  explicit ProgramExamples(std::shared_ptr<const Dataset> d) : d_(std::move(d)) {}
  int64_t size() const override { return d_->size(); }
  std::pair<at::Tensor, at::Tensor> get(const std::vector<int64_t>& indices) const override {
    auto e = d_->get(indices);
    return {std::move(e.x), std::move(e.target)};
  }

 private:
  std::shared_ptr<const Dataset> d_;
};

worker::ProgramData::Part partOf(const std::shared_ptr<const Dataset>& d) {
  worker::ProgramData::Part part;
  if (!d) return part;
  if (const auto* t = dynamic_cast<const TensorDataset*>(d.get())) {
    part.x = t->x();  // gathered like batchdist's in-memory sets
    part.target = t->target();
  } else {
    part.source = std::make_shared<ProgramExamples>(d);
  }
  return part;
}

worker::RunRequest requestOf(const Settings& settings, const RunOptions& options) {
  auto req = launcher::runRequest(settings.file(), settings.entries(), options);
  req.sets_from = worker::SetsFrom::kSettings;
  return req;
}

}  // namespace

worker::Config configOf(const Settings& settings, const std::string& source) {
  try {
    constexpr auto from = worker::SetsFrom::kSettings;
    return settings.file().empty() ? worker::parseConfig("{}", source, settings.entries(), from)
                                   : worker::loadConfig(settings.file(), settings.entries(), from);
  } catch (const Error& e) {
    throw std::invalid_argument(e.what());
  }
}

void invalidArgument(const char* call, const std::string& what) {
  throw std::invalid_argument(strCat(call, ": ", what));
}

worker::Config ownLoopConfig(const char* call, int64_t dataset_size, const Settings& settings) {
  if (dataset_size <= 0) invalidArgument(call, strCat("the data set has ", dataset_size, " samples"));
  auto cfg = configOf(settings, call);
  if (cfg.batch.adapt != worker::BatchAdapt::kOff) {
    invalidArgument(call, "batch.adapt is the launcher's run's alone");
  }
  return cfg;
}

// Note [libstdc++ first]: the guard runs before MPI starts (it may restart the program).
Job::Job(int& argc, char**& argv)
    : impl_((ensureSystemStdlib(), std::make_unique<Impl>(&argc, &argv))) {
  try {
    impl_->faults = worker::faultPlanFromEnvironment([](const char* n) { return std::getenv(n); });
  } catch (const Error& e) {
    std::cerr << strCat(impl_->mpi.tag(), " error: ", e.what(), "\n") << std::flush;
    impl_->faults_code = e.exitCode();
  }
}

Job::~Job() = default;

int Job::rank() const { return impl_->mpi.rank(); }
int Job::size() const { return impl_->mpi.size(); }
int Job::localRank() const { return impl_->mpi.localRank(); }

int Job::train(const Settings& settings, const RunOptions& options) {
  if (impl_->faults_code != 0) return impl_->faults_code;
  auto req = requestOf(settings, options);
  req.faults = impl_->faults;
  return launcher::runTrainJob(std::move(req), impl_->mpi);
}

int Job::run(std::shared_ptr<torch::nn::Module> module, LossFunction loss,
             std::shared_ptr<const Dataset> train_set, std::shared_ptr<const Dataset> val_set,
             const Settings& settings, const RunOptions& options) {
  if (impl_->faults_code != 0) return impl_->faults_code;
  auto req = requestOf(settings, options);
  req.faults = impl_->faults;
  // Every rank checks the same things: a null part fails on all ranks alike.
  const int code = impl_->mpi.agree([&] {
    if (!module) throw ConfigError("batchdist::Job::train: the module is null");
    if (!loss) throw ConfigError("batchdist::Job::train: the loss function is empty");
    if (!train_set && val_set) {
      throw ConfigError("batchdist::Job::train: a validation set without a training set");
    }
    req.program_module = std::make_shared<worker::ProgramModule>(
        std::move(module), [loss = std::move(loss)](torch::nn::Module& m, const at::Tensor& x,
                                                     const at::Tensor& target) {
          auto out = loss(m, x, target);
          return worker::ProgramLoss{std::move(out.value), std::move(out.metrics)};
        });
    req.sets.push_back("model.name=program");
    if (train_set) {
      auto data = std::make_shared<worker::ProgramData>();
      data->train = partOf(train_set);
      data->val = partOf(val_set);
      req.program_data = std::move(data);
      req.sets.push_back("data.name=program");
    }
  });
  if (code != 0) return code;
  return launcher::runTrainJob(std::move(req), impl_->mpi);
}

}  // namespace batchdist
