#pragma once
// The hosts an elastic job may run on: a host file (one "HOST [slots=N]" per
// line, # comments; Open MPI's hostfile syntax, so the same file serves both)
// or a command that prints one (the sbatch script of `batchdist slurm --elastic`:
// `scontrol show hostnames "$SLURM_JOB_NODELIST"`).

#include <string>
#include <vector>

namespace batchdist::launcher::elastic {

struct Host {
  std::string name;
  int slots = 1;
  bool operator==(const Host& o) const { return name == o.name && slots == o.slots; }
};

/// Parses host-file text; `source` names it in messages. A host named twice
/// keeps its first line. Throws ConfigError with source:line for a bad line
/// ("node1 slots=zero", an unknown key).
std::vector<Host> parseHosts(const std::string& text, const std::string& source, int default_slots);

/// The hosts now: the file read again (Note [input files are regular files]), or
/// the command run again, stdin /dev/null, for at most 60 s (its output parsed).
/// Throws ConfigError naming the file or the command: unreadable, not a regular
/// file, a bad line, or a command that failed or did not finish (with its output).
std::vector<Host> currentHosts(const std::string& file, const std::string& command, int default_slots);

/// Open MPI's hostfile for `hosts`.
std::string hostfileText(const std::vector<Host>& hosts);

/// Sum of the slots.
int slotCount(const std::vector<Host>& hosts);

}  // namespace batchdist::launcher::elastic
