#pragma once
// What the supervisor makes of the ranks' heartbeats (Note [heartbeat] in
// worker/common/heartbeat.h): which rank went silent, whether the job hangs,
// and how far it got. Pure bookkeeping on times the caller passes in, so the
// tests drive it with a clock of their own.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace batchdist::launcher::elastic {

struct Beat {
  int attempt = 0;
  int rank = -1;
  int pid = 0;
  std::string phase;
  int64_t step = 0;
  int64_t checkpoint = -1;
  int64_t per_gpu = 0, accum = 0, global = 0;
  int64_t collectives = -1;  ///< collectives started (-1: not said)
};

/// One datagram's beat, or nullopt for anything else (a stray packet).
std::optional<Beat> parseBeat(const std::string& text);

/// A failure the heartbeats show while mpirun still runs.
struct Verdict {
  enum class Kind { kNone, kSilent, kStall };
  Kind kind = Kind::kNone;
  std::vector<int> ranks;  ///< the ranks to blame (their hosts are lost)
  std::string why;         ///< "rank 3 silent for 10.2 s (last heard at step 41)"
};

struct MonitorLimits {
  double heartbeat_timeout_s = 10;  ///< a rank heard before, silent this long: lost
  double start_timeout_s = 120;     ///< a rank never heard this long after the launch: lost
  double stall_s = 300;             ///< training, and no rank finished a step this long: a hang
};

class Monitor {
 public:
  Monitor(int attempt, int world, MonitorLimits limits, double now);

  /// Takes a beat received at `now`; beats of other attempts or ranks are ignored.
  void record(const Beat& b, double now);
  Verdict check(double now) const;

  int world() const { return static_cast<int>(ranks_.size()); }
  /// The most steps any rank reported done (the resume point's before the first step).
  int64_t lastStep() const;
  /// The newest checkpoint rank 0 reported written (-1: none; rank 0 writes them).
  int64_t checkpoint() const;
  /// The step training started at in this attempt (its resume point), -1 before training.
  int64_t startStep() const { return start_step_; }
  /// When the first step of this attempt finished (-1: none yet).
  double firstStepAt() const { return first_step_at_; }
  /// Whether every rank's last beat is from phase "train" (stepping: a stop
  /// wish is honoured with a checkpoint, and no step for elastic.stall_s is a hang).
  bool training() const;
  /// The batch rank 0 trains with (zeros before training).
  Beat batch() const;

 private:
  /// The ranks a hang waits for (all when none is behind), and the reason in words.
  std::string behind(std::vector<int>* ranks) const;
  struct RankState {
    bool heard = false;
    double last_heard = 0;
    Beat last;
  };
  int attempt_;
  MonitorLimits limits_;
  double started_;
  std::vector<RankState> ranks_;
  int64_t start_step_ = -1;
  double first_step_at_ = -1;
  int64_t best_step_ = -1;
  double progress_at_ = -1;  ///< when best_step_ last grew (or training began)
};

}  // namespace batchdist::launcher::elastic
