// Note [parameter units] with ranks as threads: each unit's parameters are freed
// between uses and gathered whole around its forward and its backward; a chain of
// units trains as plain data parallel; at most two units are whole at once.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "common/error.h"
#include "tests/thread_ranks.h"
#include "worker/config/config.h"
#include "worker/model/units.h"
#include "worker/train/shard/param_units.h"
#include "worker/train/step/update_strategy.h"

using namespace batchdist;
using namespace batchdist::worker;

namespace {

using testsupport::runRanks;

Config config(const std::string& shard, bool reshard = true, bool prefetch = true) {
  return parseConfig("dist: {shard: " + shard +
                         (reshard ? std::string() : ", reshard_after_forward: false") +
                         (prefetch ? std::string() : ", prefetch: false") + "}\n"
                         "model: {name: mlp}\n"
                         "optim: {name: sgd, lr: 0.1, momentum: 0.9, weight_decay: 0.01}\n",
                     "param_units_test.yaml");
}

/// Three layers of 7 -> 9 -> 5 -> 3 (weight and bias each), the same on every rank
/// without torch's global generator (the rank threads share it). 140 elements:
/// the chunks of 2 and 3 ranks end inside parameters.
std::vector<torch::Tensor> layers() {
  const auto wave = [](int64_t n, double f) { return torch::sin(torch::arange(n) * f) * 0.3; };
  return {wave(9 * 7, 0.37).view({9, 7}).requires_grad_(), wave(9, 1.1).requires_grad_(),
          wave(5 * 9, 0.53).view({5, 9}).requires_grad_(), wave(5, 0.7).requires_grad_(),
          wave(3 * 5, 0.29).view({3, 5}).requires_grad_(), wave(3, 1.9).requires_grad_()};
}

std::vector<ParamUnit> unitsOf(const std::vector<torch::Tensor>& ps) {
  return {{"l0", {ps[0], ps[1]}, {}}, {"l1", {ps[2], ps[3]}, {}}, {"head", {ps[4], ps[5]}, {}}};
}

/// The chain, each layer its unit (ReLU between).
torch::Tensor forward(UnitHooks* hooks, const std::vector<torch::Tensor>& ps, const torch::Tensor& x) {
  auto h = x;
  for (std::size_t k = 0; k < 3; ++k) {
    h = runUnit(hooks, k, [&](const torch::Tensor& in) {
      const auto y = at::linear(in, ps[2 * k], ps[2 * k + 1]);
      return k < 2 ? torch::relu(y) : y;
    }, h);
  }
  return h;
}

torch::Tensor inputOf(int rank, int64_t step, int64_t micro) {
  const double f = 0.13 * (rank + 1) + 0.05 * static_cast<double>(step) + 0.31 * static_cast<double>(micro);
  return torch::cos(torch::arange(4 * 7) * f).view({4, 7});
}

struct Trained {
  std::vector<torch::Tensor> weights;  ///< the last rank's, whole
  int64_t gathers = 0, prefetched = 0, peak_live = 0, live_after = 0;
  int64_t failed_steps = 0;            ///< steps some rank failed, redone (Note [oom back-off])
};

/// An out-of-memory on one rank: in step `step`'s micro-batch `micro`, before
/// unit 1's forward (prefetched by then) or as the first parameter's gradient
/// arrives (the end of backward).
struct Fault {
  int rank = -1;
  int64_t step = 0, micro = 0;
  bool forward = true;
};

/// Micro-batch `k` of step `s` on this rank, throwing where `fault` says (once:
/// the redone step runs clean).
void microBatch(UnitHooks* units, std::vector<torch::Tensor>& ps, int rank, int64_t s, int64_t k,
                Fault& fault) {
  const bool fails = fault.rank == rank && fault.step == s && fault.micro == k;
  if (fails) fault.rank = -1;
  if (fails && fault.forward) units->failBeforeUnit(1);
  std::optional<unsigned> hook;
  if (fails && !fault.forward) {
    hook = ps[0].register_hook([](const torch::Tensor&) -> torch::Tensor {
      throw c10::OutOfMemoryError({__func__, __FILE__, static_cast<uint32_t>(__LINE__)}, "injected");
    });
  }
  try {
    forward(units, ps, inputOf(rank, s, k)).square().mean().backward();
  } catch (...) {
    if (hook) ps[0].remove_hook(*hook);
    throw;
  }
  if (hook) ps[0].remove_hook(*hook);
}

/// 3 steps of `micros` micro-batches of the chain under `shard` on `world` ranks;
/// a step some rank failed (`fault`) is dropped and redone, as the trainer does.
Trained train(const std::string& shard, int world, int64_t micros, bool reshard = true,
              bool prefetch = true, const Fault& fault = {},
              std::chrono::milliseconds timeout = std::chrono::seconds(30)) {
  Trained out;
  runRanks(world, [&](collective::Communicator& c) {
    auto ps = layers();
    auto u = makeUpdateStrategy(config(shard, reshard, prefetch), c, ps, unitsOf(ps));
    auto* units = dynamic_cast<ParamUnits*>(u->unitHooks());
    ASSERT_EQ(units != nullptr, shard == "parameters");
    Fault pending = fault;
    for (int64_t s = 0; s < 3; ++s) {
      u->zeroGrad();
      collective::SideChannel side{};
      for (int64_t k = 0; k < micros; ++k) {
        u->beforeBackward(k, micros);
        try {
          microBatch(units, ps, c.rank(), s, k, pending);
        } catch (const c10::OutOfMemoryError&) {
          u->backwardFailed();  // Note [collective replay]: the rest of the step's collectives
          side[2] = 1;
          break;
        }
      }
      if (u->sumGradients(side)[2] > 0) {  // every rank drops the step and redoes it
        u->dropGrad();
        if (c.rank() == world - 1) ++out.failed_steps;
        --s;
        continue;
      }
      EXPECT_TRUE(u->step(0.1));
    }
    if (units) {
      if (c.rank() == world - 1) {
        out.gathers = units->gathers();
        out.prefetched = units->prefetched();
        out.peak_live = units->peakLiveUnits();
      }
      units->gatherAll();
    }
    if (c.rank() == world - 1) {
      for (const auto& p : ps) out.weights.push_back(p.detach().clone());
    }
    if (units) {
      units->releaseAll(false);
      if (c.rank() == world - 1) out.live_after = units->liveUnits();
    }
  }, timeout);
  return out;
}

}  // namespace

TEST(ParamUnits, AFreedUnitHoldsNoMemoryAndGathersBackWhole) {
  runRanks(3, [&](collective::Communicator& c) {
    auto ps = layers();
    const auto before = layers();
    ParamUnits units(c, ps, unitsOf(ps), /*reshard_after_forward=*/true);
    EXPECT_EQ(units.layout().segments.size(), 3u);
    EXPECT_EQ(units.layout().total, 140);
    EXPECT_EQ(units.liveUnits(), 0);
    EXPECT_EQ(ps[2].storage().nbytes(), 0u) << "a unit's memory is freed at construction";
    EXPECT_EQ(ps[2].storage().data(), nullptr);
    units.gatherAll();
    EXPECT_EQ(units.liveUnits(), 3);
    for (std::size_t i = 0; i < ps.size(); ++i) EXPECT_TRUE(torch::equal(ps[i], before[i])) << i;
    units.releaseAll(false);
    EXPECT_EQ(units.liveUnits(), 0);
    EXPECT_EQ(ps[0].storage().data(), nullptr);
  });
}

// The same updates as plain data parallel (the chain is small enough that the
// summation order is the allreduce's: 1e-6 of max |w|), with and without
// accumulation, on 2 and 3 ranks.
TEST(ParamUnits, TrainsAsPlainDataParallel) {
  for (const int world : {2, 3}) {
    for (const int64_t micros : {1, 2}) {
      const auto plain = train("none", world, micros);
      const auto sharded = train("parameters", world, micros);
      ASSERT_EQ(sharded.weights.size(), plain.weights.size());
      for (std::size_t i = 0; i < plain.weights.size(); ++i) {
        const double diff = (sharded.weights[i] - plain.weights[i]).abs().max().item<double>();
        EXPECT_LE(diff, 1e-6 * plain.weights[i].abs().max().item<double>())
            << "W = " << world << ", accumulation " << micros << ", parameter " << i;
      }
    }
  }
}

// Per micro-batch: each unit gathered before its forward and again before its
// backward (2 x 3), at most two whole at once, none after the step; without
// resharding once (3), and all three whole at the end of forward.
TEST(ParamUnits, GathersPerMicroBatchAndBoundsTheUnitsAlive) {
  const auto reshard = train("parameters", 2, 2);
  EXPECT_EQ(reshard.gathers, 3 * 2 * 6) << "3 steps x 2 micro-batches x (3 + 3)";
  EXPECT_LE(reshard.peak_live, 2);
  EXPECT_EQ(reshard.live_after, 0);
  const auto kept = train("parameters", 2, 2, /*reshard=*/false);
  EXPECT_EQ(kept.gathers, 3 * 2 * 3);
  EXPECT_EQ(kept.peak_live, 3);
  EXPECT_EQ(kept.live_after, 0);
  for (std::size_t i = 0; i < kept.weights.size(); ++i) {
    EXPECT_TRUE(torch::equal(kept.weights[i], reshard.weights[i])) << i;
  }
}

// dist.prefetch: per micro-batch the forward starts units 1 and 2 ahead and the
// backward units 1 and 0 (4 of the 6 gathers); the same weights bit for bit, and
// still at most two units whole at once. Off: every gather waits.
TEST(ParamUnits, PrefetchStartsTheNextUnitAheadAndChangesNothingElse) {
  const auto on = train("parameters", 3, 2);
  const auto off = train("parameters", 3, 2, /*reshard=*/true, /*prefetch=*/false);
  EXPECT_EQ(on.prefetched, 3 * 2 * 4);
  EXPECT_EQ(off.prefetched, 0);
  EXPECT_EQ(on.gathers, off.gathers);
  EXPECT_LE(on.peak_live, 2);
  EXPECT_EQ(on.live_after, 0);
  ASSERT_EQ(on.weights.size(), off.weights.size());
  for (std::size_t i = 0; i < on.weights.size(); ++i) {
    EXPECT_TRUE(torch::equal(on.weights[i], off.weights[i])) << i;
  }
}

// Note [collective replay]: a rank out of memory halfway through a step's
// forward (unit 1's gather prefetched) or at the end of its backward, in the
// first or the second micro-batch, makes the unit collectives the others go on
// making; nobody waits, every rank drops the step, and the redone step trains
// exactly as if nothing had failed. The first micro-batch of all has no pattern
// to replay: the step after it is the earliest that can fail this way.
TEST(ParamUnits, ARankOutOfMemoryMidStepReplaysTheOthersCollectives) {
  for (const int world : {2, 3}) {
    const auto clean = train("parameters", world, 2);
    for (const Fault fault : {Fault{1, 1, 0, true}, Fault{world - 1, 1, 1, false},
                              Fault{0, 2, 1, true}, Fault{0, 1, 0, false}}) {
      const auto failed = train("parameters", world, 2, true, true, fault);
      EXPECT_EQ(failed.failed_steps, 1);
      EXPECT_EQ(failed.live_after, 0);
      EXPECT_LE(failed.peak_live, 2);
      ASSERT_EQ(failed.weights.size(), clean.weights.size());
      for (std::size_t i = 0; i < clean.weights.size(); ++i) {
        EXPECT_TRUE(torch::equal(failed.weights[i], clean.weights[i]))
            << "W = " << world << ", rank " << fault.rank << " fails step " << fault.step
            << " micro-batch " << fault.micro << (fault.forward ? " forward" : " backward")
            << ", parameter " << i;
      }
    }
  }
}

// Without a whole micro-batch before it there is nothing to replay: the rank
// says so (the other, left in a gather, times out; in a run the launcher ends it).
TEST(ParamUnits, AFailureBeforeAnyWholeMicroBatchStopsWithTheReason) {
  try {
    train("parameters", 2, 2, true, true, Fault{0, 0, 0, true}, std::chrono::seconds(3));
    FAIL() << "expected a TrainingError";
  } catch (const TrainingError& e) {
    EXPECT_NE(std::string(e.what()).find("out of memory on rank 0 under dist.shard: parameters "
                                         "before a micro-batch had completed"),
              std::string::npos)
        << e.what();
  }
}

// Note [parameter units]: the memory model's working set is two neighbouring
// units and what they use (the chain: 72 + 50 floats), or every unit without
// resharding after forward; a head that reads the first unit brings it in.
TEST(ParamUnits, TheWorkingSetIsTwoNeighboursAndWhatTheyUse) {
  const auto ps = layers();
  auto units = unitsOf(ps);
  EXPECT_EQ(unitWorkingBytes(units, true), (72 + 50) * 4);
  EXPECT_EQ(unitWorkingBytes(units, false), 140 * 4);
  units[2].uses = {0};
  EXPECT_EQ(unitWorkingBytes(units, true), 140 * 4);
  EXPECT_EQ(unitWorkingBytes({units[1]}, true), 50 * 4);
}
