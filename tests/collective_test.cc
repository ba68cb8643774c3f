// Collectives with several ranks as threads over a c10d HashStore + Gloo.
#include <gtest/gtest.h>
#include <torch/csrc/autograd/function.h>
#include <torch/torch.h>

#include <chrono>
#include <thread>

#include "tests/thread_ranks.h"
#include "common/error.h"
#include "collective/grad_sync.h"
#include "collective/reducer.h"
#include "collective/mpi_comm.h"
#include "collective/process_group.h"
#include "collective/rendezvous.h"
#include "collective/torch_compat.h"

using namespace batchdist;
using namespace batchdist::collective;

namespace {

using testsupport::runRanks;

class Collectives : public ::testing::TestWithParam<int> {};

}  // namespace

TEST_P(Collectives, AllreduceBroadcastAllgather) {
  const int world = GetParam();
  runRanks(world, [world](Communicator& c) {
    const int r = c.rank();
    auto t = torch::tensor({1.0f * r, 10.0f - r});
    c.allreduce(t, ReduceOp::kSum);
    const float sum = world * (world - 1) / 2.0f;
    EXPECT_FLOAT_EQ(t[0].item<float>(), sum);
    EXPECT_FLOAT_EQ(t[1].item<float>(), 10.0f * world - sum);

    auto lo = torch::tensor({static_cast<double>(r) + 0.5});
    c.allreduce(lo, ReduceOp::kMin);
    EXPECT_DOUBLE_EQ(lo.item<double>(), 0.5);
    auto hi = torch::tensor({static_cast<int64_t>(r * 3)});
    c.allreduce(hi, ReduceOp::kMax);
    EXPECT_EQ(hi.item<int64_t>(), 3 * (world - 1));

    auto b = torch::full({3}, static_cast<float>(r));
    c.broadcast(b, world - 1);
    EXPECT_TRUE(torch::equal(b, torch::full({3}, static_cast<float>(world - 1))));

    auto g = c.allgather(torch::tensor({r, 2 * r}));
    ASSERT_EQ(g.sizes(), (std::vector<int64_t>{world, 2}));
    for (int k = 0; k < world; ++k) EXPECT_EQ(g[k][1].item<int64_t>(), 2 * k);

    EXPECT_DOUBLE_EQ(c.allreduce(1.5, ReduceOp::kSum), 1.5 * world);
    EXPECT_EQ(c.allreduce(std::vector<double>{double(r), -double(r)}, ReduceOp::kMax),
              (std::vector<double>{double(world - 1), 0.0}));
    EXPECT_EQ(c.any(r == world - 1), true);
    EXPECT_EQ(c.any(false), false);
    const auto all = c.allgather(static_cast<double>(r * r));
    for (int k = 0; k < world; ++k) EXPECT_DOUBLE_EQ(all[k], k * k);
    EXPECT_EQ(c.broadcast(r == 0 ? std::string("hello ranks") : std::string(), 0), "hello ranks");
    c.barrier();
  });
}

TEST_P(Collectives, GradientSumUsesFewBucketsAndMatchesTheSum) {
  const int world = GetParam();
  runRanks(world, [world](Communicator& c) {
    torch::manual_seed(0);
    std::vector<torch::Tensor> params;
    for (int i = 0; i < 20; ++i) params.push_back(torch::zeros({i + 1, 3}, torch::requires_grad()));
    params.push_back(torch::zeros({4}, torch::requires_grad()));  // gets no gradient on odd ranks
    for (std::size_t i = 0; i + 1 < params.size(); ++i) {
      params[i].mutable_grad() = torch::full({static_cast<int64_t>(i) + 1, 3},
                                             static_cast<float>(c.rank() + i));
    }
    if (c.rank() % 2 == 0) params.back().mutable_grad() = torch::ones({4});
    // 20 tensors, ~2.5 KB in all, 1 KB buckets -> a handful of collectives.
    GradientSynchronizer sync(c, params, 1024);
    EXPECT_GE(sync.bucketCount(), 2u);
    EXPECT_LE(sync.bucketCount(), 5u);
    // e.g. one rank asking to stop, every rank reporting an out-of-memory
    const SideChannel side = sync.sumGradients({c.rank() == 1 ? 1.0 : 0.0, 1.0});
    EXPECT_DOUBLE_EQ(side[0], 1.0);
    EXPECT_DOUBLE_EQ(side[1], world);
    const float rank_sum = world * (world - 1) / 2.0f;
    for (std::size_t i = 0; i + 1 < params.size(); ++i) {
      EXPECT_TRUE(torch::allclose(params[i].grad(),
                                  torch::full_like(params[i], rank_sum + world * float(i))))
          << "param " << i;
    }
    EXPECT_TRUE(torch::equal(params.back().grad(), torch::full({4}, float((world + 1) / 2))));
  });
}

// Note [overlapped reducer]: a chain of layers, so backward produces gradients
// layer by layer. With 4 micro-batches the first three send nothing; the fourth
// starts buckets from the autograd hooks, during backward; the sums are exact;
// a parameter unused on some ranks (and in some steps) neither hangs nor
// corrupts; after the first step the buckets are rebuilt and stay correct.
TEST_P(Collectives, ReducerOverlapsSendsOnlyOnTheLastMicroBatchAndSumsExactly) {
  const int world = GetParam();
  runRanks(world, [world](Communicator& c) {
    std::vector<torch::Tensor> w;
    for (int i = 0; i < 6; ++i) w.push_back(torch::full({16, 16}, 0.01 * (i + 1), torch::requires_grad()));
    auto unused = torch::ones({8}, torch::requires_grad());  // used on rank 0 in step 1 only
    std::vector<torch::Tensor> params = w;
    params.push_back(unused);
    Reducer reducer(c, params, /*bucket_bytes=*/1024);  // one layer a bucket
    EXPECT_GE(reducer.bucketCount(), 6u);
    const int accum = 4;
    for (int step = 0; step < 3; ++step) {
      reducer.zeroGrad();
      const int64_t before = reducer.collectivesStarted();
      const int64_t hooks_before = reducer.startedFromHooks();
      for (int k = 0; k < accum; ++k) {
        reducer.prepare(k == accum - 1, {c.rank() == world - 1 && step == 1 ? 1.0 : 0.0, 0.0});
        auto x = torch::full({4, 16}, 1.0 + k + c.rank());
        for (auto& layer : w) x = torch::mm(x, layer);
        auto loss = x.sum();
        if (step == 1 && c.rank() == 0) loss = loss + unused.sum();
        loss.backward();
        if (k < accum - 1) {
          EXPECT_EQ(reducer.collectivesStarted(), before) << "a non-final micro-batch sent";
        }
      }
      const int64_t during_backward = reducer.startedFromHooks() - hooks_before;
      const SideChannel side = reducer.finish();
      EXPECT_DOUBLE_EQ(side[0], step == 1 ? 1.0 : 0.0);
      EXPECT_DOUBLE_EQ(side[1], 0.0);
      EXPECT_EQ(reducer.collectivesStarted() - before, static_cast<int64_t>(reducer.bucketCount()));
      // Reference: the same gradients computed locally for every rank, summed.
      std::vector<torch::Tensor> ref(w.size());
      for (int r = 0; r < world; ++r) {
        std::vector<torch::Tensor> v;
        for (auto& layer : w) v.push_back(layer.detach().clone().requires_grad_(true));
        for (int k = 0; k < accum; ++k) {
          auto x = torch::full({4, 16}, 1.0 + k + r);
          for (auto& layer : v) x = torch::mm(x, layer);
          x.sum().backward();
        }
        for (std::size_t i = 0; i < v.size(); ++i) ref[i] = r == 0 ? v[i].grad() : ref[i] + v[i].grad();
      }
      for (std::size_t i = 0; i < w.size(); ++i) {
        EXPECT_TRUE(torch::allclose(w[i].grad(), ref[i], 1e-5, 1e-6)) << "step " << step << " w" << i;
      }
      // Rank 0 used it in each of the 4 micro-batches of step 1.
      EXPECT_TRUE(torch::equal(unused.grad(), torch::full({8}, step == 1 ? 4.0f : 0.0f)))
          << "step " << step;
      if (step == 2) {
        // Step 0's initial order put the unused parameter's bucket first, which
        // held back every other (buckets start in order); rebuilt from the real
        // ready order it goes last and the layers' buckets start during backward.
        EXPECT_GE(during_backward, static_cast<int64_t>(reducer.bucketCount()) - 1)
            << "buckets did not start during backward";
      }
      // Apply a tiny update so the next step's gradients differ.
      torch::NoGradGuard no_grad;
      for (auto& layer : w) layer.sub_(1e-4 * layer.grad());
    }
    EXPECT_TRUE(reducer.rebuilt());
  });
}

// Note [reducer hooks]: a Reducer's autograd hooks go with it. Reducer A trains
// a chain two steps; a forward is made while A lives (its graph holds the
// accumulators, and with them any hook left on them); A is destroyed, Reducer B
// built over the same parameters, and that graph's backward and two more steps
// run under B. Every step's gradient is exactly the sum over the ranks of the
// single-rank gradient (integer values: exact in double whatever the order):
// counted once, by B. Without the removal A's hook stays on the accumulators
// and would call the freed A (checked before that backward runs).
TEST_P(Collectives, ASecondReducerOverTheSameParametersCountsEachGradientOnce) {
  const int world = GetParam();
  runRanks(world, [world](Communicator& c) {
    std::vector<torch::Tensor> w;
    for (int i = 0; i < 3; ++i) {
      w.push_back(torch::full({4, 4}, 1.0 + i, torch::dtype(torch::kDouble).requires_grad(true)));
    }
    const auto hooksOn = [&](const torch::Tensor& p) {
      return torch::autograd::impl::grad_accumulator(p)->post_hooks().size();
    };
    const std::size_t baseline = hooksOn(w[0]);
    const auto forward = [&](const std::vector<torch::Tensor>& layers, int rank, int step) {
      auto x = torch::full({2, 4}, 1.0 + rank + step, torch::kDouble);
      for (const auto& layer : layers) x = torch::mm(x, layer);
      return x.sum();
    };
    int step = 0;
    // One step under `reducer`; `loss`, if given, is this step's forward, made earlier.
    const auto train = [&](Reducer& reducer, torch::Tensor loss) {
      reducer.zeroGrad();
      reducer.prepare(/*final_micro=*/true);
      (loss.defined() ? loss : forward(w, c.rank(), step)).backward();
      reducer.finish();
      for (std::size_t i = 0; i < w.size(); ++i) {
        auto ref = torch::zeros({4, 4}, torch::kDouble);
        for (int r = 0; r < world; ++r) {
          std::vector<torch::Tensor> v;
          for (auto& layer : w) v.push_back(layer.detach().clone().requires_grad_(true));
          forward(v, r, step).backward();
          ref += v[i].grad();
        }
        EXPECT_TRUE(torch::equal(w[i].grad(), ref)) << "step " << step << " w" << i;
      }
      torch::NoGradGuard no_grad;
      for (auto& layer : w) layer.sub_(layer.grad().sign());  // stays integer
      ++step;
    };
    torch::Tensor pending;
    {
      Reducer a(c, w, /*bucket_bytes=*/64);  // one layer a bucket
      EXPECT_EQ(hooksOn(w[0]), baseline + 1);
      for (int n = 0; n < 2; ++n) train(a, {});
      pending = forward(w, c.rank(), step);  // its graph outlives A
    }
    for (const auto& p : w) {
      if (hooksOn(p) != baseline) {  // every rank alike: all stop here
        ADD_FAILURE() << "a destroyed Reducer left its hook on a gradient accumulator";
        return;
      }
    }
    Reducer b(c, w, /*bucket_bytes=*/64);
    EXPECT_EQ(hooksOn(w[0]), baseline + 1);
    train(b, pending);
    pending = torch::Tensor();
    for (int n = 0; n < 2; ++n) train(b, {});
    EXPECT_EQ(b.collectivesStarted(), 3 * static_cast<int64_t>(b.bucketCount()));
  });
}

// The time a rank waits in finish() for a slower rank is skew, not network:
// the reducer reports it from every rank's arrival time (Note [overlapped reducer]).
// Both ways of reading the last bucket's tail (Note [host tail]): float host
// buckets through a pointer, any other (here double) through tensor ops, as on a GPU.
TEST(Reducer, WaitingForASlowerRankIsReportedAsSkew) {
  for (auto dtype : {torch::kFloat, torch::kDouble}) {
    runRanks(2, [dtype](Communicator& c) {
      auto w = torch::ones({64, 64}, torch::TensorOptions().dtype(dtype).requires_grad(true));
      Reducer reducer(c, {w}, 1 << 20);
      // Step 0 warms up (a cold first backward can take longer than the sleep).
      for (int step = 0; step < 3; ++step) {
        reducer.zeroGrad();
        reducer.prepare(true, {c.rank() == 1 ? 1.0 : 0.0, 0.5});
        if (c.rank() == 1) std::this_thread::sleep_for(std::chrono::milliseconds(300));
        torch::mm(torch::ones({2, 64}, dtype), w).sum().backward();
        const SideChannel side = reducer.finish();
        EXPECT_DOUBLE_EQ(side[0], 1.0) << dtype;
        EXPECT_DOUBLE_EQ(side[1], 1.0) << dtype;
        if (step == 0) {
          // warm-up: the skew is not checked
        } else if (c.rank() == 0) {
          EXPECT_GT(reducer.lastSkewSeconds(), 0.2) << "step " << step << " " << dtype;
          EXPECT_LT(reducer.lastSkewSeconds(), 2.0) << "step " << step << " " << dtype;
        } else {
          EXPECT_LT(reducer.lastSkewSeconds(), 0.1) << "step " << step << " " << dtype;
        }
        EXPECT_TRUE(torch::allclose(w.grad(), torch::full({64, 64}, 4.0, dtype)));
      }
    });
  }
}

// Note [bucket view layout]: a channels-last weight's gradient view in its bucket
// is channels-last, and the summed gradient is the conv's, over 2 ranks.
TEST(Reducer, AChannelsLastWeightGetsAChannelsLastGradientView) {
  runRanks(2, [](Communicator& c) {
    // The ranks are threads here: each its own generator, the same values.
    auto gen = at::detail::createCPUGenerator(3);
    auto w = at::randn({8, 3, 3, 3}, gen).contiguous(at::MemoryFormat::ChannelsLast).requires_grad_(true);
    auto b = at::randn({8}, gen).requires_grad_(true);
    Reducer reducer(c, {w, b}, 1 << 20);
    const auto x = at::randn({2, 3, 6, 6}, gen).contiguous(at::MemoryFormat::ChannelsLast);
    for (int step = 0; step < 2; ++step) {  // the second after the buckets' rebuild
      reducer.zeroGrad();
      reducer.prepare(true, {});
      torch::conv2d(x * (c.rank() + 1), w, b).square().sum().backward();
      reducer.finish();
      EXPECT_TRUE(w.grad().is_contiguous(at::MemoryFormat::ChannelsLast)) << "step " << step;
      EXPECT_FALSE(w.grad().is_contiguous()) << "step " << step;
      auto v = w.detach().clone().requires_grad_(true);
      auto vb = b.detach().clone().requires_grad_(true);
      (torch::conv2d(x, v, vb).square().sum() + torch::conv2d(2 * x, v, vb).square().sum()).backward();
      EXPECT_TRUE(torch::allclose(w.grad(), v.grad(), 1e-5, 1e-5)) << "step " << step;
      EXPECT_TRUE(torch::allclose(b.grad(), vb.grad(), 1e-5, 1e-5)) << "step " << step;
    }
  });
}

namespace {
/// Runs `loss`'s backward through the chain `w`; with `fail`, the first layer's
/// gradient (the last to come) throws the allocator's out-of-memory type, as a
/// backward that runs out of memory halfway. Returns whether it threw.
bool backwardFailingAtFirstLayer(std::vector<torch::Tensor>& w, const torch::Tensor& loss,
                                 bool fail) {
  const auto hook = w[0].register_hook([fail](const torch::Tensor& g) {
    if (fail) throw c10::OutOfMemoryError({__func__, __FILE__, __LINE__}, "injected");
    return g;
  });
  bool failed = false;
  try {
    loss.backward();
  } catch (const c10::OutOfMemoryError&) {
    failed = true;
  }
  w[0].remove_hook(hook);
  return failed;
}
}  // namespace

// Note [oom back-off]: a rank whose backward fails halfway (after some buckets
// left from hooks), or fails before its final micro-batch, still makes every
// bucket's allreduce, in the same order, and its side channel, set after the
// failure, reaches every rank in that step.
TEST_P(Collectives, ReducerCarriesASideValueSetAfterABackwardThatFailedHalfway) {
  const int world = GetParam();
  runRanks(world, [world](Communicator& c) {
    std::vector<torch::Tensor> w;
    for (int i = 0; i < 6; ++i) w.push_back(torch::full({16, 16}, 0.01 * (i + 1), torch::requires_grad()));
    Reducer reducer(c, w, /*bucket_bytes=*/1024);  // one layer a bucket
    for (int step = 0; step < 4; ++step) {
      const bool fail = step == 1 && c.rank() == world - 1;
      reducer.zeroGrad();
      if (step == 2 && c.rank() == 0) {
        // Failed in an earlier micro-batch of the window: no final backward at all.
        reducer.prepare(false);
        reducer.setSide({1.0, 1.0});
        const SideChannel side = reducer.finish();
        EXPECT_DOUBLE_EQ(side[0], world);
        EXPECT_DOUBLE_EQ(side[1], 1.0);
        continue;
      }
      reducer.prepare(true, {1.0, 0.0});
      const int64_t hooks_before = reducer.startedFromHooks();
      auto x = torch::full({4, 16}, 1.0 + c.rank());
      for (auto& layer : w) x = torch::mm(x, layer);
      // The first layer's gradient comes last: the hook throws once the later
      // layers' buckets have started.
      const bool failed = backwardFailingAtFirstLayer(w, x.sum(), fail);
      EXPECT_EQ(failed, fail);
      if (failed) {
        EXPECT_GE(reducer.startedFromHooks() - hooks_before, 1) << "no bucket left before the failure";
        reducer.setSide({1.0, 1.0});
      }
      const SideChannel side = reducer.finish();
      EXPECT_DOUBLE_EQ(side[0], world) << "step " << step;
      EXPECT_DOUBLE_EQ(side[1], step == 1 || step == 2 ? 1.0 : 0.0) << "step " << step;
    }
  });
}

// Note [gradient sync]: both strategies through the one interface the trainer
// calls, with the same calls: gradients summed in good steps, a rank whose
// backward failed halfway still meets the others and its wish reaches them
// (Note [side channel]), and a model with nothing to train still agrees.
TEST_P(Collectives, EveryGradientSyncSumsAndCarriesTheSideChannelThroughOneInterface) {
  const int world = GetParam();
  for (const bool overlap : {false, true}) {
    SCOPED_TRACE(overlap ? "reducer" : "plain");
    runRanks(world, [world, overlap](Communicator& c) {
      std::vector<torch::Tensor> w;
      for (int i = 0; i < 4; ++i) w.push_back(torch::full({8, 8}, 0.1 * (i + 1), torch::requires_grad()));
      const auto sync = makeGradientSync(overlap, c, w, /*bucket_bytes=*/256);  // a layer a bucket
      EXPECT_GE(sync->bucketCount(), 2u);
      for (int step = 0; step < 3; ++step) {
        const bool fail = step == 1 && c.rank() == world - 1;
        sync->zeroGrad();
        sync->beforeBackward(/*final_micro=*/true);
        auto x = torch::full({2, 8}, 1.0);
        for (auto& layer : w) x = torch::mm(x, layer);
        const bool failed = backwardFailingAtFirstLayer(w, x.sum() * (c.rank() + 1), fail);
        if (failed) sync->backwardFailed();
        const SideChannel side = sync->sumGradients({1.0, failed ? 1.0 : 0.0, 0.0});
        EXPECT_DOUBLE_EQ(side[0], world) << "step " << step;
        EXPECT_DOUBLE_EQ(side[1], step == 1 ? 1.0 : 0.0) << "step " << step;
        if (step == 1) continue;  // discarded by every rank
        // d(sum(x) * (r + 1)) is (r + 1) times rank 0's gradient: the sum is W(W+1)/2 times it.
        const auto one = torch::autograd::grad({[&] {
                                                 auto y = torch::full({2, 8}, 1.0);
                                                 for (auto& layer : w) y = torch::mm(y, layer);
                                                 return y.sum();
                                               }()},
                                               {w[3]})[0];
        EXPECT_TRUE(torch::allclose(w[3].grad(), one * (world * (world + 1) / 2.0)))
            << "step " << step;
      }
      const auto none = makeGradientSync(overlap, c, {}, 256);
      none->zeroGrad();
      none->beforeBackward(true);
      EXPECT_DOUBLE_EQ(none->sumGradients({0.0, 0.0, c.rank() == 0 ? 1.0 : 0.0})[2], 1.0);
    });
  }
}

TEST(Collective, TheSideChannelTailFollowsTheGradientsOfTheLastBucket) {
  const auto plain = tailLayout(100, 0);
  EXPECT_EQ(plain.side, 100);
  EXPECT_EQ(plain.norm, 100 + kSideSlots);
  EXPECT_EQ(plain.size, kSideSlots + 1);
  const auto reducer = tailLayout(100, 4);
  EXPECT_EQ(reducer.side, plain.side);  // one layout: the arrivals only added at the end
  EXPECT_EQ(reducer.norm, plain.norm);
  EXPECT_EQ(reducer.arrivals, plain.norm + 1);
  EXPECT_EQ(reducer.size, kSideSlots + 1 + 4);
}

TEST_P(Collectives, BroadcastCoalescedMakesEveryRankEqualToRoot) {
  runRanks(GetParam(), [](Communicator& c) {
    std::vector<torch::Tensor> ts{torch::full({2, 2}, float(c.rank())),
                                  torch::full({3}, int64_t(c.rank() + 5)),
                                  torch::full({1}, double(c.rank()) * 2)};
    broadcastCoalesced(c, ts, 0);
    EXPECT_TRUE(torch::equal(ts[0], torch::zeros({2, 2})));
    EXPECT_TRUE(torch::equal(ts[1], torch::full({3}, int64_t(5))));
    EXPECT_TRUE(torch::equal(ts[2], torch::zeros({1}, torch::kDouble)));
  });
}

INSTANTIATE_TEST_SUITE_P(Ranks, Collectives, ::testing::Values(2, 3, 4));

TEST(Collective, MissingPeerTimesOutWithACollectiveError) {
  const auto start = std::chrono::steady_clock::now();
  std::string message;
  runRanks(
      2,
      [&](Communicator& c) {
        if (c.rank() == 0) {
          auto t = torch::ones({1});
          try {
            c.allreduce(t, ReduceOp::kSum);
          } catch (const CollectiveError& e) {
            message = e.what();
          }
        } else {
          std::this_thread::sleep_for(std::chrono::milliseconds(2500));
        }
      },
      std::chrono::milliseconds(1000));
  const double secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_NE(message.find("allreduce #1 failed"), std::string::npos) << message;
  EXPECT_NE(message.find("dist.timeout_s"), std::string::npos) << message;
  // Note [stall report]: the rank that never arrived is named, with its host.
  EXPECT_NE(message.find("Did not reach it: rank 1 (host "), std::string::npos) << message;
  EXPECT_LT(secs, 20.0);
}

TEST(Collective, BackendChoiceListsWhatThisBuildHas) {
  EXPECT_EQ(resolveBackend("auto", at::kCPU), "gloo");
  // One host: MPI when it is initialised (not in this test binary).
  EXPECT_EQ(resolveBackend("auto", at::kCPU, /*one_host=*/true), mpiAvailable() ? "mpi" : "gloo");
  EXPECT_EQ(resolveBackend("gloo", at::kCPU), "gloo");
  EXPECT_EQ(resolveBackend("mpi", at::kCPU), "mpi");
  try {
    resolveBackend("tcp", at::kCPU);
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("unknown backend 'tcp'; this build has: auto, gloo, mpi"),
              std::string::npos) << e.what();
  }
  EXPECT_THROW(resolveBackend("nccl", at::kCPU), ConfigError);
}

TEST(Collective, InterfaceChoice) {
  EXPECT_EQ(chooseAddress("", /*all_ranks_local=*/true), "127.0.0.1");
  std::string chosen;
  EXPECT_EQ(chooseAddress("lo", false, &chosen), "127.0.0.1");
  EXPECT_EQ(chosen, "lo");
  try {
    chooseAddress("nosuchif0", false);
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("no interface 'nosuchif0'"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("lo (127.0.0.1)"), std::string::npos);
  }
}
