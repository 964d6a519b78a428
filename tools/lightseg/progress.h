// Progress lines on stderr: rewritten in place on a terminal; otherwise (a log file, a pipe) one
// line every kLogEvery seconds and the lines the caller forces (the last item), none at the very
// start, where a rate and its ETA would still carry the start-up.
#pragma once

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <string>

namespace lightseg::cli {

inline std::string fmt_duration(double s) {
  if (!(s >= 0) || s > 1e8) return "?";
  long t = static_cast<long>(s + 0.5);
  char b[32];
  if (t >= 3600) std::snprintf(b, sizeof b, "%ldh%02ldm", t / 3600, (t % 3600) / 60);
  else if (t >= 60) std::snprintf(b, sizeof b, "%ldm%02lds", t / 60, t % 60);
  else std::snprintf(b, sizeof b, "%lds", t);
  return b;
}

class ProgressLine {
 public:
  static constexpr int kLogEvery = 5;  // seconds
  ProgressLine() : tty_(::isatty(2)), last_(std::chrono::steady_clock::now()) {}
  // force: print even if the last line was recent
  void update(const std::string& line, bool force = false) {
    auto now = std::chrono::steady_clock::now();
    if (tty_) {
      std::fprintf(stderr, "\r\033[K%s", line.c_str());
      std::fflush(stderr);
      open_ = true;
      return;
    }
    if (force || now - last_ > std::chrono::seconds(kLogEvery)) {
      std::fprintf(stderr, "%s\n", line.c_str());
      last_ = now;
    }
  }
  // a permanent line (ends the in-place one)
  void print(const std::string& line) {
    if (open_) std::fprintf(stderr, "\n");
    open_ = false;
    std::fprintf(stderr, "%s\n", line.c_str());
    std::fflush(stderr);
  }
  void done() {
    if (open_) std::fprintf(stderr, "\n");
    open_ = false;
  }

 private:
  bool tty_, open_ = false;
  std::chrono::steady_clock::time_point last_;
};

}  // namespace lightseg::cli
