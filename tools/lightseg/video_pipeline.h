// segment's video and camera pipeline: a capture source (video_source.h) through the predictor
// into label-id PNGs and colour/overlay videos, with a JSONL log per frame. OpenCV stays inside
// video_pipeline.cpp; without it, segment_source throws.
#pragma once

#include <atomic>
#include <chrono>
#include <filesystem>
#include <ostream>
#include <string>

#include "progress.h"
#include "video_source.h"

namespace lightseg {
class Predictor;
}

namespace lightseg::cli {

struct Outputs {
  bool ids = false, color = false, overlay = false;
};

// Each input ends up in exactly one of images, videos and failed (the summary counts inputs).
struct Totals {
  int64_t images = 0, videos = 0, frames = 0, dropped = 0, failed = 0, files = 0, pixels = 0;
  double network_s = 0;
};

// First Ctrl-C: finish the current image/frame, write what is done, print the summary.
extern std::atomic<bool> g_interrupted;

using Clock = std::chrono::steady_clock;
inline double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// "segment 3/10 images · 2.1 images/s · ETA 3s". The ETA comes from the items after the first
// (`first_s`: when the first was done), which carries the one-time start-up (plans, caches).
std::string rate_line(const std::string& what, int64_t done, int64_t total, double seconds, double first_s);

struct StreamSettings {
  Outputs outputs;
  double alpha = 0.5;
  int64_t max_frames = 0;       // 0: no limit
  bool allow_partial = false;   // files: keep a video that ends before the frames it announces
  std::ostream* log = nullptr;  // --log: one JSON object per frame, then a summary
};

// The container a source's videos get (the input's, or MJPG .avi; see container_for).
Container output_container(const CaptureSource& src);
// Removes what segment_source wrote for `base` (either container), after a failure.
void remove_stream_outputs(const std::filesystem::path& base, const Outputs& o, const CaptureSource& src);
// Opens the source with the backend its kind needs and segments it: files frame by frame, live
// sources with latest-frame semantics. Returns the frames segmented; throws a clear error when
// the source cannot be opened or gives no frame.
int64_t segment_source(const CaptureSource& src, const std::filesystem::path& base, const StreamSettings& s,
                       const Predictor& p, ProgressLine& line, Totals& t);
// What this build's OpenCV can open: "FFMPEG GSTREAMER V4L2 ..." (empty without OpenCV).
std::string capture_backends();
// For `lightseg info`: "OpenCV 4.6.0, capture backends FFMPEG ...; GStreamer pipelines: yes".
std::string video_support();

}  // namespace lightseg::cli
