#include "collective/communicator.h"

#include <ATen/ATen.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

namespace batchdist::collective {

namespace {
std::atomic<uint64_t> collectives_started{0};
}  // namespace

uint64_t collectivesStarted() { return collectives_started.load(std::memory_order_relaxed); }
void countCollectiveStart() { collectives_started.fetch_add(1, std::memory_order_relaxed); }

void PendingWork::trace(const std::string& name) {
  if (trace::on()) range_ = std::make_shared<trace::AsyncRange>(name);
}

std::string bucketTraceName(const char* op, std::size_t index, const at::Tensor& t) {
  const double bytes = static_cast<double>(t.nbytes());
  char size[32];
  if (bytes < (1 << 20)) {
    std::snprintf(size, sizeof size, "%.0f KB", bytes / 1024);
  } else {
    std::snprintf(size, sizeof size, "%.1f MB", bytes / (1 << 20));
  }
  return std::string("batchdist/") + op + " bucket " + std::to_string(index) + " (" + size + ")";
}

std::vector<double> Communicator::allreduce(const std::vector<double>& values, ReduceOp op) {
  if (values.empty()) return {};
  auto t = at::tensor(values, at::kDouble).to(device());
  allreduce(t, op);
  t = t.cpu();
  return std::vector<double>(t.data_ptr<double>(), t.data_ptr<double>() + t.numel());
}

void Communicator::reduceScatter(const at::Tensor& input, at::Tensor& output, ReduceOp op) {
  reduceScatterAsync(input, output, op)->wait();
}

void Communicator::allgatherInto(const at::Tensor& input, at::Tensor& output) {
  allgatherIntoAsync(input, output)->wait();
}

double Communicator::allreduce(double value, ReduceOp op) {
  return allreduce(std::vector<double>{value}, op)[0];
}

bool Communicator::any(bool flag) { return allreduce(flag ? 1.0 : 0.0, ReduceOp::kMax) > 0.5; }

std::vector<double> Communicator::allgather(double value) {
  auto t = allgather(at::tensor({value}, at::kDouble).to(device())).cpu().reshape({-1});
  return std::vector<double>(t.data_ptr<double>(), t.data_ptr<double>() + t.numel());
}

std::string Communicator::broadcast(const std::string& value, int root) {
  auto len = at::tensor({static_cast<int64_t>(value.size())}, at::kLong).to(device());
  broadcast(len, root);
  const int64_t n = len.cpu().item<int64_t>();
  auto bytes = at::zeros({std::max<int64_t>(n, 1)}, at::kByte);
  if (rank() == root && n > 0) std::memcpy(bytes.data_ptr(), value.data(), n);
  bytes = bytes.to(device());
  broadcast(bytes, root);
  bytes = bytes.cpu();
  return std::string(reinterpret_cast<const char*>(bytes.data_ptr()), n);
}

}  // namespace batchdist::collective
