// dist.backend: mpi (Note [mpi backend]) on real ranks: every collective agrees
// with the arithmetic, for the dtypes and layouts the trainer and search use.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <chrono>
#include <thread>

#include "common/error.h"
#include "mpi_helpers.h"

using namespace batchdist;

namespace {

void forEachGroup(const std::function<void(collective::Communicator&)>& fn) {
  for (int W = 1; W <= mpitest::worldSize(); ++W) mpitest::inGroup(W, fn, "mpi");
}

}  // namespace

TEST(MpiBackend, AllreduceSumMinMaxInEveryDtypeAndLayout) {
  forEachGroup([](collective::Communicator& comm) {
    const int W = comm.size();
    const double r = comm.rank();
    EXPECT_EQ(comm.backendName(), "mpi");
    for (auto dtype : {at::kFloat, at::kDouble, at::kLong, at::kBFloat16, at::kHalf}) {
      auto t = at::arange(6, at::TensorOptions().dtype(at::kDouble)).add(r).to(dtype);
      comm.allreduce(t, collective::ReduceOp::kSum);
      // sum over ranks of (i + r) = W i + W (W - 1) / 2
      auto want = at::arange(6, at::kDouble).mul(W).add(W * (W - 1) / 2.0);
      EXPECT_TRUE(at::allclose(t.to(at::kDouble), want)) << dtype << " W=" << W << " " << t;
      EXPECT_EQ(t.scalar_type(), dtype);
      auto lo = at::full({3}, r, at::TensorOptions().dtype(dtype));
      auto hi = lo.clone();
      comm.allreduce(lo, collective::ReduceOp::kMin);
      comm.allreduce(hi, collective::ReduceOp::kMax);
      EXPECT_EQ(lo.to(at::kDouble).max().item<double>(), 0.0);
      EXPECT_EQ(hi.to(at::kDouble).min().item<double>(), W - 1.0);
    }
    // A non-contiguous view is reduced in place, through a staging copy.
    auto base = at::arange(12, at::kFloat).reshape({3, 4});
    auto view = base.t();
    comm.allreduce(view, collective::ReduceOp::kSum);
    EXPECT_TRUE(at::allclose(base, at::arange(12, at::kFloat).reshape({3, 4}).mul(W)));
  });
}

TEST(MpiBackend, AsyncAllreducesInFlightTogetherCompleteInAnyOrder) {
  forEachGroup([](collective::Communicator& comm) {
    const int W = comm.size();
    std::vector<at::Tensor> ts;
    std::vector<std::unique_ptr<collective::PendingWork>> works;
    for (int k = 0; k < 5; ++k) {
      ts.push_back(at::full({1000 * (k + 1)}, static_cast<float>(k + comm.rank())));
      works.push_back(comm.allreduceAsync(ts.back(), collective::ReduceOp::kSum));
    }
    for (int k = 4; k >= 0; --k) works[k]->wait();
    for (int k = 0; k < 5; ++k) {
      const float want = W * k + W * (W - 1) / 2.0f;
      EXPECT_EQ(ts[k].min().item<float>(), want);
      EXPECT_EQ(ts[k].max().item<float>(), want);
    }
  });
}

// The reducer calls progress() from its autograd hooks (PendingWork::progress):
// that alone must carry a multi-round collective to its end, with no wait().
TEST(MpiBackend, ProgressAloneCompletesACollectiveInFlight) {
  forEachGroup([](collective::Communicator& comm) {
    const int W = comm.size();
    auto t = at::full({2 << 20}, static_cast<float>(comm.rank() + 1));  // 8 MB
    const float want = W * (W + 1) / 2.0f;
    auto work = comm.allreduceAsync(t, collective::ReduceOp::kSum);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    bool done = false;
    while (!done && std::chrono::steady_clock::now() < deadline) {
      work->progress();
      // Both ends of the tensor: the last bytes to arrive are not always at the end.
      done = t[0].item<float>() == want && t[-1].item<float>() == want &&
             t.min().item<float>() == want && t.max().item<float>() == want;
    }
    EXPECT_TRUE(done) << "W=" << W << ": progress() did not finish the allreduce";
    work->wait();
    EXPECT_EQ(t.min().item<float>(), want);
  });
}

TEST(MpiBackend, BroadcastAllgatherAndTheScalarHelpers) {
  forEachGroup([](collective::Communicator& comm) {
    const int W = comm.size();
    const int root = W - 1;
    auto t = at::full({4}, static_cast<double>(comm.rank()));
    comm.broadcast(t, root);
    EXPECT_EQ(t.min().item<double>(), root);
    const auto g = comm.allgather(at::full({2}, static_cast<int64_t>(comm.rank() * 10)));
    ASSERT_EQ(g.sizes(), (std::vector<int64_t>{W, 2}));
    for (int r = 0; r < W; ++r) EXPECT_EQ(g[r][1].item<int64_t>(), r * 10);
    EXPECT_EQ(comm.broadcast(std::string(comm.rank() == 0 ? "from rank 0" : "x"), 0), "from rank 0");
    EXPECT_EQ(comm.allreduce(1.0, collective::ReduceOp::kSum), W);
    comm.barrier();
  });
}

TEST(MpiBackend, ACallFromAnotherThreadIsRefusedNotCorrupting) {
  forEachGroup([](collective::Communicator& comm) {
    std::string what;
    std::thread other([&] {
      auto t = at::ones({2});
      try {
        comm.allreduce(t, collective::ReduceOp::kSum);
      } catch (const CollectiveError& e) {
        what = e.what();
      }
    });
    other.join();
    EXPECT_NE(what.find("another thread"), std::string::npos) << what;
    auto t = at::ones({2});  // the group still works
    comm.allreduce(t, collective::ReduceOp::kSum);
    EXPECT_EQ(t[0].item<float>(), comm.size());
  });
}
