// batchdist: main(). Parses the command line, opens the MPI scope, and turns
// every failure into one clear message and a non-zero exit of the whole job.

#include <torch/torch.h>
#include <unistd.h>

#include <filesystem>
#include <iostream>
#include <thread>

#include "collective/error.h"
#include "collective/process_group.h"
#include "collective/rendezvous.h"
#include "collective/torch_compat.h"
#include "launcher/cli.h"
#include "launcher/mpi_scope.h"
#include "worker/config.h"
#include "worker/data.h"
#include "worker/json.h"
#include "worker/model.h"
#include "worker/plan.h"
#include "worker/report.h"
#include "worker/trainer.h"

namespace batchdist::launcher {
namespace {

std::string dirOf(const std::string& path) {
  const auto p = std::filesystem::path(path).parent_path();
  return p.empty() ? "." : p.string();
}

/// Local rank -> device. CUDA ranks bind to GPU = local rank.
at::Device pickDevice(const worker::Config& cfg, const MpiScope& mpi) {
  const std::string& want = cfg.train.device;
  const bool have_cuda = torch::cuda::is_available();
  if (want == "cpu" || (want == "auto" && !have_cuda)) return at::kCPU;
  if (!have_cuda) {
    throw ConfigError(strCat(cfg.source, ": train.device: cuda, but no CUDA device is visible on ",
                             mpi.host(),
#if defined(BATCHDIST_WITH_CUDA)
                             " (check CUDA_VISIBLE_DEVICES and the driver)"
#else
                             " (this batchdist was built against a CPU-only LibTorch)"
#endif
                             ));
  }
  const int gpus = static_cast<int>(torch::cuda::device_count());
  if (mpi.localSize() > gpus) {
    throw ConfigError(strCat("host ", mpi.host(), " runs ", mpi.localSize(),
                             " ranks but has only ", gpus,
                             " visible GPU(s); start at most one rank per GPU (or set "
                             "train.device: cpu)"));
  }
  return at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(mpi.localRank()));
}

int runPlan(const CliOptions& cli) {
  try {
    const auto cfg = worker::loadConfig(cli.config, cli.sets);
    const auto info = worker::describeData(cfg.data, cfg.train.seed, dirOf(cli.config));
    const auto plan = worker::makePlan(cfg, std::max(1, cli.world), info.train_size,
                                       worker::modelHasBatchNorm(cfg.model));
    std::cout << (cli.json ? worker::planJson(plan) + "\n" : worker::planText(plan));
    return 0;
  } catch (const Error& e) {
    if (cli.json) std::cout << worker::json::Object().add("error", e.what()).str() << "\n";
    std::cerr << "batchdist: error: " << e.what() << std::endl;
    return e.exitCode();
  }
}

int runTrain(const CliOptions& cli, MpiScope& mpi) {
  const bool lead = mpi.rank() == 0;
  worker::Config cfg;
  worker::DataSplit data;
  worker::Plan plan;
  at::Device device = at::kCPU;
  // Local, deterministic set-up: every rank fails the same way, so they agree and
  // exit together without an abort.
  const int code = mpi.agree([&] {
    cfg = worker::loadConfig(cli.config, cli.sets);
    device = pickDevice(cfg, mpi);
    data = worker::loadData(cfg.data, cfg.train.seed, dirOf(cli.config));
    plan = worker::makePlan(cfg, mpi.size(), data.train.size(),
                            worker::modelHasBatchNorm(cfg.model));
  });
  if (code != 0) return code;

  try {
    const int threads = cfg.train.threads > 0
                            ? static_cast<int>(cfg.train.threads)
                            : std::max(1, static_cast<int>(std::thread::hardware_concurrency()) /
                                              mpi.localSize());
    torch::set_num_threads(threads);
    if (device.is_cuda()) compat::setCudaDevice(device.index());

    const auto timeout = std::chrono::milliseconds(static_cast<int64_t>(cfg.dist.timeout_s * 1000));
    collective::RendezvousOptions ro;
    ro.interface = cfg.dist.interface;
    ro.timeout = timeout;
    ro.all_ranks_local = mpi.hostCount() == 1;
    const auto rv = collective::rendezvousOverMpi(MPI_COMM_WORLD, ro);
    collective::BackendOptions bo;
    bo.backend = cfg.dist.backend;
    bo.device = device;
    bo.timeout = timeout;
    bo.interface = rv.interface;
    bo.address = rv.address;
    auto comm = collective::createCommunicator(rv.store, mpi.rank(), mpi.size(), bo);

    worker::Console console(lead && !cli.quiet, isatty(STDOUT_FILENO) != 0);
    console.line(strCat("batchdist ", BATCHDIST_VERSION, ": ", mpi.size(), " rank(s) on ",
                        mpi.hostCount(), " host(s), backend ", comm->backendName(), ", device ",
                        device.str(), ", torch ", compat::torchVersion(), ", ", threads,
                        " thread(s)/rank, store ", rv.store_address));
    console.line(strCat("data: ", data.origin, " -> ", data.train.size(), " train / ",
                        data.val.size(), " validation samples"));
    if (console.enabled()) std::cout << worker::planText(plan) << std::flush;

    worker::Trainer trainer(cfg, *comm, data, device, plan);
    const auto result = trainer.train(console);

    if (lead) {
      namespace fs = std::filesystem;
      fs::create_directories(cli.output);
      const std::string model_path = (fs::path(cli.output) / "model.pt").string();
      torch::save(trainer.model(), model_path + ".tmp");
      fs::rename(model_path + ".tmp", model_path);
      worker::RunInfo info;
      info.world_size = mpi.size();
      info.backend = comm->backendName();
      info.device = device.str();
      info.torch_version = compat::torchVersion();
      info.data_origin = data.origin;
      info.extra_json = strCat("\"hosts\": ", mpi.hostCount(), ", \"model_path\": ",
                               worker::json::quote(model_path));
      const auto report = worker::runReport(cfg, plan, result, info);
      worker::writeFileAtomic((fs::path(cli.output) / "report.json").string(), report);
      if (!cli.report.empty()) worker::writeFileAtomic(cli.report, report);
      console.line(strCat("done: ", result.steps, " steps, eval accuracy ",
                          worker::formatFixed(100.0 * result.eval_accuracy, 2), " %, ",
                          static_cast<int64_t>(result.samples_per_s), " samples/s, ",
                          worker::formatDuration(result.wall_s), "; wrote ", cli.output,
                          "/report.json and model.pt"));
    }
    comm->barrier();
  } catch (const Error& e) {
    std::cerr << mpi.tag() << " error: " << e.what() << std::endl;
    mpi.abort(e.exitCode());
  } catch (const std::exception& e) {
    std::string what = e.what();
    std::cerr << mpi.tag() << " error: " << what.substr(0, what.find("\nException raised from"))
              << std::endl;
    mpi.abort(1);
  }
  return 0;
}

}  // namespace
}  // namespace batchdist::launcher

int main(int argc, char** argv) {
  using namespace batchdist;
  launcher::CliOptions cli;
  try {
    cli = launcher::parseCli(argc, argv);
  } catch (const Error& e) {
    std::cerr << "batchdist: error: " << e.what() << std::endl;
    return e.exitCode();
  }
  if (cli.help) {
    std::cout << launcher::usage();
    return 0;
  }
  if (cli.version) {
    std::cout << "batchdist " << BATCHDIST_VERSION << " (torch " << compat::torchVersion()
              << ", backends:";
    for (const auto& b : collective::availableBackends()) std::cout << " " << b;
    std::cout << ")\n";
    return 0;
  }
  if (cli.verb == "plan") return launcher::runPlan(cli);
  launcher::MpiScope mpi(&argc, &argv);
  if (cli.verb == "search") {
    if (mpi.rank() == 0) std::cerr << "batchdist: error: 'search' is not implemented yet\n";
    return 2;
  }
  return launcher::runTrain(cli, mpi);
}
