#include "launcher/cli.h"

#include <boost/program_options.hpp>

#include <sstream>

#include "collective/error.h"

namespace po = boost::program_options;

namespace batchdist::launcher {
namespace {

po::options_description describeOptions() {
  po::options_description opts("Options");
  opts.add_options()
      ("help,h", "print this help and exit")
      ("version", "print the version and exit")
      ("set,s", po::value<std::vector<std::string>>()->composing(),
       "override a config key, typed like the YAML: --set batch.global=256 (repeatable)")
      ("report", po::value<std::string>(), "write the JSON run report to PATH (rank 0)")
      ("output,o", po::value<std::string>()->default_value("batchdist-out"),
       "directory for report.json, model.pt and search results")
      ("quiet,q", "no progress output")
      ("world", po::value<int>(), "plan: world size to plan for (default 1)")
      ("json", "plan: print the plan as JSON")
      ("research", "search: ignore the cached search result and measure again");
  return opts;
}

}  // namespace

std::string usage() {
  std::ostringstream os;
  os << "batchdist " << BATCHDIST_VERSION
     << ": distributed data-parallel training over LibTorch c10d that finds the batch size.\n\n"
        "Usage:\n"
        "  mpirun -np N batchdist [train] CONFIG.yaml [options]   train on N ranks\n"
        "  batchdist plan CONFIG.yaml --world N [--json]          print the batch plan, no MPI\n"
        "  mpirun -np N batchdist search CONFIG.yaml              only run the batch search\n\n"
        "Verbs:\n"
        "  train   (default) rendezvous over c10d (NCCL on GPUs, Gloo on CPUs) and train\n"
        "  plan    global/per-GPU batch, accumulation, shards, drop/pad and scaled lr\n"
        "  search  coordinated per-GPU batch search (batch.per_gpu: auto)\n\n"
     << describeOptions()
     << "\nExit codes: 0 success, 1 runtime failure, 2 bad input (config, data, options).\n"
        "Example: mpirun -np 2 batchdist configs/quickstart.yaml --set train.epochs=5\n";
  return os.str();
}

CliOptions parseCli(int argc, char** argv) {
  po::options_description hidden;
  hidden.add_options()("args", po::value<std::vector<std::string>>(), "");
  po::options_description all;
  all.add(describeOptions()).add(hidden);
  po::positional_options_description pos;
  pos.add("args", -1);

  po::variables_map vm;
  try {
    po::store(po::command_line_parser(argc, argv).options(all).positional(pos).run(), vm);
    po::notify(vm);
  } catch (const po::error& e) {
    throw ConfigError(strCat("command line: ", e.what(), "; see batchdist --help"));
  }

  CliOptions o;
  o.help = vm.count("help") > 0;
  o.version = vm.count("version") > 0;
  if (o.help || o.version) return o;
  o.quiet = vm.count("quiet") > 0;
  o.json = vm.count("json") > 0;
  o.research = vm.count("research") > 0;
  if (vm.count("set")) o.sets = vm["set"].as<std::vector<std::string>>();
  if (vm.count("report")) o.report = vm["report"].as<std::string>();
  o.output = vm["output"].as<std::string>();
  if (vm.count("world")) {
    o.world = vm["world"].as<int>();
    if (o.world < 1) throw ConfigError(strCat("command line: --world must be >= 1, got ", o.world));
  }

  std::vector<std::string> args;
  if (vm.count("args")) args = vm["args"].as<std::vector<std::string>>();
  if (!args.empty() && (args[0] == "train" || args[0] == "plan" || args[0] == "search")) {
    o.verb = args[0];
    args.erase(args.begin());
  }
  if (args.empty()) {
    throw ConfigError("command line: missing CONFIG.yaml (e.g. batchdist configs/quickstart.yaml); "
                      "see batchdist --help");
  }
  if (args.size() > 1) {
    throw ConfigError(strCat("command line: unexpected argument '", args[1],
                             "' after the config file; see batchdist --help"));
  }
  o.config = args[0];
  if (o.world > 0 && o.verb != "plan") {
    throw ConfigError("command line: --world is for 'batchdist plan'; under mpirun the world "
                      "size is the number of ranks");
  }
  return o;
}

}  // namespace batchdist::launcher
