#pragma once
// Command line: batchdist [train|plan|search|data|slurm|elastic] CONFIG.yaml [options].

#include <string>
#include <vector>

#include "launcher/elastic/options.h"
#include "launcher/slurm_script.h"

namespace batchdist::launcher {

enum class Verb { kTrain, kPlan, kSearch, kSlurm, kData, kElastic };

/// "train", "plan", "search", "slurm", "data", "elastic".
const char* toString(Verb v);

struct CliOptions {
  Verb verb = Verb::kTrain;
  std::string config;
  std::vector<std::string> sets;  ///< --set key.path=value
  std::string report;             ///< --report PATH
  std::string output = "batchdist-out";
  bool quiet = false;
  bool help = false;
  bool version = false;
  int world = 0;      ///< plan: --world N
  bool json = false;  ///< plan, data: --json
  double seconds = 10;  ///< data: --seconds S
  bool float_images = false;  ///< data: --float (time CPU training's float batches)
  bool research = false;
  std::string resume;  ///< --resume auto|PATH (train), or empty
  /// slurm: the job options (--nodes, --gpus-per-node, ...); paths are filled in
  /// by the verb itself.
  SlurmJobSpec slurm;
  /// elastic: the supervisor's options (--hosts, --min-ranks, ...).
  ElasticOptions elastic;
};

/// Parses argv. Throws ConfigError (exit code 2) for unknown options, missing or
/// extra arguments.
CliOptions parseCli(int argc, char** argv);

/// The --help text.
std::string usage();

}  // namespace batchdist::launcher
