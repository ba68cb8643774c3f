// reduceScatter and allgatherInto (Note [flat collectives]) on real ranks, over each
// backend a CPU build has, in groups of 1 .. N ranks (mpirun -np N): every rank's
// slice reduced, the gathers concatenated in rank order, the async forms equal to
// the blocking ones, in place, the round trip equal to an allreduce, and the
// shapes refused with a message that names them.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <functional>
#include <string>
#include <vector>

#include "common/error.h"
#include "mpi_helpers.h"

using namespace batchdist;
using collective::Communicator;
using collective::ReduceOp;

namespace {

class FlatCollectives : public ::testing::TestWithParam<std::string> {
 protected:
  /// Runs fn(comm) in a group of W ranks over this test's backend, for every W the
  /// job has.
  void forEachGroup(const std::function<void(Communicator&)>& fn) {
    for (int W = 1; W <= mpitest::worldSize(); ++W) mpitest::inGroup(W, fn, GetParam());
  }
};

/// float32, float64 and int64 everywhere; on mpi also half and bfloat16, which it
/// reduces in float and gathers as 16-bit integers. (Gloo on LibTorch 1.13 has no
/// bfloat16.)
std::vector<at::ScalarType> dtypesOf(const std::string& backend) {
  if (backend == "mpi") return {at::kFloat, at::kDouble, at::kLong, at::kHalf, at::kBFloat16};
  return {at::kFloat, at::kDouble, at::kLong};
}

/// Rank q's flat buffer of `numel` elements: integers in [-5, 5] (sums over 4 ranks
/// are exact in every dtype), and which rank holds the maximum changes from one
/// element to the next.
at::Tensor rankData(int q, int64_t numel, at::ScalarType dtype = at::kDouble) {
  return at::arange(numel, at::kLong).mul(3).add(5 * q).remainder(11).sub(5).to(dtype);
}

/// What rank r's reduceScatter output holds: `op` over the W ranks of their slice r.
at::Tensor expectedSlice(int r, int W, int64_t n, ReduceOp op) {
  std::vector<at::Tensor> rows;
  for (int q = 0; q < W; ++q) rows.push_back(rankData(q, W * n).narrow(0, r * n, n));
  const auto all = at::stack(rows);
  if (op == ReduceOp::kSum) return all.sum(0);
  return op == ReduceOp::kMax ? all.amax(0) : all.amin(0);
}

/// Rank q's all-gather input: q x 16 + j (exact in every dtype tested).
at::Tensor gatherData(int q, int64_t n, at::ScalarType dtype) {
  return at::arange(n, at::kDouble).add(16.0 * q).to(dtype);
}

/// The CollectiveError's message that fn() throws, or "(no error)".
std::string errorOf(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const CollectiveError& e) {
    return e.what();
  }
  return "(no error)";
}

bool has(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

}  // namespace

TEST_P(FlatCollectives, ReduceScatterGivesEachRankTheSumMinAndMaxOfItsSlice) {
  const std::string backend = GetParam();
  forEachGroup([&](Communicator& comm) {
    const int W = comm.size();
    const int r = comm.rank();
    EXPECT_EQ(comm.nativeFlatCollectives(), backend != "gloo") << backend;
    for (const auto dtype : dtypesOf(backend)) {
      for (const int64_t n : {1, 7}) {
        for (const auto op : {ReduceOp::kSum, ReduceOp::kMin, ReduceOp::kMax}) {
          const auto input = rankData(r, W * n, dtype);
          const auto before = input.clone();
          auto output = at::full({n}, 99, at::TensorOptions().dtype(dtype));
          comm.reduceScatter(input, output, op);
          EXPECT_EQ(output.scalar_type(), dtype);
          EXPECT_TRUE(at::equal(output.to(at::kDouble), expectedSlice(r, W, n, op)))
              << backend << " W=" << W << " rank " << r << " " << dtype << " n=" << n
              << " op " << static_cast<int>(op) << ": " << output;
          EXPECT_TRUE(at::equal(input, before)) << "the input changed: " << input;
        }
      }
    }
  });
}

TEST_P(FlatCollectives, AllgatherIntoConcatenatesTheRanksInputsInRankOrder) {
  const std::string backend = GetParam();
  forEachGroup([&](Communicator& comm) {
    const int W = comm.size();
    for (const auto dtype : dtypesOf(backend)) {
      for (const int64_t n : {1, 7}) {
        const auto input = gatherData(comm.rank(), n, dtype);
        auto output = at::full({W * n}, -1, at::TensorOptions().dtype(dtype));
        comm.allgatherInto(input, output);
        std::vector<at::Tensor> parts;
        for (int q = 0; q < W; ++q) parts.push_back(gatherData(q, n, dtype));
        EXPECT_TRUE(at::equal(output, at::cat(parts)))
            << backend << " W=" << W << " " << dtype << " n=" << n << ": " << output;
      }
    }
  });
}

// Several collectives in flight at once, waited for out of order, with progress()
// between (as the reducer's hooks call it): bitwise what the blocking calls give,
// on data that is not integer-valued.
TEST_P(FlatCollectives, AsyncFormsEqualTheBlockingOnes) {
  forEachGroup([](Communicator& comm) {
    const int W = comm.size();
    const int64_t n = 7;
    const auto x = at::arange(W * n, at::kFloat).add(0.37f * comm.rank()).sin();
    const auto y = at::arange(n, at::kDouble).add(comm.rank()).sqrt();
    auto sum = at::empty({n}, at::kFloat);
    auto max = at::empty({n}, at::kFloat);
    auto all = at::empty({W * n}, at::kDouble);
    comm.reduceScatter(x, sum, ReduceOp::kSum);
    comm.reduceScatter(x, max, ReduceOp::kMax);
    comm.allgatherInto(y, all);

    auto sum_async = at::full({n}, -7.0f);
    auto max_async = at::full({n}, -7.0f);
    auto all_async = at::full({W * n}, -7.0, at::kDouble);
    auto w_sum = comm.reduceScatterAsync(x, sum_async, ReduceOp::kSum);
    auto w_all = comm.allgatherIntoAsync(y, all_async);
    auto w_max = comm.reduceScatterAsync(x, max_async, ReduceOp::kMax);
    for (auto* w : {w_sum.get(), w_all.get(), w_max.get()}) w->progress();
    w_max->wait();
    w_all->wait();
    w_sum->wait();
    w_sum->wait();  // a second wait() is harmless
    EXPECT_TRUE(at::equal(sum_async, sum)) << sum_async << " vs " << sum;
    EXPECT_TRUE(at::equal(max_async, max)) << max_async << " vs " << max;
    EXPECT_TRUE(at::equal(all_async, all)) << all_async << " vs " << all;
  });
}

// Summation order may differ between a reduce-scatter and an allreduce (and
// between backends), so the round trip is compared bitwise on integer-valued
// data, where every order gives the same sum, and to a tolerance otherwise.
TEST_P(FlatCollectives, ReduceScatterThenAllgatherEqualsAnAllreduce) {
  forEachGroup([](Communicator& comm) {
    const int W = comm.size();
    for (const auto dtype : {at::kFloat, at::kDouble, at::kLong}) {
      for (const int64_t n : {1, 7}) {
        const auto x = rankData(comm.rank(), W * n, dtype);
        auto shard = at::empty({n}, x.options());
        auto full = at::empty({W * n}, x.options());
        comm.reduceScatter(x, shard, ReduceOp::kSum);
        comm.allgatherInto(shard, full);
        auto reduced = x.clone();
        comm.allreduce(reduced, ReduceOp::kSum);
        EXPECT_TRUE(at::equal(full, reduced)) << dtype << " n=" << n << ": " << full << reduced;
      }
    }
    const auto x = at::arange(W * 5, at::kFloat).mul(0.1f + comm.rank()).cos();
    auto shard = at::empty({5}, at::kFloat);
    auto full = at::empty({W * 5}, at::kFloat);
    comm.reduceScatter(x, shard, ReduceOp::kSum);
    comm.allgatherInto(shard, full);
    auto reduced = x.clone();
    comm.allreduce(reduced, ReduceOp::kSum);
    EXPECT_TRUE(at::allclose(full, reduced, 1e-5, 1e-5)) << full << reduced;
  });
}

// Note [flat collectives]: output may be input's slot of this rank (reduceScatter),
// input output's (allgatherInto); the rest of the buffer is left as it was; n = 0
// moves nothing.
TEST_P(FlatCollectives, InPlaceSlotsAndEmptySlicesWork) {
  forEachGroup([](Communicator& comm) {
    const int W = comm.size();
    const int r = comm.rank();
    const int64_t n = 7;
    const auto x = rankData(r, W * n, at::kFloat);
    auto buffer = x.clone();
    auto slot = buffer.narrow(0, r * n, n);
    comm.reduceScatter(buffer, slot, ReduceOp::kSum);
    EXPECT_TRUE(at::equal(slot.to(at::kDouble), expectedSlice(r, W, n, ReduceOp::kSum))) << slot;
    auto outside = at::ones({W * n}, at::kBool);
    outside.narrow(0, r * n, n).fill_(false);
    EXPECT_TRUE(at::equal(buffer.masked_select(outside), x.masked_select(outside)))
        << "reduceScatter in place wrote outside its slot: " << buffer;

    auto gathered = at::full({W * n}, -1.0f);
    gathered.narrow(0, r * n, n).copy_(gatherData(r, n, at::kFloat));
    comm.allgatherInto(gathered.narrow(0, r * n, n), gathered);
    std::vector<at::Tensor> parts;
    for (int q = 0; q < W; ++q) parts.push_back(gatherData(q, n, at::kFloat));
    EXPECT_TRUE(at::equal(gathered, at::cat(parts))) << gathered;

    auto none = at::empty({0}, at::kFloat);
    auto none_out = at::empty({0}, at::kFloat);
    comm.reduceScatter(none, none_out, ReduceOp::kSum);
    comm.allgatherInto(none, none_out);
    auto works = at::ones({1});  // nothing was left half-started
    comm.allreduce(works, ReduceOp::kSum);
    EXPECT_EQ(works.item<float>(), W);
  });
}

TEST_P(FlatCollectives, BadShapesAreRefusedNamingWhatWasPassed) {
  const std::string backend = GetParam();
  forEachGroup([&](Communicator& comm) {
    const int W = comm.size();
    const int64_t n = 3;
    auto out = at::zeros({n});
    const std::string two_d =
        errorOf([&] { comm.reduceScatter(at::zeros({W, n}), out, ReduceOp::kSum); });
    EXPECT_TRUE(has(two_d, "reduceScatter (" + backend) && has(two_d, "input is 2-D") &&
                has(two_d, "[" + std::to_string(W) + ", 3]") &&
                has(two_d, "Note [flat collectives]"))
        << two_d;
    auto wrong = at::zeros({n + 1});
    const std::string size =
        errorOf([&] { comm.reduceScatter(at::zeros({W * n}), wrong, ReduceOp::kSum); });
    EXPECT_TRUE(has(size, "input has " + std::to_string(W * n) + " elements, not " +
                              std::to_string(W) + " x the 4 of output"))
        << size;
    auto doubles = at::zeros({n}, at::kDouble);
    const std::string dtype =
        errorOf([&] { comm.reduceScatter(at::zeros({W * n}), doubles, ReduceOp::kMax); });
    EXPECT_TRUE(has(dtype, "differ in dtype") && has(dtype, "Double")) << dtype;
    const auto strided = at::zeros({2 * W * n}).slice(0, 0, 2 * W * n, 2);
    const std::string layout = errorOf([&] { comm.reduceScatter(strided, out, ReduceOp::kSum); });
    EXPECT_TRUE(has(layout, "input is not contiguous")) << layout;
    auto gathered = at::zeros({W * n + 1});
    const std::string gather = errorOf([&] { comm.allgatherInto(at::zeros({n}), gathered); });
    EXPECT_TRUE(has(gather, "allgatherInto (" + backend) && has(gather, "output has")) << gather;
    // Overlapping, but not as this rank's slot.
    auto arena = at::zeros({W * n + 1});
    auto view = arena.narrow(0, 0, W * n);
    const std::string overlap = errorOf([&] { comm.allgatherInto(arena.narrow(0, 1, n), view); });
    EXPECT_TRUE(has(overlap, "input overlaps output")) << overlap;
    auto t = at::ones({2});  // nothing was started: the group still agrees
    comm.allreduce(t, ReduceOp::kSum);
    EXPECT_EQ(t[0].item<float>(), W);
  });
}

INSTANTIATE_TEST_SUITE_P(
    Backends, FlatCollectives, ::testing::Values("gloo", "mpi"),
    [](const ::testing::TestParamInfo<std::string>& info) { return info.param; });
