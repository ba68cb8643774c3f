#include "worker/report/event_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <iostream>

#include "common/error.h"
#include "common/host.h"
#include "tensorboard_event.pb.h"

namespace batchdist::worker {

namespace fs = std::filesystem;
namespace pb = batchdist::tensorboard;

namespace {

// Reflected Castagnoli polynomial (CRC-32C, as in iSCSI and TFRecord).
constexpr uint32_t kCastagnoli = 0x82F63B78u;

constexpr std::array<uint32_t, 256> crcTable() {
  std::array<uint32_t, 256> t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ kCastagnoli : c >> 1;
    t[i] = c;
  }
  return t;
}
constexpr auto kCrcTable = crcTable();

void putLe(std::string& out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

double wallSeconds() {
  using namespace std::chrono;
  return duration<double>(system_clock::now().time_since_epoch()).count();
}

std::string serialise(const pb::Event& e) {
  std::string out;
  if (!e.SerializeToString(&out)) throw Error("cannot serialise a TensorBoard event");
  return out;
}

}  // namespace

uint32_t crc32c(const void* data, std::size_t n) {
  const auto* p = static_cast<const unsigned char*>(data);
  uint32_t c = 0xFFFFFFFFu;
  for (std::size_t i = 0; i < n; ++i) c = kCrcTable[(c ^ p[i]) & 0xff] ^ (c >> 8);
  return c ^ 0xFFFFFFFFu;
}

uint32_t maskCrc(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xa282ead8u; }

std::string tfRecord(std::string_view data) {
  std::string out;
  out.reserve(data.size() + 16);
  putLe(out, data.size(), 8);
  putLe(out, maskCrc(crc32c(out.data(), 8)), 4);
  out.append(data);
  putLe(out, maskCrc(crc32c(data.data(), data.size())), 4);
  return out;
}

std::string scalarEvent(double wall_time, int64_t step, const std::vector<Scalar>& values) {
  pb::Event e;
  e.set_wall_time(wall_time);
  e.set_step(step);
  auto* summary = e.mutable_summary();
  for (const auto& [tag, value] : values) {
    auto* v = summary->add_value();
    v->set_tag(tag);
    v->set_simple_value(static_cast<float>(value));
  }
  return serialise(e);
}

EventFileWriter::EventFileWriter(const std::string& dir, int64_t first_step) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) {
    fail(strCat("cannot create the directory ", dir, ": ", ec.message()));
    return;
  }
  const double now = wallSeconds();
  const std::string base = strCat((fs::path(dir) / "events.out.tfevents.").string(),
                                  static_cast<int64_t>(now), ".", hostName());
  // Note [tensorboard events]: a new name each time, sorting after any file of
  // the same second (a resume within a second of its checkpoint's run): .001 ...
  // .999, zero-padded so that name order stays creation order.
  for (int n = 0; n < 1000 && fd_ < 0; ++n) {
    char suffix[8];
    std::snprintf(suffix, sizeof suffix, ".%03d", n);
    path_ = n == 0 ? base : base + suffix;
    fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_APPEND | O_CLOEXEC, 0644);
    if (fd_ < 0 && errno != EEXIST) break;
  }
  if (fd_ < 0) {
    fail(strCat("cannot create ", path_, ": ", std::strerror(errno)));
    path_.clear();
    return;
  }
  try {
    pb::Event version;
    version.set_wall_time(now);
    version.set_file_version("brain.Event:2");
    writeEvent(serialise(version));
    pb::Event start;
    start.set_wall_time(now);
    start.set_step(first_step);
    start.mutable_session_log()->set_status(pb::SessionLog::START);
    writeEvent(serialise(start));
  } catch (const std::exception& e) {
    fail(e.what());
  }
}

EventFileWriter::~EventFileWriter() {
  if (fd_ >= 0) ::close(fd_);
}

void EventFileWriter::scalars(int64_t step, const std::vector<Scalar>& values) {
  if (fd_ < 0 || values.empty()) return;
  try {
    writeEvent(scalarEvent(wallSeconds(), step, values));
  } catch (const std::exception& e) {
    fail(e.what());
  }
}

void EventFileWriter::writeEvent(const std::string& event) {
  if (fd_ < 0) return;
  const std::string record = tfRecord(event);
  // One write per record (O_APPEND): a kill loses at most this event.
  const ssize_t n = ::write(fd_, record.data(), record.size());
  if (n != static_cast<ssize_t>(record.size())) {
    fail(n < 0 ? strCat("cannot write ", path_, ": ", std::strerror(errno))
               : strCat("cannot write ", path_, ": short write"));
  }
}

void EventFileWriter::fail(const std::string& why) {
  std::cerr << strCat("batchdist: warning: TensorBoard events are not written from here on "
                      "(report.tensorboard: false turns them off): ", why, "\n")
            << std::flush;
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

}  // namespace batchdist::worker
