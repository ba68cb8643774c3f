#include "launcher/cli.h"

#include <boost/program_options.hpp>

#include <sstream>

#include "common/error.h"

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
      ("json", "plan, data: print JSON")
      ("seconds", po::value<double>(), "data: how long to run the input pipeline [10]")
      ("float", "data: time the float NCHW normalised batches CPU training gets (default: the "
                "uint8 NHWC batches the pipeline makes, as the CUDA path ships them)")
      ("research", "search: ignore the cached search result and measure again")
      ("resume", po::value<std::string>(),
       "train: continue from a checkpoint: 'auto' (the newest valid one in checkpoint.dir, "
       "else start fresh) or PATH (a step-* checkpoint, or a directory of them)");
  return opts;
}

po::options_description describeSlurmOptions() {
  po::options_description opts("Slurm (batchdist slurm CONFIG.yaml ...; --output DIR holds the "
                               "script, the job logs and one run directory per job id)");
  opts.add_options()
      ("nodes,N", po::value<int>(), "nodes (hosts) for the job [1]")
      ("gpus-per-node", po::value<int>(),
       "GPUs per node, one rank each (required); 0 = a CPU job with --tasks-per-node ranks")
      ("tasks-per-node", po::value<int>(), "CPU jobs: ranks per node")
      ("cpus-per-task", po::value<int>(), "CPU cores per rank (also sets train.threads)")
      ("partition,p", po::value<std::string>(), "Slurm partition [the cluster's default]")
      ("time,t", po::value<std::string>(), "time limit, Slurm's format (e.g. 2:00:00)")
      ("signal-before", po::value<int>(),
       "send SIGUSR1 this many seconds before the time limit, for a clean stop [120, or a "
       "quarter of a shorter limit]")
      ("job-name", po::value<std::string>(), "Slurm job name [batchdist-<config name>]")
      ("launcher", po::value<std::string>(),
       "srun, mpirun or auto: srun --mpi=pmix when `srun --mpi=list` has pmix, else mpirun "
       "[auto]")
      ("interface", po::value<std::string>(),
       "network interface the nodes share, for the rendezvous and Open MPI (e.g. ib0)")
      ("script", po::value<std::string>(), "where to write the script [DIR/<job name>.sbatch]")
      ("submit", "submit the script with sbatch and print the job id")
      ("elastic",
       "run the job under batchdist elastic: a node lost ends the attempt and the job goes on "
       "on the others from its newest checkpoint, the same global batch (mpirun)")
      ("no-requeue",
       "do not requeue a job stopped by the signal before the time limit (by default it "
       "checkpoints, requeues itself and resumes with --resume auto)");
  return opts;
}

po::options_description describeElasticOptions() {
  po::options_description opts("Elastic (batchdist elastic CONFIG.yaml --hosts FILE ...; the "
                               "elastic: section of the config tunes the watching)");
  opts.add_options()
      ("hosts", po::value<std::string>(),
       "the hosts: one 'HOST [slots=N]' per line (Open MPI's hostfile); read again while the "
       "job runs, so a host added to it joins")
      ("hosts-command", po::value<std::string>(),
       "a command that prints the hosts in that form, run at each look (instead of --hosts)")
      ("min-ranks", po::value<int>(), "never run on fewer ranks: wait for hosts, then give up [1]")
      ("max-ranks", po::value<int>(), "never run on more ranks [all slots]")
      ("slots-per-host", po::value<int>(), "ranks on a host whose line has no slots= [1]")
      ("max-restarts", po::value<int>(), "relaunches after failures before giving up [10]")
      ("mpirun", po::value<std::string>(), "the mpirun to run [mpirun]")
      ("mpirun-args", po::value<std::string>(),
       "options for every mpirun, e.g. \"--mca btl_tcp_if_include ib0\"");
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
        "  mpirun -np N batchdist search CONFIG.yaml              only run the batch search\n"
        "  mpirun -np N batchdist data CONFIG.yaml [--seconds S] [--json] [--float]\n"
        "                                                         run the input pipeline alone\n"
        "  batchdist slurm CONFIG.yaml --nodes N --gpus-per-node G [--partition P] [--time T]\n"
        "                  [--submit]                             write (and submit) an sbatch script\n"
        "  batchdist elastic CONFIG.yaml --hosts FILE [--min-ranks N] [--max-restarts R]\n"
        "                                                         run it, surviving lost hosts\n\n"
        "Verbs:\n"
        "  train   (default) rendezvous over c10d (NCCL on GPUs, Gloo on CPUs) and train\n"
        "  plan    global/per-GPU batch, accumulation, shards, drop/pad and scaled lr\n"
        "  search  coordinated per-GPU batch search (batch.per_gpu: auto)\n"
        "  data    the input pipeline alone, no model, on every rank: samples/s per rank and\n"
        "          in total, the time split (read, decode, transform, wait), bytes/s, threads;\n"
        "          uint8 NHWC batches (--float: the float NCHW ones CPU training gets)\n"
        "  slurm   an sbatch script for this config: nodes, one rank per GPU, time limit,\n"
        "          SIGUSR1 before it for a clean stop, srun --mpi=pmix or mpirun\n"
        "  elastic runs mpirun on the hosts that answer; a lost host (a rank killed, silent\n"
        "          or hung) ends the attempt, and the job resumes from its newest checkpoint\n"
        "          on the largest world with an equal split of the same global batch; it\n"
        "          grows back when hosts return (docs/elastic.md)\n\n"
     << describeOptions() << "\n"
     << describeSlurmOptions() << "\n"
     << describeElasticOptions()
     << "\nExit codes: 0 success, 1 runtime failure, 2 bad input (config, data, options).\n"
        "Example: mpirun -np 2 batchdist configs/quickstart.yaml --set train.epochs=5\n"
        "         batchdist slurm train.yaml --nodes 2 --gpus-per-node 8 --time 4:00:00 --submit\n";
  return os.str();
}

const char* toString(Verb v) {
  switch (v) {
    case Verb::kTrain: return "train";
    case Verb::kPlan: return "plan";
    case Verb::kSearch: return "search";
    case Verb::kSlurm: return "slurm";
    case Verb::kData: return "data";
    case Verb::kElastic: return "elastic";
  }
  return "?";
}

namespace {

/// An integer option that must be >= 1 (`unit` names what it counts, for the message).
int atLeastOne(const po::variables_map& vm, const char* name, const char* unit = "") {
  const int v = vm[name].as<int>();
  if (v < 1) throw ConfigError(strCat("command line: --", name, " must be >= 1", unit, ", got ", v));
  return v;
}

/// The positional arguments: an optional verb, then exactly one config file.
void readVerbAndConfig(const po::variables_map& vm, CliOptions& o) {
  std::vector<std::string> args;
  if (vm.count("args")) args = vm["args"].as<std::vector<std::string>>();
  if (!args.empty()) {
    for (Verb v : {Verb::kTrain, Verb::kPlan, Verb::kSearch, Verb::kSlurm, Verb::kData, Verb::kElastic}) {
      if (args[0] == toString(v)) {
        o.verb = v;
        args.erase(args.begin());
        break;
      }
    }
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
}

/// The options of `batchdist slurm`; refused for the other verbs.
void readSlurmOptions(const po::variables_map& vm, CliOptions& o) {
  const auto slurm_opts = describeSlurmOptions();
  for (const auto& opt : slurm_opts.options()) {
    const std::string name = opt->long_name();
    if (vm.count(name) && o.verb != Verb::kSlurm) {
      throw ConfigError(strCat("command line: --", name, " is for 'batchdist slurm' (",
                               toString(o.verb), " runs under the launcher you started it with); "
                               "see batchdist --help"));
    }
  }
  if (o.verb != Verb::kSlurm) return;
  auto& j = o.slurm;
  if (vm.count("nodes")) j.nodes = vm["nodes"].as<int>();
  if (vm.count("gpus-per-node")) j.gpus_per_node = vm["gpus-per-node"].as<int>();
  if (vm.count("tasks-per-node")) j.tasks_per_node = atLeastOne(vm, "tasks-per-node");
  if (vm.count("cpus-per-task")) j.cpus_per_task = atLeastOne(vm, "cpus-per-task");
  if (vm.count("partition")) j.partition = vm["partition"].as<std::string>();
  if (vm.count("time")) j.time = vm["time"].as<std::string>();
  if (vm.count("signal-before")) j.signal_before_s = atLeastOne(vm, "signal-before", " second");
  if (vm.count("job-name")) j.job_name = vm["job-name"].as<std::string>();
  if (vm.count("launcher")) j.launcher = vm["launcher"].as<std::string>();
  if (vm.count("interface")) j.interface = vm["interface"].as<std::string>();
  if (vm.count("script")) j.script = vm["script"].as<std::string>();
  j.submit = vm.count("submit") > 0;
  j.requeue = vm.count("no-requeue") == 0;
  j.elastic = vm.count("elastic") > 0;
}

/// The options of `batchdist elastic`; refused for the other verbs.
void readElasticOptions(const po::variables_map& vm, CliOptions& o) {
  const auto elastic_opts = describeElasticOptions();  // options() refers into it
  for (const auto& opt : elastic_opts.options()) {
    const std::string name = opt->long_name();
    if (vm.count(name) && o.verb != Verb::kElastic) {
      throw ConfigError(strCat("command line: --", name, " is for 'batchdist elastic'; see batchdist --help"));
    }
  }
  if (o.verb != Verb::kElastic) return;
  auto& e = o.elastic;
  if (vm.count("hosts")) e.hosts_file = vm["hosts"].as<std::string>();
  if (vm.count("hosts-command")) e.hosts_command = vm["hosts-command"].as<std::string>();
  if (e.hosts_file.empty() == e.hosts_command.empty()) {
    throw ConfigError("command line: batchdist elastic needs the hosts: --hosts FILE or "
                      "--hosts-command CMD (one of them)");
  }
  if (vm.count("min-ranks")) e.min_ranks = atLeastOne(vm, "min-ranks");
  if (vm.count("max-ranks")) e.max_ranks = atLeastOne(vm, "max-ranks");
  if (vm.count("slots-per-host")) e.slots_per_host = atLeastOne(vm, "slots-per-host");
  if (vm.count("max-restarts")) {
    e.max_restarts = vm["max-restarts"].as<int>();
    if (e.max_restarts < 0) {
      throw ConfigError(strCat("command line: --max-restarts must be >= 0, got ", e.max_restarts));
    }
  }
  if (e.max_ranks > 0 && e.max_ranks < e.min_ranks) {
    throw ConfigError(strCat("command line: --max-ranks ", e.max_ranks, " is below --min-ranks ",
                             e.min_ranks));
  }
  if (vm.count("mpirun")) e.mpirun = vm["mpirun"].as<std::string>();
  if (vm.count("mpirun-args")) e.mpirun_args = vm["mpirun-args"].as<std::string>();
}

}  // namespace

CliOptions parseCli(int argc, char** argv) {
  po::options_description hidden;
  hidden.add_options()("args", po::value<std::vector<std::string>>(), "");
  po::options_description all;
  all.add(describeOptions()).add(describeSlurmOptions()).add(describeElasticOptions()).add(hidden);
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
  if (vm.count("resume")) {
    o.resume = vm["resume"].as<std::string>();
    if (o.resume.empty()) {
      throw ConfigError("command line: --resume needs 'auto' or a checkpoint PATH");
    }
  }
  o.output = vm["output"].as<std::string>();
  if (vm.count("world")) o.world = atLeastOne(vm, "world");
  readVerbAndConfig(vm, o);
  if (!o.resume.empty() && o.verb != Verb::kTrain && o.verb != Verb::kElastic) {
    throw ConfigError(strCat("command line: --resume is for 'batchdist train' (not ",
                             toString(o.verb), ")"));
  }
  if (o.world > 0 && o.verb != Verb::kPlan) {
    throw ConfigError("command line: --world is for 'batchdist plan'; under mpirun the world "
                      "size is the number of ranks");
  }
  if (vm.count("seconds")) {
    if (o.verb != Verb::kData) throw ConfigError("command line: --seconds is for 'batchdist data'");
    o.seconds = vm["seconds"].as<double>();
    if (!(o.seconds > 0 && o.seconds <= 86400)) {
      throw ConfigError(strCat("command line: --seconds must be in (0, 86400], got ", o.seconds));
    }
  }
  if (vm.count("float")) {
    if (o.verb != Verb::kData) throw ConfigError("command line: --float is for 'batchdist data'");
    o.float_images = true;
  }
  if (o.json && o.verb != Verb::kPlan && o.verb != Verb::kData) {
    throw ConfigError("command line: --json is for 'batchdist plan' and 'batchdist data'");
  }
  if (o.json && o.verb == Verb::kData) o.quiet = true;  // stdout is the JSON alone
  readSlurmOptions(vm, o);
  readElasticOptions(vm, o);
  return o;
}

}  // namespace batchdist::launcher
