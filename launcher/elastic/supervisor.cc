// Note [elastic supervisor]: the attempt loop.
#include "launcher/elastic/supervisor.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <iostream>
#include <mutex>
#include <regex>
#include <sstream>

#include <nlohmann/json.hpp>

#include "common/error.h"
#include "launcher/elastic/hosts.h"
#include "launcher/elastic/monitor.h"
#include "launcher/elastic/probe.h"
#include "worker/common/console.h"
#include "worker/common/files.h"
#include "worker/common/util.h"
#include "worker/config/config.h"
#include "worker/model/model.h"
#include "worker/plan/elastic.h"

namespace batchdist::launcher {
namespace {

namespace fs = std::filesystem;
using elastic::Beat;
using elastic::Child;
using elastic::Host;
using elastic::Monitor;
using elastic::Probe;
using elastic::Verdict;
using worker::monotonicSeconds;

std::atomic<int> g_signal{0};

void onSignal(int sig) { g_signal = sig; }

/// A host the supervisor knows, and whether it may run ranks now.
struct HostState {
  Host host;
  bool listed = true;          ///< still in the host list
  bool available = false;      ///< answered, not lost
  bool probed = false;         ///< answered or failed a probe at least once
  double lost_at = -1;         ///< when it was lost (-1: never)
  double answering_since = -1; ///< lost: since when its probes succeed
  double next_probe = 0;
  std::string why_lost;
  std::unique_ptr<Probe> probe;
};

/// One launch of the job, for the console and report.json's `elastic`.
struct AttemptRecord {
  int number = 0;
  int world = 0;
  std::vector<std::string> hosts;  ///< by rank order, one entry per host
  int64_t per_gpu = 0, accum = 0, global = 0;
  std::string split;  ///< elasticSplit's why
  double launched_s = 0, first_step_s = -1, ended_s = 0;
  int64_t start_step = -1, last_step = -1, checkpoint = -1, lost_steps = -1;
  std::string cause;  ///< how it ended
  std::vector<std::string> lost_hosts;
  double detected_after_s = -1;  ///< failure: from the last sign of life to the decision
  bool planned = false;

  nlohmann::ordered_json json() const {
    return {{"attempt", number}, {"world", world}, {"hosts", hosts}, {"per_gpu", per_gpu},
            {"accum", accum}, {"global", global}, {"split", split}, {"launched_s", launched_s},
            {"first_step_s", first_step_s}, {"ended_s", ended_s}, {"start_step", start_step},
            {"last_step", last_step}, {"checkpoint", checkpoint}, {"lost_steps", lost_steps},
            {"cause", cause}, {"lost_hosts", lost_hosts}, {"detected_after_s", detected_after_s},
            {"planned", planned}};
  }
};

/// How an attempt ended.
enum class Ending { kFinished, kPlanned, kFailed, kBadInput, kNoJob, kStopped };

/// The world of the next launch: which hosts, how many ranks each, the split.
struct Launch {
  std::vector<Host> hosts;  ///< slots = ranks on it
  int world = 0;
  worker::ElasticSplit split;  ///< world 0: the config's own batch (G not known yet)
};

struct AttemptState;

class Supervisor {
 public:
  Supervisor(const CliOptions& cli, worker::Config cfg) : cli_(cli), opt_(cli.elastic), cfg_(std::move(cfg)) {}
  int run();

 private:
  int attempts();  ///< the attempt loop: relaunch until finished, stopped or given up
  void say(const std::string& line) const { std::cout << "elastic: " << line << std::endl; }
  double now() const { return monotonicSeconds() - t0_; }
  void setUp();
  void openSocket();
  void refreshHosts();
  void serviceProbes(bool everyone);
  void probeAll();
  std::string noHostText() const;
  void checkArgsWhereNoHostAnswers();
  std::string argsRefusedText(const std::string& host) const;
  std::optional<Launch> nextLaunch(bool quiet);
  std::optional<Launch> waitForLaunch();
  int64_t maxFit();
  Ending runAttempt(const Launch& l, AttemptRecord& rec);
  void beginAttempt(AttemptState& a);
  void noteProgress(AttemptState& a);
  Ending onExit(AttemptState& a, int status);
  bool jobRan(const AttemptState& a) const;
  Ending onVerdict(AttemptState& a, const Verdict& v, Child& child);
  void lookAround(AttemptState& a, Child& child);
  std::vector<std::string> attemptArgv(const Launch& l, int number);
  void receiveBeats(Monitor* mon, double wait_s);
  bool growthPossible(const Launch& l);
  void loseHosts(const std::vector<int>& ranks, const std::vector<std::string>& rank_hosts,
                 const std::string& why, AttemptRecord& rec);
  void drainAttempt(int number, const std::vector<std::string>& rank_hosts);
  int finish(int code, const std::string& why);
  std::string lostHostsText() const;

  const CliOptions& cli_;
  const ElasticOptions& opt_;
  worker::Config cfg_;
  double t0_ = monotonicSeconds();
  std::vector<HostState> hosts_;
  std::vector<std::string> mpirun_;  ///< mpirun and --mpirun-args
  std::string binary_;
  std::string address_;
  int port_ = 0;
  int sock_ = -1;
  bool has_bn_ = false;
  std::vector<AttemptRecord> attempts_;
  int64_t known_global_ = 0, known_fit_ = 0;
  int64_t search_fit_ = -1;  ///< the largest fit in search.json; -1 until read
  double last_refresh_ = -1;
  double last_list_warning_ = -1000;
  double last_beat_ = -1;  ///< any beat of the current attempt
};

int Supervisor::run() {
  try {
    setUp();
    return attempts();
  } catch (const Error& e) {
    std::cerr << "batchdist elastic: error: " << e.what() << std::endl;
    return e.exitCode();
  } catch (const std::exception& e) {  // the file system: no room, no permission; fork
    std::cerr << "batchdist elastic: error: " << e.what() << std::endl;
    return 1;
  }
}

int Supervisor::attempts() {
  int restarts = 0;
  for (int number = 1;; ++number) {
    const auto launch = waitForLaunch();
    if (g_signal.load() != 0) {  // asked to stop between attempts: nothing runs
      return finish(128 + g_signal.load(), strCat("stopped by SIG", sigabbrev_np(g_signal.load()),
                                                  " between attempts"));
    }
    if (!launch) {
      return finish(1, strCat("fewer than --min-ranks ", opt_.min_ranks, " rank(s) for ",
                              cfg_.elastic.wait_s, " s (elastic.wait_s)"));
    }
    AttemptRecord rec;
    rec.number = number;
    const Ending ending = runAttempt(*launch, rec);
    attempts_.push_back(rec);
    if (ending == Ending::kFinished) return finish(0, "");
    if (ending == Ending::kBadInput) return finish(2, "the job's own error (exit 2: bad input), not a lost host");
    if (ending == Ending::kNoJob) return finish(2, rec.cause);
    if (ending == Ending::kStopped) return finish(128 + g_signal.load(), strCat("stopped by SIG", sigabbrev_np(g_signal.load())));
    if (ending == Ending::kFailed && ++restarts > opt_.max_restarts) {
      return finish(1, strCat("--max-restarts ", opt_.max_restarts, " reached"));
    }
  }
}

void Supervisor::setUp() {
  struct sigaction sa {};
  sa.sa_handler = onSignal;
  sigemptyset(&sa.sa_mask);
  for (int sig : {SIGTERM, SIGINT, SIGUSR1}) sigaction(sig, &sa, nullptr);
  signal(SIGPIPE, SIG_IGN);
  binary_ = fs::read_symlink("/proc/self/exe").string();
  elastic::checkMpirun(opt_.mpirun, cfg_.elastic.probe_timeout_s);  // Note [launcher checked first]
  mpirun_.push_back(opt_.mpirun);
  std::istringstream extra(opt_.mpirun_args);
  for (std::string w; extra >> w;) mpirun_.push_back(w);
  has_bn_ = worker::modelHasBatchNorm(cfg_.model, cfg_.base_dir);
  if (!cfg_.batch.global_auto && cfg_.batch.global > 0) known_global_ = cfg_.batch.global;
  if (!cfg_.batch.per_gpu_auto) known_fit_ = cfg_.batch.per_gpu;
  fs::create_directories(fs::path(cli_.output) / "elastic");
  refreshHosts();
  if (hosts_.empty()) throw ConfigError(noHostText());
  std::vector<std::string> names;
  for (const auto& h : hosts_) names.push_back(h.host.name);
  const char* ifname = std::getenv("BATCHDIST_IFNAME");
  address_ = elastic::heartbeatAddress(cfg_.dist.interface.empty() && ifname ? ifname : cfg_.dist.interface, names);
  openSocket();
  say(strCat(hosts_.size(), " host(s) listed, ", elastic::slotCount([&] {
               std::vector<Host> v;
               for (const auto& h : hosts_) v.push_back(h.host);
               return v;
             }()), " slot(s); heartbeats to ", address_, ":", port_, " every ", cfg_.elastic.heartbeat_s,
             " s, lost after ", cfg_.elastic.heartbeat_timeout_s, " s of silence"));
  probeAll();
  checkArgsWhereNoHostAnswers();
}

/// The first look found no host: "the host list names no host" said neither which
/// list nor why (a directory read as an empty file).
std::string Supervisor::noHostText() const {
  if (!opt_.hosts_file.empty()) {
    return strCat("--hosts ", opt_.hosts_file, " names no host (it is empty, or holds only "
                  "comments): list one 'HOST [slots=N]' per line");
  }
  return strCat("--hosts-command '", opt_.hosts_command, "' printed no host: it should print "
                "one 'HOST [slots=N]' per line");
}

/// Note [launcher checked first]: no host answered the first probes. When mpirun
/// starts a process on one of them without --mpirun-args (keeping only
/// --allow-run-as-root, which root needs), the options are what it refuses on
/// every host: bad input, said at once, not elastic.wait_s spent waiting.
void Supervisor::checkArgsWhereNoHostAnswers() {
  if (mpirun_.size() == 1) return;
  std::vector<std::unique_ptr<Probe>> plain;
  std::vector<std::string> argv{opt_.mpirun};
  for (const auto& a : mpirun_) {
    if (a == "--allow-run-as-root") argv.push_back(a);
  }
  for (const auto& h : hosts_) {
    if (h.available) return;
    if (h.listed) plain.push_back(std::make_unique<Probe>(h.host.name, argv, cfg_.elastic.probe_timeout_s, now()));
  }
  for (std::size_t done = 0; done < plain.size();) {
    receiveBeats(nullptr, 0.05);
    done = 0;
    for (auto& p : plain) {
      const auto r = p->result(now());
      if (r && *r) throw ConfigError(argsRefusedText(p->host()));
      done += r.has_value();
    }
  }
}

std::string Supervisor::argsRefusedText(const std::string& host) const {
  std::string refused;
  for (const auto& h : hosts_) {
    if (h.host.name == host) refused = h.why_lost;
  }
  return strCat("--mpirun-args '", opt_.mpirun_args, "': mpirun refuses to start with them on every "
                "host (", host, ": ", refused, "), and starts a process on ", host, " without them: "
                "correct them, or leave them out");
}

void Supervisor::openSocket() {
  sock_ = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_ANY);
  socklen_t len = sizeof a;
  if (sock_ < 0 || bind(sock_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
      getsockname(sock_, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    throw Error(strCat("cannot open the heartbeat socket: ", std::strerror(errno)));
  }
  port_ = ntohs(a.sin_port);
}

void Supervisor::refreshHosts() {
  const bool first = last_refresh_ < 0;
  last_refresh_ = now();
  std::vector<Host> list;
  try {
    list = elastic::currentHosts(opt_.hosts_file, opt_.hosts_command, opt_.slots_per_host);
  } catch (const Error& e) {
    if (first) throw;
    // A list being rewritten, or a command that failed once: keep the last one.
    if (now() - last_list_warning_ > 60) say(strCat("warning: ", e.what(), "; keeping the last host list"));
    last_list_warning_ = now();
    return;
  }
  for (auto& h : hosts_) h.listed = false;
  for (const auto& l : list) {
    auto it = std::find_if(hosts_.begin(), hosts_.end(), [&](const HostState& h) { return h.host.name == l.name; });
    if (it == hosts_.end()) {
      HostState h;
      h.host = l;
      hosts_.push_back(std::move(h));
      if (!first) say(strCat("host ", l.name, " joined the host list"));
      continue;
    }
    it->host.slots = l.slots;
    it->listed = true;
  }
}

/// Starts the probes that are due and reads the ones that finished; `everyone`:
/// every listed host now (before a launch after a failure).
void Supervisor::serviceProbes(bool everyone) {
  const double t = now();
  for (auto& h : hosts_) {
    if (!h.listed) continue;
    const bool due = everyone || !h.probed || (!h.available && t >= h.next_probe);
    if (!h.probe && due) {
      h.probe = std::make_unique<Probe>(h.host.name, mpirun_, cfg_.elastic.probe_timeout_s, t);
    }
    if (!h.probe) continue;
    const auto r = h.probe->result(t);
    if (!r) continue;
    const bool first = !h.probed;
    h.probed = true;
    h.next_probe = t + std::max(1.0, std::min(5.0, cfg_.elastic.readmit_s / 4));
    if (!*r) {
      if (h.available || first) say(strCat("host ", h.host.name, " ", h.probe->why(), ": not used"));
      if (h.available) h.lost_at = t;
      h.available = false;
      h.answering_since = -1;
      h.why_lost = h.probe->why();
    } else if (h.lost_at < 0) {
      h.available = true;  // never lost: usable at once
    } else if (!h.available) {
      if (h.answering_since < 0) h.answering_since = t;
      if (t - h.answering_since >= cfg_.elastic.readmit_s) {
        h.available = true;
        say(strCat("host ", h.host.name, " has answered for ", static_cast<int>(t - h.answering_since),
                   " s (elastic.readmit_s ", cfg_.elastic.readmit_s, "): it may rejoin"));
      }
    }
    h.probe.reset();
  }
}

/// Probes every listed host and waits for the answers of those a launch would
/// use (and, the first time, of every host); a lost host's probe goes on in the
/// background and is read by later looks.
void Supervisor::probeAll() {
  serviceProbes(true);
  const auto pending = [](const HostState& h) {
    return h.probe != nullptr && (h.available || !h.probed);
  };
  while (std::any_of(hosts_.begin(), hosts_.end(), pending)) {
    receiveBeats(nullptr, 0.05);
    serviceProbes(false);
  }
}

int64_t Supervisor::maxFit() {
  // The search's candidates that fit: memory is per rank, so they fit at any
  // world. search.json is the first attempt's (later ones are given their batch):
  // read once it is there, not at every look.
  if (search_fit_ < 0) {
    try {
      // Note [input files are regular files]: a FIFO left there blocked every look.
      const auto path = (fs::path(cli_.output) / "search.json").string();
      if (fs::exists(path)) {
        const auto j = nlohmann::json::parse(worker::readFileBounded(path, 64 << 20, "search.json"));
        int64_t fit = 0;
        for (const auto& c : j.value("candidates", nlohmann::json::array())) {
          if (!c.value("failed", true)) fit = std::max(fit, c.value("per_gpu_batch", int64_t{0}));
        }
        search_fit_ = fit;
      }
    } catch (const std::exception&) {  // unreadable (being written): the run's own batch is still known
    }
  }
  return std::max(known_fit_, search_fit_);
}

std::optional<Launch> Supervisor::nextLaunch(bool quiet) {
  Launch l;
  int slots = 0;
  for (const auto& h : hosts_) {
    if (h.listed && h.available) slots += h.host.slots;
  }
  const int top = opt_.max_ranks > 0 ? std::min(slots, opt_.max_ranks) : slots;
  l.world = top;
  const int64_t fit = maxFit();
  if (known_global_ > 0 && fit > 0) {
    worker::ElasticSlots in;
    in.global = known_global_;
    in.slots = slots;
    in.min_ranks = opt_.min_ranks;
    in.max_ranks = opt_.max_ranks;
    in.max_fit = std::max(fit, int64_t{has_bn_ ? 2 : 1});
    in.min_per_gpu = has_bn_ ? 2 : 1;
    l.split = worker::elasticSplit(in);
    if (!quiet) {
      for (const auto& p : l.split.passed_over) say("passed over " + p);
    }
    l.world = static_cast<int>(l.split.world);
  } else if (known_global_ > 0 && cfg_.batch.per_gpu_auto) {
    // The first launch of a searched batch: the largest world that divides G.
    while (l.world > 0 && known_global_ % l.world != 0) --l.world;
  }
  if (l.world < opt_.min_ranks || l.world == 0) return std::nullopt;
  int left = l.world;
  for (const auto& h : hosts_) {
    if (!h.listed || !h.available || left == 0) continue;
    Host used = h.host;
    used.slots = std::min(used.slots, left);
    left -= used.slots;
    l.hosts.push_back(used);
  }
  return l;
}

std::optional<Launch> Supervisor::waitForLaunch() {
  const double start = now();
  bool said = false;
  for (;;) {
    if (auto l = nextLaunch(said)) return l;
    if (!said) {
      say(strCat("waiting up to ", cfg_.elastic.wait_s, " s (elastic.wait_s) for hosts: ",
                 lostHostsText()));
      said = true;
    }
    if (now() - start >= cfg_.elastic.wait_s || g_signal.load() != 0) return std::nullopt;
    receiveBeats(nullptr, 0.2);
    if (now() - last_refresh_ > 1) refreshHosts();
    serviceProbes(false);
  }
}

std::vector<std::string> Supervisor::attemptArgv(const Launch& l, int number) {
  const std::string hostfile = (fs::path(cli_.output) / "elastic" / strCat("attempt-", number, ".hosts")).string();
  worker::writeFileAtomic(hostfile, elastic::hostfileText(l.hosts));
  auto argv = mpirun_;
  for (const char* a : {"-x", "BATCHDIST_HEARTBEAT", "-x", "BATCHDIST_ATTEMPT", "-x", "BATCHDIST_HEARTBEAT_S",
                        "--map-by", "slot"}) {
    argv.emplace_back(a);
  }
  argv.insert(argv.end(), {"-np", std::to_string(l.world), "--hostfile", hostfile, binary_, cli_.config,
                           "--output", cli_.output});
  if (cli_.quiet) argv.emplace_back("--quiet");
  for (const auto& s : cli_.sets) argv.insert(argv.end(), {"--set", s});
  // Lost work is bounded by the checkpoint interval: unless the config sets one in
  // steps, as often as costs at most 1 % of the time (Note [checkpoint interval]).
  if (cfg_.checkpoint.every_steps == 0 && !cfg_.checkpoint.every_steps_auto) {
    argv.insert(argv.end(), {"--set", "checkpoint.every_steps=auto"});
  }
  if (l.split.world > 0) {
    argv.insert(argv.end(), {"--set", strCat("batch.global=", known_global_), "--set",
                             strCat("batch.per_gpu=", l.split.per_gpu), "--set",
                             strCat("batch.accum=", l.split.accum)});
  }
  // Every relaunch continues from the newest checkpoint; the first as asked.
  const std::string resume = number > 1 ? "auto" : cli_.resume;
  if (!resume.empty()) argv.insert(argv.end(), {"--resume", resume});
  return argv;
}

void Supervisor::receiveBeats(Monitor* mon, double wait_s) {
  pollfd p{sock_, POLLIN, 0};
  if (poll(&p, 1, static_cast<int>(wait_s * 1000)) <= 0) return;
  char buf[512];
  for (;;) {
    const ssize_t n = recv(sock_, buf, sizeof buf - 1, MSG_DONTWAIT);
    if (n <= 0) return;
    const auto beat = elastic::parseBeat(std::string(buf, static_cast<size_t>(n)));
    if (!beat || mon == nullptr) continue;
    last_beat_ = now();
    mon->record(*beat, now());
  }
}

/// Whether the hosts now give a larger world than `l`'s, or `l` uses a host that left the list.
bool Supervisor::growthPossible(const Launch& l) {
  for (const auto& used : l.hosts) {
    for (const auto& h : hosts_) {
      if (h.host.name == used.name && !h.listed) return true;
    }
  }
  const auto next = nextLaunch(true);
  return next && next->world > l.world;
}

void Supervisor::loseHosts(const std::vector<int>& ranks, const std::vector<std::string>& rank_hosts,
                           const std::string& why, AttemptRecord& rec) {
  for (int r : ranks) {
    if (r < 0 || r >= static_cast<int>(rank_hosts.size())) continue;
    for (auto& h : hosts_) {
      if (h.host.name != rank_hosts[static_cast<size_t>(r)] || !h.available) continue;
      h.available = false;
      h.lost_at = now();
      h.answering_since = -1;
      h.next_probe = now() + 1;
      h.why_lost = why;
      rec.lost_hosts.push_back(h.host.name);
      say(strCat("host ", h.host.name, " is lost (rank ", r, "): ", why));
    }
  }
}

std::string Supervisor::lostHostsText() const {
  std::string s;
  for (const auto& h : hosts_) {
    if (h.listed && !h.available) s += strCat(s.empty() ? "" : "; ", h.host.name, " (", h.why_lost, ")");
  }
  return s.empty() ? "none lost" : "lost " + s;
}

/// Waits (bounded) until no rank of attempt `number` on a host still in use beats.
void Supervisor::drainAttempt(int number, const std::vector<std::string>& rank_hosts) {
  Monitor old(number, static_cast<int>(rank_hosts.size()), {}, now());
  const double start = now();
  double quiet_since = now();
  while (now() - quiet_since < 2 * cfg_.elastic.heartbeat_s && now() - start < 15) {
    const double before = last_beat_;
    receiveBeats(&old, 0.1);
    if (last_beat_ != before) quiet_since = now();
  }
}

/// The attempt's console, and what mpirun's lines say about a rank that died.
/// Shared with the reader thread, which may outlive the attempt (child.h).
struct AttemptOutput {
  std::mutex mu;
  std::vector<int> died;  ///< ranks mpirun saw exit on a signal
  std::string died_text;
};

/// One attempt while it runs.
struct AttemptState {
  AttemptState(const Launch& l, AttemptRecord& r, Monitor m) : launch(l), rec(r), mon(std::move(m)) {}
  const Launch& launch;
  AttemptRecord& rec;
  Monitor mon;
  std::vector<std::string> rank_hosts;  ///< by rank
  std::shared_ptr<AttemptOutput> out = std::make_shared<AttemptOutput>();
  fs::file_time_type launched_at = fs::file_time_type::clock::now();  ///< for report.json's time
  bool planned = false;         ///< SIGUSR1 sent for a new world
  bool stop_forwarded = false;  ///< SIGUSR1 sent because the supervisor was asked to stop
};

std::function<void(const std::string&)> outputSink(std::shared_ptr<AttemptOutput> out) {
  return [out](const std::string& line) {
    static const std::regex died(R"(process rank (\d+) with PID \d+ on node (\S+) exited on signal (\d+))");
    std::cout << line << "\n" << std::flush;
    std::smatch m;
    if (std::regex_search(line, m, died)) {
      std::lock_guard lock(out->mu);
      out->died.push_back(std::stoi(m[1]));
      out->died_text = strCat("rank ", m[1], " on ", m[2], " was killed by signal ", m[3]);
    }
  };
}

std::string hostsOf(const std::vector<int>& ranks, const std::vector<std::string>& rank_hosts) {
  std::string s;
  for (int r : ranks) s += strCat(s.empty() ? "" : ", ", rank_hosts.at(static_cast<size_t>(r)));
  return s;
}

Ending Supervisor::runAttempt(const Launch& l, AttemptRecord& rec) {
  AttemptState a(l, rec, Monitor(rec.number, l.world, {cfg_.elastic.heartbeat_timeout_s,
                                                        cfg_.elastic.heartbeat_timeout_s + 120,
                                                        cfg_.elastic.stall_s},
                                 now()));
  beginAttempt(a);
  const std::vector<std::string> env = {strCat("BATCHDIST_HEARTBEAT=", address_, ":", port_),
                                        strCat("BATCHDIST_ATTEMPT=", rec.number),
                                        strCat("BATCHDIST_HEARTBEAT_S=", cfg_.elastic.heartbeat_s)};
  Child child(attemptArgv(l, rec.number), env, outputSink(a.out));
  rec.launched_s = now();
  double next_look = now() + 1;
  for (;;) {
    receiveBeats(&a.mon, 0.1);
    noteProgress(a);
    if (const auto st = child.poll()) return onExit(a, *st);
    if (const Verdict v = a.mon.check(now()); v.kind != Verdict::Kind::kNone) return onVerdict(a, v, child);
    if (g_signal.load() != 0 && !a.stop_forwarded) {
      say(strCat("SIG", sigabbrev_np(g_signal.load()), ": asking the job to stop with a checkpoint"));
      child.signal(SIGUSR1);
      a.stop_forwarded = true;
    }
    if (now() >= next_look) {
      next_look = now() + 1;
      lookAround(a, child);
    }
  }
}

void Supervisor::beginAttempt(AttemptState& a) {
  const Launch& l = a.launch;
  AttemptRecord& rec = a.rec;
  rec.world = l.world;
  rec.per_gpu = l.split.per_gpu;
  rec.accum = l.split.accum;
  rec.global = known_global_;
  rec.split = l.split.world > 0 ? l.split.why : "the config's batch (the global batch is not known yet)";
  for (const auto& h : l.hosts) {
    rec.hosts.push_back(strCat(h.name, ":", h.slots));
    for (int i = 0; i < h.slots; ++i) a.rank_hosts.push_back(h.name);
  }
  say(strCat("attempt ", rec.number, ": ", l.world, " rank(s) on ", l.hosts.size(), " host(s); ", rec.split));
}

/// The attempt's figures from the beats; at its first step, the previous attempt's lost steps.
void Supervisor::noteProgress(AttemptState& a) {
  AttemptRecord& rec = a.rec;
  rec.start_step = a.mon.startStep();
  rec.last_step = a.mon.lastStep();
  rec.checkpoint = a.mon.checkpoint();
  if (rec.first_step_s >= 0 || a.mon.firstStepAt() < 0) return;
  rec.first_step_s = a.mon.firstStepAt();
  const Beat b = a.mon.batch();
  if (b.global > 0) known_global_ = b.global;
  if (b.per_gpu > 0) known_fit_ = std::max(known_fit_, b.per_gpu);
  rec.per_gpu = b.per_gpu;
  rec.accum = b.accum;
  rec.global = b.global;
  if (attempts_.empty() || attempts_.back().last_step < 0 || rec.start_step < 0) return;
  AttemptRecord& previous = attempts_.back();
  previous.lost_steps = std::max<int64_t>(0, previous.last_step - rec.start_step);
  say(strCat("attempt ", rec.number, " trains from step ", rec.start_step, " on ", rec.world,
             " rank(s), ", worker::formatFixed(rec.first_step_s - previous.ended_s, 1), " s after attempt ",
             previous.number, " ended; lost ", previous.lost_steps, " step(s)"));
}

/// Note [launcher checked first]: whether attempt `a` ran the job: a rank beat,
/// or report.json was written since its launch. A "mpirun" that exits 0 without
/// starting a rank (--mpirun echo) passed every probe, and the job "finished".
bool Supervisor::jobRan(const AttemptState& a) const {
  if (last_beat_ >= a.rec.launched_s) return true;
  std::error_code ec;
  const auto written = fs::last_write_time(fs::path(cli_.output) / "report.json", ec);
  return !ec && written >= a.launched_at;
}

/// mpirun has exited with `status`: finished, stopped, planned, the job's own bad input, or a failure.
Ending Supervisor::onExit(AttemptState& a, int status) {
  AttemptRecord& rec = a.rec;
  rec.ended_s = now();
  std::vector<int> blamed;
  std::string died_text;
  {
    std::lock_guard lock(a.out->mu);
    blamed = a.out->died;
    died_text = a.out->died_text;
  }
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) {
    if (!jobRan(a)) {
      rec.cause = strCat("--mpirun ", opt_.mpirun, " exited 0, but no rank of the job started (no "
                         "heartbeat, no report.json): give the path of Open MPI's mpirun");
      return Ending::kNoJob;
    }
    rec.cause = "finished";
    return Ending::kFinished;
  }
  if (a.stop_forwarded) {
    rec.cause = strCat("stopped (SIG", sigabbrev_np(g_signal.load()), "): mpirun ", elastic::describeStatus(status));
    return Ending::kStopped;
  }
  if (a.planned && blamed.empty()) {
    rec.planned = true;
    rec.lost_steps = 0;
    say(strCat("attempt ", rec.number, " stopped with a checkpoint at step ", rec.last_step));
    return Ending::kPlanned;
  }
  if (blamed.empty() && WIFEXITED(status) && WEXITSTATUS(status) == 2) {
    rec.cause = "the job exited 2 (bad input)";
    return Ending::kBadInput;
  }
  rec.cause = blamed.empty()
                  ? strCat("mpirun ", elastic::describeStatus(status),
                           " without naming a rank (a daemon or its host lost?); the hosts are probed")
                  : died_text;
  say(strCat("attempt ", rec.number, " failed after ", worker::formatFixed(rec.ended_s - rec.launched_s, 1),
             " s at step ", rec.last_step, ": ", rec.cause));
  loseHosts(blamed, a.rank_hosts, rec.cause, rec);
  probeAll();
  return Ending::kFailed;
}

/// The heartbeats say a rank is lost or the job hangs: the attempt ends here.
Ending Supervisor::onVerdict(AttemptState& a, const Verdict& v, Child& child) {
  AttemptRecord& rec = a.rec;
  const bool silent = v.kind == Verdict::Kind::kSilent;
  rec.cause = v.why;
  rec.detected_after_s = silent ? cfg_.elastic.heartbeat_timeout_s : cfg_.elastic.stall_s;
  say(strCat("attempt ", rec.number, ": ", silent ? "lost rank(s)" : "hang", ": ", v.why,
             " on host(s) ", hostsOf(v.ranks, a.rank_hosts), "; ending the attempt"));
  child.end(3.0);
  rec.ended_s = now();
  loseHosts(v.ranks, a.rank_hosts, v.why, rec);
  drainAttempt(rec.number, a.rank_hosts);
  probeAll();
  return Ending::kFailed;
}

/// Once a second: the host list and the probes; a larger world (or a host that
/// left the list) asks the job to stop at a step boundary for a relaunch.
void Supervisor::lookAround(AttemptState& a, Child& child) {
  refreshHosts();
  serviceProbes(false);
  if (a.planned || a.stop_forwarded || !a.mon.training() || !growthPossible(a.launch)) return;
  a.planned = true;
  a.rec.cause = "the hosts changed: relaunching on the new world at the next step boundary";
  say(strCat("attempt ", a.rec.number, ": ", a.rec.cause));
  child.signal(SIGUSR1);
}

int Supervisor::finish(int code, const std::string& why) {
  nlohmann::ordered_json j;
  j["attempts"] = nlohmann::ordered_json::array();
  for (const auto& a : attempts_) j["attempts"].push_back(a.json());
  j["exit_code"] = code;
  j["gave_up"] = code == 1 ? why : "";
  j["lost_hosts"] = lostHostsText();
  const fs::path out(cli_.output);
  try {
    worker::writeFileAtomic((out / "elastic.json").string(), j.dump(2) + "\n");
    // The last attempt's report carries the whole story.
    if (fs::exists(out / "report.json")) {
      auto report = nlohmann::ordered_json::parse(
          worker::readFileBounded((out / "report.json").string(), 256 << 20, "report.json"));
      report["elastic"] = j;
      worker::writeFileAtomic((out / "report.json").string(), report.dump(2) + "\n");
    }
  } catch (const std::exception& e) {
    std::cerr << "batchdist elastic: warning: could not write the elastic record: " << e.what() << std::endl;
  }
  if (code == 0) {
    say(strCat("finished after ", attempts_.size(), " attempt(s); ", out.string(), "/report.json has them"));
  } else {
    const fs::path ckpt = cfg_.checkpoint.dir.empty() ? out / "checkpoints" : fs::path(cfg_.checkpoint.dir);
    std::cerr << strCat("batchdist elastic: ", code == 1 ? "gave up: " : "", why, "; ", lostHostsText(),
                        code == 2 ? "" : strCat("; resume from ", ckpt.string(),
                                               " with --resume auto (the newest checkpoint there)"),
                        "\n")
              << std::flush;
  }
  return code;
}

}  // namespace

int runElastic(const CliOptions& cli) {
  worker::Config cfg;
  try {
    cfg = worker::loadConfig(cli.config, cli.sets);
  } catch (const Error& e) {
    std::cerr << "batchdist elastic: error: " << e.what() << std::endl;
    return e.exitCode();
  }
  Supervisor s(cli, std::move(cfg));
  return s.run();
}

}  // namespace batchdist::launcher
