#include "launcher/elastic/hosts.h"

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <sstream>

#include "common/error.h"
#include "launcher/slurm_script.h"
#include "worker/common/files.h"

namespace batchdist::launcher::elastic {
namespace {

/// Longest a --hosts-command may run.
constexpr int kHostsCommandSeconds = 60;

/// Note [input files are regular files]: a FIFO waited in open() for ever; a
/// directory read as an empty file ("the host list names no host").
std::string readFile(const std::string& path) {
  return worker::readFileBounded(path, std::uintmax_t{16} << 20, "host file (--hosts)",
                                 "it is read again at every look, so give a regular file (or "
                                 "--hosts-command CMD)");
}

/// Runs a --hosts-command: its stdout (the hosts) and exit status; its stderr to
/// `err` (a warning it prints is not a host line). Every blocking call has a
/// timeout: a command that never ends (or reads the terminal) held the
/// supervisor for ever, before any host was probed.
std::pair<std::string, int> runHostsCommand(const std::string& command, std::string* err) {
  std::error_code ec;
  std::string tmpl = (std::filesystem::temp_directory_path(ec) / "batchdist-hosts-XXXXXX").string();
  const int fd = ::mkstemp(tmpl.data());
  if (fd >= 0) ::close(fd);
  const std::string to = fd >= 0 ? shellQuote(tmpl) : std::string("/dev/null");
  auto result = runCommand(strCat("{ timeout -k 5 ", kHostsCommandSeconds, " sh -c ", shellQuote(command),
                                  " </dev/null 2>", to, "; }"));
  if (fd >= 0) {
    try {
      *err = worker::readFileBounded(tmpl, 1 << 20, "--hosts-command's stderr");
    } catch (const Error&) {  // what it said is only for the message
    }
    ::unlink(tmpl.c_str());
  }
  return result;
}

}  // namespace

std::vector<Host> parseHosts(const std::string& text, const std::string& source, int default_slots) {
  std::vector<Host> hosts;
  std::istringstream in(text);
  std::string line;
  for (int n = 1; std::getline(in, line); ++n) {
    line = line.substr(0, line.find('#'));
    std::istringstream words(line);
    Host h;
    if (!(words >> h.name)) continue;
    h.slots = default_slots;
    for (std::string w; words >> w;) {
      const auto eq = w.find('=');
      const std::string key = w.substr(0, eq);
      if (eq == std::string::npos || (key != "slots" && key != "max_slots")) {
        throw ConfigError(strCat(source, ":", n, ": '", w, "': expected HOST [slots=N]"));
      }
      if (key == "max_slots") continue;  // Open MPI's; the slots are what we use
      const std::string v = w.substr(eq + 1);
      char* end = nullptr;
      const long s = std::strtol(v.c_str(), &end, 10);
      if (v.empty() || *end != '\0' || s < 1 || s > 4096) {
        throw ConfigError(strCat(source, ":", n, ": slots=", v, ": expected a whole number >= 1"));
      }
      h.slots = static_cast<int>(s);
    }
    bool seen = false;
    for (const auto& o : hosts) seen = seen || o.name == h.name;
    if (!seen) hosts.push_back(h);
  }
  return hosts;
}

std::vector<Host> currentHosts(const std::string& file, const std::string& command, int default_slots) {
  if (!file.empty()) return parseHosts(readFile(file), "--hosts " + file, default_slots);
  std::string err;
  const auto [out, status] = runHostsCommand(command, &err);
  if (status != 0) {
    // Bad input on the first look (the supervisor stops); a warning on later ones.
    const std::string said = err.empty() ? out : err;
    throw ConfigError(strCat("--hosts-command '", command, "' ",
                             status == 124 ? strCat("did not finish within ", kHostsCommandSeconds, " s")
                             : status < 0  ? std::string("could not be started")
                                           : strCat("failed (exit status ", status, ")"),
                             said.empty() ? "" : ": " + said.substr(0, 400)));
  }
  return parseHosts(out, "--hosts-command output", default_slots);
}

std::string hostfileText(const std::vector<Host>& hosts) {
  std::string s;
  for (const auto& h : hosts) s += strCat(h.name, " slots=", h.slots, "\n");
  return s;
}

int slotCount(const std::vector<Host>& hosts) {
  int n = 0;
  for (const auto& h : hosts) n += h.slots;
  return n;
}

}  // namespace batchdist::launcher::elastic
