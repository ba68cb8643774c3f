// The parts of `batchdist elastic` (Note [elastic supervisor]) without a job:
// the host list, what the heartbeats tell the monitor, and the heartbeat sender
// over a real UDP socket.
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>

#include "common/error.h"
#include "launcher/elastic/hosts.h"
#include "launcher/elastic/monitor.h"
#include "worker/common/heartbeat.h"

using namespace batchdist;
using namespace batchdist::launcher::elastic;

namespace {

Beat beat(int rank, const std::string& phase, int64_t step, int attempt = 1) {
  Beat b;
  b.attempt = attempt;
  b.rank = rank;
  b.phase = phase;
  b.step = step;
  return b;
}

MonitorLimits limits() {
  MonitorLimits l;
  l.heartbeat_timeout_s = 3;
  l.start_timeout_s = 30;
  l.stall_s = 20;
  return l;
}

}  // namespace

TEST(ElasticHosts, HostfileLinesWithSlotsCommentsAndRepeats) {
  const auto hosts = parseHosts("# the pool\nnode1 slots=4\n\nnode2   # default slots\nnode1 slots=8\n"
                                "node3 slots=2 max_slots=2\n",
                                "hosts.txt", 2);
  ASSERT_EQ(hosts.size(), 3u);
  EXPECT_EQ(hosts[0], (Host{"node1", 4}));  // the first line of a host wins
  EXPECT_EQ(hosts[1], (Host{"node2", 2}));
  EXPECT_EQ(hosts[2], (Host{"node3", 2}));
  EXPECT_EQ(slotCount(hosts), 8);
  EXPECT_EQ(hostfileText(hosts), "node1 slots=4\nnode2 slots=2\nnode3 slots=2\n");
}

TEST(ElasticHosts, BadLinesAreNamedByLine) {
  try {
    parseHosts("node1\nnode2 slots=zero\n", "--hosts h.txt", 1);
    FAIL() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_STREQ(e.what(), "--hosts h.txt:2: slots=zero: expected a whole number >= 1");
  }
  try {
    parseHosts("node1 cpus=4\n", "--hosts h.txt", 1);
    FAIL() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_STREQ(e.what(), "--hosts h.txt:1: 'cpus=4': expected HOST [slots=N]");
  }
  EXPECT_THROW(currentHosts("/nonexistent/hosts", "", 1), ConfigError);
  EXPECT_THROW(currentHosts("", "exit 3", 1), Error);
  EXPECT_EQ(currentHosts("", "printf 'a slots=2\\nb\\n'", 1), (std::vector<Host>{{"a", 2}, {"b", 1}}));
}

// A --hosts-command's stderr was read as host lines ("warning:" became a host);
// its failure is bad input naming what it said; it reads no terminal.
TEST(ElasticHosts, AHostsCommandsStderrIsNoHostAndItsFailureIsNamed) {
  EXPECT_EQ(currentHosts("", "echo 'warning: slow DNS' >&2; echo node1 slots=2", 1),
            (std::vector<Host>{{"node1", 2}}));
  EXPECT_EQ(currentHosts("", "cat; echo node2", 1), (std::vector<Host>{{"node2", 1}}));  // stdin /dev/null
  try {
    currentHosts("", "echo some output; echo 'no such partition' >&2; exit 3", 1);
    FAIL() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_STREQ(e.what(), "--hosts-command 'echo some output; echo 'no such partition' >&2; exit 3' "
                           "failed (exit status 3): no such partition\n");
  }
}

TEST(ElasticMonitor, BeatsRoundTripAndStrayPacketsAreIgnored) {
  const auto text = worker::heartbeat::message(3, 1, 4242, "train", 17, 15, 16, 2, 96, 811);
  const auto b = parseBeat(text);
  ASSERT_TRUE(b);
  EXPECT_EQ(b->attempt, 3);
  EXPECT_EQ(b->rank, 1);
  EXPECT_EQ(b->pid, 4242);
  EXPECT_EQ(b->phase, "train");
  EXPECT_EQ(b->step, 17);
  EXPECT_EQ(b->checkpoint, 15);
  EXPECT_EQ(b->global, 96);
  EXPECT_EQ(b->collectives, 811);
  EXPECT_FALSE(parseBeat("hello"));
  EXPECT_FALSE(parseBeat("batchdist-heartbeat 2 attempt=1"));
  EXPECT_FALSE(parseBeat("batchdist-heartbeat 1 attempt=x rank=0"));
}

TEST(ElasticMonitor, ASilentRankIsNamedAfterTheTimeout) {
  Monitor m(1, 3, limits(), 0);
  for (int r = 0; r < 3; ++r) m.record(beat(r, "train", 5), 1);
  m.record(beat(0, "train", 6), 3.5);
  m.record(beat(1, "train", 6), 3.5);
  EXPECT_EQ(m.check(3.9).kind, Verdict::Kind::kNone);  // rank 2: 2.9 s silent
  const auto v = m.check(4.2);
  EXPECT_EQ(v.kind, Verdict::Kind::kSilent);
  EXPECT_EQ(v.ranks, std::vector<int>{2});
  EXPECT_EQ(v.why, "rank 2 silent for 3.2 s (last heard in train at step 5)");
}

TEST(ElasticMonitor, ARankNeverHeardIsLostAfterTheStartTimeout) {
  Monitor m(1, 2, limits(), 0);
  m.record(beat(0, "setup", 0), 1);
  m.record(beat(0, "setup", 0), 29);
  EXPECT_EQ(m.check(29.5).kind, Verdict::Kind::kNone);
  const auto v = m.check(30.5);
  EXPECT_EQ(v.ranks, std::vector<int>{1});
  EXPECT_EQ(v.why, "rank 1 never heard from in 30.5 s after the launch");
}

TEST(ElasticMonitor, FinishedRanksAndOtherAttemptsDoNotCount) {
  Monitor m(2, 2, limits(), 0);
  m.record(beat(0, "done", 40, 2), 1);
  m.record(beat(1, "train", 40, 1), 1);  // a rank of attempt 1, still dying
  m.record(beat(1, "done", 40, 2), 1);
  EXPECT_EQ(m.check(100).kind, Verdict::Kind::kNone);
}

TEST(ElasticMonitor, AHangNamesTheRankTheOthersWaitFor) {
  Monitor m(1, 3, limits(), 0);
  for (double t = 1; t <= 5; t += 1) {
    m.record(beat(0, "train", 12), t);
    m.record(beat(1, "train", 11), t);  // in step 12's backward forever
    m.record(beat(2, "train", 12), t);
  }
  for (double t = 6; t <= 30; t += 1) {  // every rank still beats, no step finishes
    for (int r = 0; r < 3; ++r) m.record(beat(r, "train", r == 1 ? 11 : 12), t);
  }
  EXPECT_EQ(m.check(20.5).kind, Verdict::Kind::kNone);
  const auto v = m.check(21.5);
  EXPECT_EQ(v.kind, Verdict::Kind::kStall);
  EXPECT_EQ(v.ranks, std::vector<int>{1});
  EXPECT_NE(v.why.find("no step finished for 20.5 s (elastic.stall_s 20)"), std::string::npos) << v.why;
  EXPECT_NE(v.why.find("behind at step 11"), std::string::npos) << v.why;
}

// In a real hang every rank has done the same steps (a step needs them all); the
// ranks waiting inside a collective have started more of them than the one that
// hangs outside it.
TEST(ElasticMonitor, AHangWithEqualStepsNamesTheRankBehindInCollectives) {
  Monitor m(1, 4, limits(), 0);
  const auto at = [](int rank, int64_t collectives) {
    Beat b = beat(rank, "train", 12);
    b.collectives = collectives;
    return b;
  };
  for (double t = 1; t <= 30; t += 1) {
    for (int r = 0; r < 4; ++r) m.record(at(r, r == 3 ? 240 : 243), t);
  }
  const auto v = m.check(21.5);
  EXPECT_EQ(v.kind, Verdict::Kind::kStall);
  EXPECT_EQ(v.ranks, std::vector<int>{3});
  EXPECT_NE(v.why.find("the last step done is 12; behind in collectives started (240, the others "
                       "up to 243): 1 rank(s) the others wait for"),
            std::string::npos)
      << v.why;
  // Beats that do not say it (or every rank equal): every rank is named.
  Monitor old(1, 2, limits(), 0);
  for (double t = 1; t <= 30; t += 1) {
    for (int r = 0; r < 2; ++r) old.record(beat(r, "train", 12), t);
  }
  const auto all = old.check(21.5);
  EXPECT_EQ(all.ranks, (std::vector<int>{0, 1}));
  EXPECT_NE(all.why.find("; every rank"), std::string::npos) << all.why;
}

TEST(ElasticMonitor, FiguresOfTheAttempt) {
  Monitor m(1, 2, limits(), 0);
  EXPECT_EQ(m.startStep(), -1);
  Beat b = beat(0, "train", 30);
  b.checkpoint = 30;
  b.per_gpu = 16;
  b.accum = 2;
  b.global = 96;
  m.record(b, 2);
  m.record(beat(1, "train", 30), 2);
  EXPECT_EQ(m.startStep(), 30);  // a resumed attempt starts at its checkpoint
  EXPECT_TRUE(m.training());
  EXPECT_LT(m.firstStepAt(), 0);
  b.step = 33;
  m.record(b, 4);
  EXPECT_EQ(m.firstStepAt(), 4);
  EXPECT_EQ(m.lastStep(), 33);
  EXPECT_EQ(m.checkpoint(), 30);
  EXPECT_EQ(m.batch().global, 96);
  EXPECT_EQ(m.batch().accum, 2);
}

TEST(ElasticHeartbeat, TheSenderBeatsOverUdpAndSaysItsLastWord) {
  const int fd = socket(AF_INET, SOCK_DGRAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  socklen_t len = sizeof a;
  ASSERT_EQ(getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len), 0);
  const std::string target = "127.0.0.1:" + std::to_string(ntohs(a.sin_port));
  setenv("BATCHDIST_HEARTBEAT", target.c_str(), 1);
  setenv("BATCHDIST_ATTEMPT", "7", 1);
  setenv("BATCHDIST_HEARTBEAT_S", "0.05", 1);
  const auto next = [&]() -> std::optional<Beat> {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, 5000) <= 0) return std::nullopt;
    char buf[512];
    const ssize_t n = recv(fd, buf, sizeof buf, 0);
    return parseBeat(std::string(buf, static_cast<size_t>(std::max<ssize_t>(n, 0))));
  };
  worker::heartbeat::setBatch(8, 1, 32);
  worker::heartbeat::startFromEnvironment(5);
  auto b = next();
  ASSERT_TRUE(b);
  EXPECT_EQ(b->attempt, 7);
  EXPECT_EQ(b->rank, 5);
  EXPECT_EQ(b->pid, getpid());
  EXPECT_EQ(b->global, 32);
  worker::heartbeat::setStep(12);
  worker::heartbeat::setPhase("done");
  worker::heartbeat::stop();
  std::optional<Beat> last;
  while (auto x = next()) {
    last = x;
    if (x->phase == "done" && x->step == 12) break;
  }
  ASSERT_TRUE(last);
  EXPECT_EQ(last->phase, "done");
  EXPECT_EQ(last->step, 12);
  unsetenv("BATCHDIST_HEARTBEAT");
  close(fd);
}
