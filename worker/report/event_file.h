#pragma once
// One TensorBoard event file: TFRecord framing and Event messages (Note
// [tensorboard events] in worker/report/tensorboard.h says what goes in it).
//
// Note [event file library]: this file and event_file.cc are compiled without
// LibTorch's include directories (worker/CMakeLists.txt: batchdist_event_file).
// The pip torch wheel ships protobuf headers of its own in torch/include; code
// that includes the generated messages must see the headers of the libprotobuf it
// links (Debian's), whatever version the wheel bundles. So nothing here may
// include torch, the communicator or the trainer.

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace batchdist::worker {

/// CRC-32C (Castagnoli) of `n` bytes: crc32c("123456789") = 0xE3069283.
uint32_t crc32c(const void* data, std::size_t n);

/// The masked CRC TFRecord stores: ((crc >> 15) | (crc << 17)) + 0xa282ead8.
uint32_t maskCrc(uint32_t crc);

/// One TFRecord: length, masked CRC of the length, data, masked CRC of the data.
std::string tfRecord(std::string_view data);

/// One scalar of an event: a TensorBoard tag and its value.
using Scalar = std::pair<std::string, double>;

/// A serialised Event with one Summary value per scalar.
std::string scalarEvent(double wall_time, int64_t step, const std::vector<Scalar>& values);

/// One TensorBoard event file, appended as the run goes. Rank 0 only.
class EventFileWriter {
 public:
  /// Creates a new events.out.tfevents.<unix seconds>.<host> file in `dir`
  /// (made if missing) and writes its file-version event and a SessionLog START
  /// at `first_step`. When the file cannot be made, warns once on stderr and
  /// writes nothing.
  EventFileWriter(const std::string& dir, int64_t first_step);
  ~EventFileWriter();
  EventFileWriter(const EventFileWriter&) = delete;
  EventFileWriter& operator=(const EventFileWriter&) = delete;

  /// Appends one event of `values` at `step` (one write); after a failed
  /// write, warns once and writes no more.
  void scalars(int64_t step, const std::vector<Scalar>& values);
  /// The file (empty when it could not be made).
  const std::string& path() const { return path_; }
  /// False once creating or writing the file failed.
  bool ok() const { return fd_ >= 0; }

 private:
  void writeEvent(const std::string& event);
  void fail(const std::string& why);
  std::string path_;
  int fd_ = -1;
};

}  // namespace batchdist::worker
