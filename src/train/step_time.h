// Seconds per training step, for the progress line's ETA (internal).
#pragma once

#include <cstdint>

namespace lightseg {

// An exponential moving average of the step time (about the last 1/alpha steps), so the ETA
// follows the speed the run has now (a machine shared for a while, a resumed run on another
// CPU or in another precision) instead of the whole run's mean. The first step (one-time kernel
// selection and allocation, often many times a normal one) counts only until a second arrives.
class StepTimeEstimate {
 public:
  explicit StepTimeEstimate(double alpha = 0.05) : alpha_(alpha) {}
  void add(double seconds) {
    ++n_;
    if (n_ <= 2) avg_ = seconds;  // the second step replaces the first
    else avg_ += alpha_ * (seconds - avg_);
  }
  double seconds_per_step() const { return avg_; }
  int64_t steps() const { return n_; }

 private:
  double alpha_;
  double avg_ = 0;
  int64_t n_ = 0;
};

}  // namespace lightseg
