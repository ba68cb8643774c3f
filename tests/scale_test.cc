// What must hold at any world size, tested without that many processes: the
// numbers carried in collectives stay exact up to 2^20 ranks, and the stall
// report's protocol names exactly the missing ranks among 64, the same on every
// rank that reports (Note [stall report], Note [step wishes], Note [search agreement]).

#include <gtest/gtest.h>

#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include "collective/process_group.h"
#include "collective/torch_compat.h"
#include "worker/search/search.h"
#include "worker/train/trainer.h"

namespace batchdist {
namespace {

using collective::SideChannel;
using worker::StepWishes;

constexpr int kWorlds[] = {2, 3, 64, 1000, 4097, 65536, 1 << 20};

/// The side channel as an fp32 bucket sums it over `world` ranks, of which the
/// ranks in `stop`, `ckpt` and `oom` ask for that (in rank order, float adds).
SideChannel summedInFp32(int world, const std::set<int>& stop, const std::set<int>& ckpt,
                         const std::set<int>& oom) {
  std::array<float, std::tuple_size_v<SideChannel>> acc{};
  for (int r = 0; r < world; ++r) {
    const auto mine = worker::packWishes({stop.count(r) > 0, ckpt.count(r) > 0, oom.count(r) > 0});
    for (std::size_t i = 0; i < acc.size(); ++i) acc[i] += static_cast<float>(mine[i]);
  }
  SideChannel out{};
  for (std::size_t i = 0; i < acc.size(); ++i) out[i] = acc[i];
  return out;
}

TEST(ScaleEncoding, StepWishesSurviveAnFp32SumUpToAMillionRanks) {
  for (const int w : kWorlds) {
    const int last = w - 1;
    struct Case {
      std::set<int> stop, ckpt, oom;
    };
    const Case cases[] = {
        {{}, {}, {}},
        {{last}, {}, {}},
        {{}, {last}, {}},
        {{}, {}, {last}},
        {{0}, {last}, {w / 2}},
    };
    for (const auto& c : cases) {
      const auto got = worker::unpackWishes(summedInFp32(w, c.stop, c.ckpt, c.oom));
      EXPECT_EQ(got.stop, !c.stop.empty()) << "W " << w;
      EXPECT_EQ(got.checkpoint, !c.ckpt.empty()) << "W " << w;
      EXPECT_EQ(got.oom, !c.oom.empty()) << "W " << w;
    }
    // Every rank asking everything: each slot is exactly W.
    std::set<int> all;
    if (w <= 65536) {
      for (int r = 0; r < w; ++r) all.insert(r);
      const auto sum = summedInFp32(w, all, all, all);
      for (const double v : sum) EXPECT_EQ(v, w) << "W " << w;
    }
  }
}

TEST(ScaleEncoding, SearchFailureCodesDecodeToTheWorstKindAndLowestRank) {
  using worker::FailKind;
  for (const int w : kWorlds) {
    const int ranks[] = {0, 1, w / 2, w - 2, w - 1};
    for (const int a : ranks) {
      for (const int b : ranks) {
        if (a < 0 || b < 0 || a >= w || b >= w) continue;
        for (const auto ka : {FailKind::kOverBudget, FailKind::kOutOfMemory, FailKind::kError}) {
          for (const auto kb : {FailKind::kNone, FailKind::kOutOfMemory, FailKind::kError}) {
            // What one MAX allreduce over the ranks gives (the others report kNone).
            const double max = std::max({worker::failureCode(ka, a), worker::failureCode(kb, b),
                                         worker::failureCode(FailKind::kNone, 0)});
            const auto [kind, rank] = worker::decodeFailure(max);
            const FailKind worst = std::max(ka, kb);
            const int expect_rank = ka == kb ? std::min(a, b) : (worst == ka ? a : b);
            EXPECT_EQ(kind, worst) << "W " << w;
            EXPECT_EQ(rank, expect_rank) << "W " << w << " ranks " << a << ", " << b;
          }
        }
      }
    }
  }
  EXPECT_EQ(worker::decodeFailure(worker::failureCode(FailKind::kNone, 3)).first, FailKind::kNone);
}

TEST(StallReport, RanksAreWrittenAsShortRangesPerHost) {
  using collective::describeRanks;
  EXPECT_EQ(describeRanks({1}, {"a"}), "rank 1 (host a)");
  EXPECT_EQ(describeRanks({17, 40, 41}, {"a", "a", "a"}), "ranks 17, 40-41 (host a)");
  EXPECT_EQ(describeRanks({3, 4, 5, 9}, {"a", "a", "b", "b"}), "ranks 3-4 (host a); ranks 5, 9 (host b)");
  // Thousands of ranks on hundreds of hosts: a bounded line.
  std::vector<int> ranks;
  std::vector<std::string> hosts;
  for (int r = 0; r < 4096; r += 2) {
    ranks.push_back(r);
    hosts.push_back("node" + std::to_string(r / 8));
  }
  const auto text = describeRanks(ranks, hosts);
  EXPECT_LT(text.size(), 400u) << text;
  EXPECT_NE(text.find("more rank(s) on "), std::string::npos) << text;
  // Many ranges on one host: the count is kept.
  std::vector<std::string> one(ranks.size(), "h");
  const auto long_one = describeRanks(ranks, one);
  EXPECT_LT(long_one.size(), 200u) << long_one;
  EXPECT_NE(long_one.find("(2048 in all)"), std::string::npos) << long_one;
}

/// Runs the stall report on every rank of `world` except `stopped`, each rank
/// starting after its own delay, over one store; returns each reporter's text.
std::map<int, std::string> reportStall(int world, const std::set<int>& stopped,
                                       const std::function<int(int)>& delay_ms,
                                       std::chrono::milliseconds timeout) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  for (int r = 0; r < world; ++r) {
    const std::string host = "node" + std::to_string(r / 8);
    store->set("batchdist/host/" + std::to_string(r), std::vector<uint8_t>(host.begin(), host.end()));
  }
  std::map<int, std::string> out;
  std::mutex mu;
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    if (stopped.count(r)) continue;
    threads.emplace_back([&, r] {
      std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms(r)));
      auto text = collective::stallReport(store, r, world, /*seq=*/100 + r % 2, timeout);
      std::lock_guard<std::mutex> lock(mu);
      out[r] = std::move(text);
    });
  }
  for (auto& t : threads) t.join();
  return out;
}

TEST(StallReport, SixtyFourRanksNameExactlyTheTwoStoppedOnesAndAgree) {
  // Ranks time out at different moments: those queued behind the stopped ones in
  // the next collective a little later, the last one 1.6 s after the others.
  const auto start = std::chrono::steady_clock::now();
  const auto reports = reportStall(
      64, {40, 41}, [](int r) { return r == 63 ? 4000 : (r % 7) * 400; }, std::chrono::seconds(2));
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_EQ(reports.size(), 62u);
  const std::string& first = reports.begin()->second;
  for (const auto& [rank, text] : reports) EXPECT_EQ(text, first) << "rank " << rank;
  EXPECT_NE(first.find("Did not reach it: ranks 40-41 (host node5);"), std::string::npos) << first;
  EXPECT_NE(first.find("The other 62 rank(s) waited"), std::string::npos) << first;
  EXPECT_EQ(first.find("rank 0"), std::string::npos) << first;
  // Bounded: the arrivals' spread (4 s) + the quiet period (5 s), and some slack.
  EXPECT_LT(secs, 30.0);
}

TEST(StallReport, EveryRankArrivingBlamesTheNetworkNotARank) {
  const auto reports = reportStall(8, {}, [](int r) { return r * 50; }, std::chrono::seconds(1));
  ASSERT_EQ(reports.size(), 8u);
  for (const auto& [rank, text] : reports) {
    EXPECT_NE(text.find("Every rank is alive and waiting in a collective"), std::string::npos)
        << "rank " << rank << ": " << text;
  }
}

TEST(StallReport, RanksOnManyHostsAreGroupedByHost) {
  const auto reports = reportStall(32, {3, 17, 18}, [](int) { return 0; }, std::chrono::seconds(1));
  ASSERT_EQ(reports.size(), 29u);
  for (const auto& [rank, text] : reports) {
    EXPECT_NE(text.find("Did not reach it: rank 3 (host node0); ranks 17-18 (host node2);"),
              std::string::npos) << "rank " << rank << ": " << text;
  }
}

}  // namespace
}  // namespace batchdist
