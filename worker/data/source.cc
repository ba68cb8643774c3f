#include "worker/data/source.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "worker/common/files.h"

namespace batchdist::worker {
namespace {

/// Largest encoded sample read (a 1 GB "JPEG" is a mistake, not a photo).
constexpr int64_t kMaxSampleBytes = int64_t{1} << 30;

/// Reads `size` bytes at `offset` of `path` (size < 0: the whole file).
void preadFile(const std::string& path, int64_t offset, int64_t size, std::string* bytes,
               const std::string& where) {
  // Note [input files are regular files]: an image list may name a FIFO; its
  // open() blocked the loader thread, and with it training, for ever.
  const InputFile in = openInputFile(path);
  if (in.fd < 0) {
    throw SampleError(strCat(where, in.kind.empty() ? ": cannot open: " : ": ", in.why()));
  }
  const int fd = in.fd;
  if (size < 0) size = static_cast<int64_t>(in.size);
  if (size > kMaxSampleBytes) {
    throw SampleError(strCat(where, ": ", size, " bytes is over the ", kMaxSampleBytes >> 20,
                             " MB a sample may have"));
  }
  bytes->resize(static_cast<std::size_t>(size));
  int64_t done = 0;
  while (done < size) {
    const ssize_t n = ::pread(fd, bytes->data() + done, static_cast<std::size_t>(size - done),
                              static_cast<off_t>(offset + done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw SampleError(strCat(where, ": read failed: ", std::strerror(errno)));
    if (n == 0) {
      throw SampleError(strCat(where, ": file ended after ", done, " of ", size,
                               " bytes (truncated or changed since it was listed)"));
    }
    done += n;
  }
}

class ImageFileSource final : public Source {
 public:
  ImageFileSource(std::string root, std::vector<ImageEntry> entries)
      : root_(std::move(root)), entries_(std::move(entries)) {}
  int64_t size() const override { return static_cast<int64_t>(entries_.size()); }
  void read(int64_t i, std::string* bytes) const override {
    const auto path = where(i);
    preadFile(path, 0, -1, bytes, path);
  }
  std::string where(int64_t i) const override {
    const auto& p = entries_[i].path;  // absolute: data.list_outside_root
    return root_.empty() || (!p.empty() && p[0] == '/') ? p : root_ + "/" + p;
  }

 private:
  std::string root_;
  std::vector<ImageEntry> entries_;
};

class TarSource final : public Source {
 public:
  explicit TarSource(std::vector<TarShard> shards) : shards_(std::move(shards)) {
    for (std::size_t s = 0; s < shards_.size(); ++s) {
      for (std::size_t k = 0; k < shards_[s].samples.size(); ++k) {
        at_.push_back({static_cast<uint32_t>(s), static_cast<uint32_t>(k)});
        bytes_ += shards_[s].samples[k].image_size;
      }
    }
  }
  int64_t size() const override { return static_cast<int64_t>(at_.size()); }
  void read(int64_t i, std::string* bytes) const override {
    const auto& [s, k] = at_[i];
    const auto& sample = shards_[s].samples[k];
    preadFile(shards_[s].path, sample.image_offset, sample.image_size, bytes, where(i));
  }
  std::string where(int64_t i) const override {
    const auto& [s, k] = at_[i];
    const auto& sample = shards_[s].samples[k];
    return strCat(shards_[s].path, ": member ", sample.image_member, " at offset ",
                  sample.image_offset);
  }
  int64_t encodedBytes() const override { return bytes_; }

 private:
  std::vector<TarShard> shards_;
  std::vector<std::pair<uint32_t, uint32_t>> at_;  // sample -> (shard, position)
  int64_t bytes_ = 0;
};

}  // namespace

class SubsetSource final : public Source {
 public:
  SubsetSource(std::shared_ptr<const Source> base, std::vector<int64_t> rows)
      : base_(std::move(base)), rows_(std::move(rows)) {}
  int64_t size() const override { return static_cast<int64_t>(rows_.size()); }
  void read(int64_t i, std::string* bytes) const override { base_->read(rows_[i], bytes); }
  std::string where(int64_t i) const override { return base_->where(rows_[i]); }

 private:
  std::shared_ptr<const Source> base_;
  std::vector<int64_t> rows_;
};

std::shared_ptr<const Source> Source::subset(std::vector<int64_t> rows) const {
  auto base = self_.lock();
  if (!base) throw Error("Source::subset: the source was not made by a factory");
  return own(std::make_shared<SubsetSource>(std::move(base), std::move(rows)));
}

std::shared_ptr<const Source> imageFileSource(std::string root, std::vector<ImageEntry> entries) {
  return Source::own(std::make_shared<ImageFileSource>(std::move(root), std::move(entries)));
}

std::shared_ptr<const Source> tarSource(std::vector<TarShard> shards) {
  return Source::own(std::make_shared<TarSource>(std::move(shards)));
}

}  // namespace batchdist::worker
