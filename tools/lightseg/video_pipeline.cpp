// segment's video and camera pipeline (video_pipeline.h): open any OpenCV capture string with
// the backend it needs, segment files frame by frame and live sources newest-frame-first,
// write videos in the input's container where OpenCV can, and log every frame as JSONL.
#include "video_pipeline.h"

#include <algorithm>
#include <cstdio>
#include <stdexcept>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "lightseg/file_io.h"
#include "latest_frame.h"
#include "lightseg/features.h"
#include "lightseg/image_io.h"
#include "lightseg/palette.h"
#include "lightseg/predictor.h"

#if LIGHTSEG_HAVE_OPENCV
#include <opencv2/core.hpp>
#include <opencv2/imgproc.hpp>
#include <opencv2/videoio.hpp>
#include <opencv2/videoio/registry.hpp>
#endif

namespace fs = std::filesystem;

namespace lightseg::cli {

std::atomic<bool> g_interrupted{false};

std::string rate_line(const std::string& what, int64_t done, int64_t total, double seconds, double first_s) {
  char b[256];
  const double rate = done / std::max(seconds, 1e-9);
  if (total > 0) {
    // After the first item, the steady rate; with one item done, the only figure there is.
    const double per_item = done >= 2 ? (seconds - first_s) / static_cast<double>(done - 1) : seconds / std::max<int64_t>(done, 1);
    std::snprintf(b, sizeof b, "segment %lld/%lld %s · %.1f %s/s · ETA %s", static_cast<long long>(done),
                  static_cast<long long>(total), what.c_str(), rate, what.c_str(),
                  fmt_duration(static_cast<double>(total - done) * per_item).c_str());
  } else {
    std::snprintf(b, sizeof b, "segment %lld %s · %.1f %s/s", static_cast<long long>(done), what.c_str(), rate, what.c_str());
  }
  return b;
}

namespace {
std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}
}  // namespace

Container output_container(const CaptureSource& src) {
  return container_for(src.live() ? std::string() : lower(fs::path(src.text).extension().string()), src.live());
}

void remove_stream_outputs(const fs::path& base, const Outputs& o, const CaptureSource& src) {
  std::error_code ec;
  if (o.ids) fs::remove_all(base.string() + "_ids", ec);
  for (const auto& c : {output_container(src), fallback_container()}) {
    if (o.color) fs::remove(base.string() + "_color" + c.ext, ec);
    if (o.overlay) fs::remove(base.string() + "_overlay" + c.ext, ec);
  }
}

#if LIGHTSEG_HAVE_OPENCV

std::string capture_backends() {
  std::string s;
  for (auto b : cv::videoio_registry::getBackends()) s += (s.empty() ? "" : " ") + cv::videoio_registry::getBackendName(b);
  return s;
}

std::string video_support() {
  return std::string("OpenCV ") + CV_VERSION + ", capture backends " + capture_backends() + "; GStreamer pipelines: " +
         (cv::videoio_registry::hasBackend(cv::CAP_GSTREAMER) ? "yes" : "no (OpenCV built without GStreamer)");
}

namespace {

constexpr int kStreamTimeoutMs = 10000;  // a URL that does not answer fails within this

// The backend each kind needs; a clear refusal when this OpenCV lacks it.
void open_capture(cv::VideoCapture& cap, const CaptureSource& src) {
  using cv::videoio_registry::hasBackend;
  switch (src.kind) {
    case SourceKind::File:
      if (!cap.open(src.text)) throw std::runtime_error("'" + src.text + "': cannot open the video");
      return;
    case SourceKind::Device: {
      const bool ok = src.index >= 0 ? cap.open(src.index) : cap.open(src.text);
      if (!ok)
        throw std::runtime_error("cannot open " + src.name + " (no such camera, busy, or no permission; backends: " +
                                 capture_backends() + ")");
      return;
    }
    case SourceKind::Url: {
      // FFmpeg reads RTSP/HTTP/...; the timeouts bound a host that does not answer.
      const int api = hasBackend(cv::CAP_FFMPEG) ? cv::CAP_FFMPEG : cv::CAP_ANY;
      const std::vector<int> params{cv::CAP_PROP_OPEN_TIMEOUT_MSEC, kStreamTimeoutMs, cv::CAP_PROP_READ_TIMEOUT_MSEC,
                                    kStreamTimeoutMs};
      if (!cap.open(src.text, api, params))
        throw std::runtime_error("cannot open " + src.name + " (" +
                                 (api == cv::CAP_FFMPEG ? std::string("FFMPEG backend") : std::string("no FFMPEG backend")) +
                                 "): the host refused or did not answer within " + std::to_string(kStreamTimeoutMs / 1000) +
                                 " s, or it is not a video stream");
      return;
    }
    case SourceKind::Pipeline:
      if (!hasBackend(cv::CAP_GSTREAMER))
        throw std::runtime_error(src.name + " is a GStreamer pipeline (it contains '!'), but this OpenCV was built "
                                 "without GStreamer (its capture backends: " + capture_backends() +
                                 "); give a device index, a file or a URL, or use an OpenCV built with GStreamer");
      if (!cap.open(src.text, cv::CAP_GSTREAMER))
        throw std::runtime_error("GStreamer could not start " + src.name +
                                 " (a missing element or plugin? see GStreamer's message above; the pipeline must end in appsink)");
      return;
  }
}

// One frame from the source, in capture order.
struct Frame {
  cv::Mat image;
  int64_t sequence = 0;  // frames the source gave before it (processed or dropped)
  std::chrono::system_clock::time_point captured;
  double stream_ms = -1;  // the container's timestamp (files)
};

double unix_seconds(std::chrono::system_clock::time_point t) {
  return std::chrono::duration<double>(t.time_since_epoch()).count();
}

double percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(q * static_cast<double>(v.size() - 1) + 0.5))];
}

}  // namespace

int64_t segment_source(const CaptureSource& src, const fs::path& base, const StreamSettings& s, const Predictor& p,
                       ProgressLine& line, Totals& t) {
  cv::VideoCapture cap;
  open_capture(cap, src);
  const Outputs& o = s.outputs;
  double fps = cap.get(cv::CAP_PROP_FPS);
  if (!(fps >= 1 && fps <= 240)) fps = 25;
  if (src.live())
    line.print(src.name + " (" + cap.getBackendName() + "): segmenting until Ctrl-C" +
               (s.max_frames > 0 ? " or " + std::to_string(s.max_frames) + " frames" : std::string()) +
               " (newest frame first, stale frames dropped)");
  int64_t total = src.live() ? 0 : static_cast<int64_t>(cap.get(cv::CAP_PROP_FRAME_COUNT));
  if (total <= 0) total = 0;
  const int64_t announced = total;
  if (s.max_frames > 0 && (total == 0 || s.max_frames < total)) total = s.max_frames;
  fs::create_directories(base.parent_path());
  const fs::path ids_dir = base.string() + "_ids";
  if (o.ids) fs::create_directories(ids_dir);

  cv::VideoWriter w_overlay, w_color;
  const Container wanted = output_container(src);
  auto open_writer = [&](cv::VideoWriter& w, const std::string& suffix, cv::Size size) {
    const auto& f = wanted.fourcc;
    const std::string path = base.string() + suffix + wanted.ext;
    if (w.open(path, cv::VideoWriter::fourcc(f[0], f[1], f[2], f[3]), fps, size)) {
      ++t.files;
      return;
    }
    std::error_code ec;
    fs::remove(path, ec);
    const Container fb = fallback_container();
    const std::string fb_path = base.string() + suffix + fb.ext;
    if (fb.ext == wanted.ext || !w.open(fb_path, cv::VideoWriter::fourcc('M', 'J', 'P', 'G'), fps, size))
      throw std::runtime_error("cannot write video '" + path + "'");
    line.print("note: OpenCV cannot write " + std::string(wanted.fourcc) + " in " + wanted.ext + " here; wrote " +
               fb_path + " (MJPG) instead");
    ++t.files;
  };

  // Live sources: a capture thread keeps only the newest frame; files: read in order, none dropped.
  LatestFrame<Frame> latest;
  std::atomic<bool> stop{false};
  std::string capture_error;
  std::thread producer;
  if (src.live()) {
    producer = std::thread([&] {
      try {
        int64_t seq = 0;
        cv::Mat m;
        while (!stop && cap.read(m) && !m.empty()) {
          Frame f{m.clone(), seq++, std::chrono::system_clock::now(), -1};
          latest.put(std::move(f));
        }
      } catch (const std::exception& e) {
        capture_error = e.what();
      }
      latest.close();
    });
  }
  struct JoinOnExit {
    std::thread& th;
    std::atomic<bool>& stop;
    ~JoinOnExit() {
      stop = true;
      if (th.joinable()) th.join();
    }
  } join_on_exit{producer, stop};

  int64_t file_seq = 0;
  auto next_frame = [&](Frame& f) -> bool {
    if (!src.live()) {
      if (!cap.read(f.image) || f.image.empty()) return false;
      f.sequence = file_seq++;
      f.captured = std::chrono::system_clock::now();
      f.stream_ms = cap.get(cv::CAP_PROP_POS_MSEC);
      return true;
    }
    while (!g_interrupted) {
      if (auto item = latest.take(std::chrono::milliseconds(200))) {
        f = std::move(item->frame);
        return true;
      }
      if (latest.closed()) return false;
    }
    return false;
  };

  cv::Mat rgb, bgr;
  Frame frame;
  std::vector<double> latencies;
  const auto t0 = Clock::now();
  double first_s = 0;
  int64_t n = 0, dropped = 0;
  while (!g_interrupted && (s.max_frames <= 0 || n < s.max_frames) && next_frame(frame)) {
    const cv::Mat& in = frame.image;
    if (in.channels() == 1) cv::cvtColor(in, rgb, cv::COLOR_GRAY2RGB);
    else if (in.channels() == 4) cv::cvtColor(in, rgb, cv::COLOR_BGRA2RGB);
    else cv::cvtColor(in, rgb, cv::COLOR_BGR2RGB);
    auto image = torch::from_blob(rgb.data, {rgb.rows, rgb.cols, 3}, torch::kUInt8);
    const auto tn = Clock::now();
    Prediction pr = p.predict(image);
    const double ms = seconds_since(tn) * 1000;
    t.network_s += ms / 1000;
    const cv::Size size(rgb.cols, rgb.rows);
    if (o.ids) {
      char fname[32];
      std::snprintf(fname, sizeof fname, "%06lld.png", static_cast<long long>(n));
      write_file_atomic((ids_dir / fname).string(), encode_png(pr.labels), /*sync=*/false);
      ++t.files;
    }
    if (o.overlay) {
      auto ov = overlay(image, pr.labels, p.meta().palette, s.alpha);
      cv::cvtColor(cv::Mat(size, CV_8UC3, ov.data_ptr<uint8_t>()), bgr, cv::COLOR_RGB2BGR);
      char stamp[48];
      std::snprintf(stamp, sizeof stamp, "%.0f ms", ms);
      const double scale = std::max(0.4, rgb.rows / 720.0);
      cv::putText(bgr, stamp, {8, static_cast<int>(8 + 22 * scale)}, cv::FONT_HERSHEY_SIMPLEX, scale, {0, 0, 0}, 3, cv::LINE_AA);
      cv::putText(bgr, stamp, {8, static_cast<int>(8 + 22 * scale)}, cv::FONT_HERSHEY_SIMPLEX, scale, {255, 255, 255}, 1, cv::LINE_AA);
      if (!w_overlay.isOpened()) open_writer(w_overlay, "_overlay", size);
      w_overlay.write(bgr);
    }
    if (o.color) {
      auto col = colorize(pr.labels, p.meta().palette);
      cv::cvtColor(cv::Mat(size, CV_8UC3, col.data_ptr<uint8_t>()), bgr, cv::COLOR_RGB2BGR);
      if (!w_color.isOpened()) open_writer(w_color, "_color", size);
      w_color.write(bgr);
    }
    // Capture to outputs written: what a robot waits for a frame's labels.
    const double latency_ms =
        std::chrono::duration<double, std::milli>(std::chrono::system_clock::now() - frame.captured).count();
    latencies.push_back(latency_ms);
    dropped = frame.sequence - n;  // frames the source gave before this one that were not segmented
    if (s.log) {
      nlohmann::json j{{"source", src.text}, {"frame", n}, {"sequence", frame.sequence},
                       {"capture_time", unix_seconds(frame.captured)}, {"latency_ms", latency_ms},
                       {"inference_ms", ms}, {"dropped", dropped}};
      if (frame.stream_ms >= 0) j["stream_ms"] = frame.stream_ms;
      *s.log << j.dump() << '\n' << std::flush;
    }
    ++n;
    if (n == 1) first_s = seconds_since(t0);
    t.pixels += static_cast<int64_t>(rgb.rows) * rgb.cols;
    line.update(src.name + ": " + rate_line("frames", n, total, seconds_since(t0), first_s), total > 0 && n == total);
  }
  stop = true;
  if (producer.joinable()) producer.join();
  if (src.live()) dropped = std::max<int64_t>(0, latest.captured() - n);  // the untaken last one too
  const double secs = seconds_since(t0);
  if (s.log) {
    nlohmann::json j{{"summary", true}, {"source", src.text}, {"frames", n}, {"dropped", dropped},
                     {"seconds", secs}, {"fps", n / std::max(secs, 1e-9)}, {"live", src.live()},
                     {"latency_ms", {{"mean", latencies.empty() ? 0.0 : [&] { double a = 0; for (double v : latencies) a += v; return a / latencies.size(); }()},
                                     {"p50", percentile(latencies, 0.5)}, {"p99", percentile(latencies, 0.99)},
                                     {"max", latencies.empty() ? 0.0 : *std::max_element(latencies.begin(), latencies.end())}}}};
    *s.log << j.dump() << '\n' << std::flush;
  }
  if (n == 0)
    throw std::runtime_error(src.name + ": no frames could be read" + (capture_error.empty() ? "" : " (" + capture_error + ")"));
  const int64_t expected = s.max_frames > 0 && announced > 0 ? std::min(s.max_frames, announced) : announced;
  if (!g_interrupted && expected > 0 && n < expected) {
    const std::string what = src.name + ": only " + std::to_string(n) + " of " + std::to_string(expected) +
                             " frames could be read (a damaged or truncated file?)";
    if (!s.allow_partial) throw std::runtime_error(what + "; --allow-partial keeps what was read");
    line.print("warning: " + what + "; kept (--allow-partial)");
  }
  t.frames += n;
  t.dropped += dropped;
  line.print(src.name + ": " + std::to_string(n) + " frames" +
             (src.live() ? " (" + std::to_string(dropped) + " stale frames dropped)" : std::string()) + " → " +
             base.string() + "*");
  return n;
}

#else

std::string capture_backends() { return ""; }
std::string video_support() { return "none (built without OpenCV)"; }

int64_t segment_source(const CaptureSource& src, const fs::path&, const StreamSettings&, const Predictor&, ProgressLine&,
                       Totals&) {
  throw std::runtime_error(src.name + ": this build has no video or camera support (OpenCV was not found)");
}

#endif

}  // namespace lightseg::cli
