// segment's video and camera pipeline: the latest-frame buffer, what a capture string is, the
// output container, the JSONL log, GStreamer pipelines and unreachable stream URLs.
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <fstream>
#include <thread>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "../tools/lightseg/latest_frame.h"
#include "../tools/lightseg/video_source.h"
#include "cli_run.h"
#include "lightseg/file_io.h"
#include "lightseg/features.h"
#include "predictor_fixtures.h"

#if LIGHTSEG_HAVE_OPENCV
#include <opencv2/core.hpp>
#include <opencv2/imgproc.hpp>
#include <opencv2/videoio.hpp>
#include <opencv2/videoio/registry.hpp>
#endif

using namespace lightseg;
using lightseg::cli::LatestFrame;
namespace fx = lightseg::fixtures;
namespace fs = std::filesystem;
using namespace std::chrono_literals;

TEST(LatestFrame, KeepsOnlyTheNewestAndCountsTheRest) {
  LatestFrame<int> b;
  EXPECT_FALSE(b.take(0ms));
  b.put(10);
  b.put(11);
  b.put(12);
  auto item = b.take(0ms);
  ASSERT_TRUE(item);
  EXPECT_EQ(item->frame, 12);
  EXPECT_EQ(item->sequence, 2);
  EXPECT_EQ(b.dropped(), 2);
  EXPECT_FALSE(b.take(0ms)) << "a frame is taken once";
  b.put(13);
  EXPECT_FALSE(b.closed());
  b.close();
  EXPECT_FALSE(b.closed()) << "closed with a frame left: the consumer gets it first";
  item = b.take(0ms);
  ASSERT_TRUE(item);
  EXPECT_EQ(item->frame, 13);
  EXPECT_TRUE(b.closed());
  EXPECT_EQ(b.dropped(), 2);
  EXPECT_EQ(b.captured(), 4);
}

// A producer ten times faster than the consumer: the consumer sees increasing frames, never an
// old one, ends with the last, and every frame is either taken or counted as dropped.
TEST(LatestFrame, AFastProducerAndASlowConsumer) {
  LatestFrame<int> b;
  constexpr int kFrames = 400;
  std::thread producer([&] {
    for (int i = 0; i < kFrames; ++i) {
      b.put(i);
      std::this_thread::sleep_for(200us);
    }
    b.close();
  });
  std::vector<int> taken;
  int64_t gaps = 0;
  while (true) {
    auto item = b.take(50ms);
    if (!item) {
      if (b.closed()) break;
      continue;
    }
    EXPECT_EQ(item->frame, item->sequence);
    if (!taken.empty()) EXPECT_GT(item->frame, taken.back()) << "an older frame after a newer one";
    gaps += item->sequence - (taken.empty() ? 0 : taken.back() + 1);  // the frames skipped before this one
    taken.push_back(item->frame);
    std::this_thread::sleep_for(2ms);
  }
  producer.join();
  ASSERT_FALSE(taken.empty());
  EXPECT_EQ(taken.back(), kFrames - 1) << "the consumer ends with the newest frame";
  EXPECT_LT(static_cast<int>(taken.size()), kFrames / 2) << "a slow consumer should have skipped most frames";
  EXPECT_EQ(b.dropped() + static_cast<int64_t>(taken.size()), kFrames);
  EXPECT_EQ(b.dropped(), gaps) << "every frame not taken was counted as dropped, no more";
}

TEST(VideoSource, WhatACaptureStringIs) {
  using cli::SourceKind;
  auto c = cli::classify_source("0", false);
  EXPECT_EQ(c.kind, SourceKind::Device);
  EXPECT_EQ(c.index, 0);
  EXPECT_EQ(c.stem, "camera0");
  EXPECT_TRUE(c.live());
  c = cli::classify_source("/dev/video2", false);
  EXPECT_EQ(c.kind, SourceKind::Device);
  EXPECT_EQ(c.index, -1);
  EXPECT_EQ(c.stem, "video2");
  c = cli::classify_source("rtsp://192.168.1.10:554/stream1", false);
  EXPECT_EQ(c.kind, SourceKind::Url);
  EXPECT_TRUE(c.live());
  EXPECT_EQ(cli::classify_source("http://cam.local/video.mjpg", false).kind, SourceKind::Url);
  c = cli::classify_source("videotestsrc num-buffers=5 ! videoconvert ! appsink", false);
  EXPECT_EQ(c.kind, SourceKind::Pipeline);
  EXPECT_EQ(c.stem, "stream");
  c = cli::classify_source("clips/run 1.mp4", true);
  EXPECT_EQ(c.kind, SourceKind::File);
  EXPECT_FALSE(c.live());
  EXPECT_EQ(c.stem, "run 1");
  EXPECT_EQ(cli::classify_source("missing.mp4", false).kind, SourceKind::File);
  EXPECT_FALSE(cli::looks_live("C:/x.mp4"));
  EXPECT_FALSE(cli::looks_live("://x"));
}

TEST(VideoSource, OutputsKeepTheInputsContainerWhereOpenCvWritesIt) {
  auto c = cli::container_for(".mp4", false);
  EXPECT_EQ(c.ext, ".mp4");
  EXPECT_STREQ(c.fourcc, "mp4v");
  EXPECT_EQ(cli::container_for(".mov", false).ext, ".mov");
  EXPECT_EQ(cli::container_for(".avi", false).ext, ".avi");
  EXPECT_STREQ(cli::container_for(".avi", false).fourcc, "MJPG");
  EXPECT_EQ(cli::container_for(".mp4", true).ext, ".avi") << "live sources: MJPG .avi (plays when cut short)";
}

#if LIGHTSEG_HAVE_OPENCV
namespace {

// A small synthetic video written with OpenCV; false when this OpenCV cannot write the codec.
bool write_video(const fs::path& path, const char* fourcc, int W, int H, int N) {
  cv::VideoWriter w(path.string(), cv::VideoWriter::fourcc(fourcc[0], fourcc[1], fourcc[2], fourcc[3]), 10, cv::Size(W, H));
  if (!w.isOpened()) return false;
  for (int i = 0; i < N; ++i) {
    auto rgb = fx::shapes_sample(H, W, 60 + i).first.contiguous();
    cv::Mat bgr;
    cv::cvtColor(cv::Mat(H, W, CV_8UC3, rgb.data_ptr<uint8_t>()), bgr, cv::COLOR_RGB2BGR);
    w.write(bgr);
  }
  return true;
}

std::vector<nlohmann::json> read_jsonl(const fs::path& p) {
  std::vector<nlohmann::json> v;
  std::ifstream f(p);
  std::string l;
  while (std::getline(f, l)) v.push_back(nlohmann::json::parse(l));
  return v;
}

}  // namespace
#endif

TEST(SegmentVideo, AnMp4GivesAnMp4AndAJsonlLog) {
  fx::one_thread();
#if LIGHTSEG_HAVE_OPENCV
  auto dir = fx::temp_dir("segment_mp4");
  const std::string weights = fx::random_weights(dir);
  const int W = 64, H = 48, N = 5;
  const fs::path video = dir / "clip.mp4";
  ASSERT_TRUE(write_video(video, "mp4v", W, H, N)) << "this OpenCV cannot write mp4v in .mp4 (FFMPEG backend)";
  const fs::path out = dir / "out", log = dir / "logs" / "run.jsonl";
  auto r = fx::run_cli({"segment", video.string(), "--weights", weights, "--out", out.string(), "--format", "all",
                        "--log", log.string()},
                       dir);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("and 5 video frames"), std::string::npos) << r.out;
  EXPECT_FALSE(fs::exists(out / "clip_overlay.avi")) << "an MP4 input gave an AVI";
  for (const char* name : {"clip_overlay.mp4", "clip_color.mp4"}) {
    ASSERT_TRUE(fs::exists(out / name)) << name << "\n" << r.err;
    cv::VideoCapture cap((out / name).string());
    ASSERT_TRUE(cap.isOpened()) << name;
    const int fourcc = static_cast<int>(cap.get(cv::CAP_PROP_FOURCC));
    EXPECT_EQ(fourcc, cv::VideoWriter::fourcc('m', 'p', '4', 'v')) << name;
    int n = 0;
    cv::Mat f;
    while (cap.read(f) && !f.empty()) {
      EXPECT_EQ(f.cols, W);
      EXPECT_EQ(f.rows, H);
      ++n;
    }
    EXPECT_EQ(n, N) << name;
  }
  EXPECT_TRUE(fs::exists(out / "clip_ids" / "000004.png"));

  const auto lines = read_jsonl(log);
  ASSERT_EQ(static_cast<int>(lines.size()), N + 1) << "one line per frame and a summary";
  const double now = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  double previous = 0;
  for (int i = 0; i < N; ++i) {
    const auto& j = lines[i];
    EXPECT_EQ(j["source"], video.string());
    EXPECT_EQ(j["frame"], i);
    EXPECT_EQ(j["sequence"], i);
    EXPECT_EQ(j["dropped"], 0) << "a file is read frame by frame";
    EXPECT_GT(j["latency_ms"].get<double>(), 0);
    EXPECT_GE(j["latency_ms"].get<double>(), j["inference_ms"].get<double>());
    const double ts = j["capture_time"].get<double>();
    EXPECT_GT(ts, now - 300);
    EXPECT_LE(ts, now);
    EXPECT_GE(ts, previous);
    previous = ts;
    EXPECT_NEAR(j["stream_ms"].get<double>(), i * 100.0, 1.0) << "10 fps";
  }
  const auto& sum = lines.back();
  EXPECT_EQ(sum["summary"], true);
  EXPECT_EQ(sum["frames"], N);
  EXPECT_EQ(sum["dropped"], 0);
  EXPECT_EQ(sum["live"], false);
  EXPECT_GT(sum["latency_ms"]["p50"].get<double>(), 0);
  fs::remove_all(dir);
#else
  GTEST_SKIP() << "built without OpenCV: video input is not available in this build";
#endif
}

// A GStreamer pipeline is opened with CAP_GSTREAMER when this OpenCV has it, refused clearly
// when it does not; which of them holds is decided here from OpenCV itself, not from the CLI.
TEST(SegmentVideo, AGStreamerPipelineIsAcceptedOrClearlyRefused) {
  fx::one_thread();
#if LIGHTSEG_HAVE_OPENCV
  auto dir = fx::temp_dir("segment_gst");
  const std::string weights = fx::random_weights(dir);
  const std::string pipeline = "videotestsrc num-buffers=5 ! video/x-raw,width=64,height=48 ! videoconvert ! appsink";
  const fs::path out = dir / "out";
  auto r = fx::run_cli({"segment", "--camera", pipeline, "--weights", weights, "--out", out.string(), "--format", "ids"}, dir);
  if (!cv::videoio_registry::hasBackend(cv::CAP_GSTREAMER)) {
    EXPECT_EQ(r.code, 1) << r.out << r.err;
    EXPECT_NE(r.err.find("built without GStreamer"), std::string::npos) << r.err;
  } else if (!cv::VideoCapture(pipeline, cv::CAP_GSTREAMER).isOpened()) {
    // GStreamer is there but not the pipeline's elements (videotestsrc is in gst-plugins-base).
    EXPECT_EQ(r.code, 1) << r.out << r.err;
    EXPECT_NE(r.err.find("GStreamer could not start pipeline"), std::string::npos) << r.err;
  } else {
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_NE(r.out.find("video frames"), std::string::npos) << r.out;
    EXPECT_TRUE(fs::exists(out / "stream_ids" / "000000.png"));
  }
  EXPECT_EQ(r.err.find("does not exist"), std::string::npos) << r.err;
  fs::remove_all(dir);
#else
  GTEST_SKIP() << "built without OpenCV: no capture backends in this build";
#endif
}

TEST(SegmentVideo, AnUnreachableStreamFailsFastAndClearly) {
  fx::one_thread();
#if LIGHTSEG_HAVE_OPENCV
  auto dir = fx::temp_dir("segment_rtsp");
  const std::string weights = fx::random_weights(dir);
  const std::string url = "rtsp://127.0.0.1:1/x";
  for (const bool as_camera : {true, false}) {
    std::vector<std::string> args{"segment"};
    if (as_camera) args.push_back("--camera");
    args.insert(args.end(), {url, "--weights", weights, "--out", (dir / "out").string()});
    const auto t0 = std::chrono::steady_clock::now();
    auto r = fx::run_cli(args, dir);
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_EQ(r.code, 1) << r.out << r.err;
    EXPECT_NE(r.err.find("error: cannot open stream '" + url + "'"), std::string::npos) << r.err;
    EXPECT_EQ(r.err.find("does not exist"), std::string::npos) << r.err;
    EXPECT_LT(secs, 30) << "the open timeout bounds it";
    EXPECT_FALSE(fs::exists(dir / "out" / "stream_overlay.avi"));
  }
  auto r = fx::run_cli({"segment", "--camera", "no-such-camera", "--weights", weights, "--out", (dir / "out").string()}, dir);
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("is not a camera index"), std::string::npos) << r.err;
  r = fx::run_cli({"segment", url, "--camera", "rtsp://127.0.0.1:1/y", "--weights", weights}, dir);
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("one live source per run"), std::string::npos) << r.err;
  fs::remove_all(dir);
#else
  GTEST_SKIP() << "built without OpenCV: no capture backends in this build";
#endif
}

// A host that takes the connection and never answers: the open timeout (10 s) ends it.
TEST(SegmentVideo, AStreamThatNeverAnswersTimesOut) {
  fx::one_thread();
#if LIGHTSEG_HAVE_OPENCV
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;  // any free port
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  ASSERT_EQ(::listen(fd, 4), 0);
  socklen_t len = sizeof addr;
  ASSERT_EQ(::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  const std::string url = "rtsp://127.0.0.1:" + std::to_string(ntohs(addr.sin_port)) + "/silent";
  auto dir = fx::temp_dir("segment_silent");
  const std::string weights = fx::random_weights(dir);
  const auto t0 = std::chrono::steady_clock::now();
  auto r = fx::run_cli({"segment", "--camera", url, "--weights", weights, "--out", (dir / "out").string()}, dir);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ::close(fd);
  EXPECT_EQ(r.code, 1) << r.out << r.err;
  EXPECT_NE(r.err.find("did not answer within 10 s"), std::string::npos) << r.err;
  EXPECT_LT(secs, 40) << "the open timeout should end it after about 10 s";
  EXPECT_GE(secs, 5) << "it did not wait for the host at all?";
  fs::remove_all(dir);
#else
  GTEST_SKIP() << "built without OpenCV: no capture backends in this build";
#endif
}

#if LIGHTSEG_HAVE_OPENCV
namespace {

// A one-file HTTP server on 127.0.0.1 (any free port): every GET gets the whole file, no ranges.
class FileServer {
 public:
  explicit FileServer(std::string body) : body_(std::move(body)) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd_ < 0 || ::bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 || ::listen(fd_, 8) != 0)
      throw std::runtime_error("FileServer: cannot listen");
    socklen_t len = sizeof addr;
    ::getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len);
    port_ = ntohs(addr.sin_port);
    thread_ = std::thread([this] { serve(); });
  }
  ~FileServer() {
    stop_ = true;
    thread_.join();
    ::close(fd_);
  }
  int port() const { return port_; }

 private:
  void serve() {
    while (!stop_) {
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, 100) <= 0) continue;
      const int c = ::accept(fd_, nullptr, nullptr);
      if (c < 0) continue;
      std::string req;
      char buf[4096];
      while (req.find("\r\n\r\n") == std::string::npos) {
        const ssize_t n = ::recv(c, buf, sizeof buf, 0);
        if (n <= 0) break;
        req.append(buf, static_cast<size_t>(n));
      }
      const std::string head = "HTTP/1.0 200 OK\r\nContent-Type: video/x-msvideo\r\nContent-Length: " +
                               std::to_string(body_.size()) + "\r\nConnection: close\r\n\r\n";
      const std::string all = head + body_;
      for (size_t off = 0; off < all.size();) {
        const ssize_t n = ::send(c, all.data() + off, all.size() - off, MSG_NOSIGNAL);
        if (n <= 0) break;
        off += static_cast<size_t>(n);
      }
      ::close(c);
    }
  }
  std::string body_;
  int fd_ = -1, port_ = 0;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace
#endif

// A live source end to end: an HTTP URL serving a recorded clip far faster than the network
// segments it. Latest-frame semantics: frames are dropped and counted, the log's sequence has the
// gaps, and every frame the source gave is either segmented or counted as dropped.
TEST(SegmentVideo, ALiveStreamDropsStaleFramesAndLogsThem) {
  fx::one_thread();
#if LIGHTSEG_HAVE_OPENCV
  auto dir = fx::temp_dir("segment_live");
  const std::string weights = fx::random_weights(dir);
  const int W = 320, H = 240, N = 60;
  const fs::path clip = dir / "clip.avi";
  ASSERT_TRUE(write_video(clip, "MJPG", W, H, N)) << "this OpenCV cannot write MJPG .avi";
  FileServer server(read_file(clip.string()));
  const std::string url = "http://127.0.0.1:" + std::to_string(server.port()) + "/clip.avi";
  const fs::path out = dir / "out", log = dir / "live.jsonl";
  auto r = fx::run_cli({"segment", url, "--weights", weights, "--out", out.string(), "--format", "ids", "--log",
                        log.string(), "--json"},
                       dir);
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_NE(r.err.find("segmenting until Ctrl-C"), std::string::npos) << r.err;
  const auto lines = read_jsonl(log);
  ASSERT_GE(lines.size(), 2u);
  const auto& sum = lines.back();
  ASSERT_EQ(sum["summary"], true);
  const int64_t k = sum["frames"].get<int64_t>();
  ASSERT_EQ(static_cast<int64_t>(lines.size()), k + 1);
  std::printf("live stream: %lld of %d frames segmented, %lld dropped\n", static_cast<long long>(k), N,
              static_cast<long long>(sum["dropped"].get<int64_t>()));
  EXPECT_EQ(sum["live"], true);
  EXPECT_EQ(sum["frames"].get<int64_t>() + sum["dropped"].get<int64_t>(), N)
      << "every frame the stream gave is segmented or counted as dropped";
  EXPECT_GT(sum["dropped"].get<int64_t>(), 0) << "a source faster than the network must drop frames";
  int64_t previous = -1;
  for (int64_t i = 0; i < k; ++i) {
    const auto& j = lines[i];
    EXPECT_EQ(j["frame"], i);
    EXPECT_GT(j["sequence"].get<int64_t>(), previous) << "an older frame after a newer one";
    previous = j["sequence"].get<int64_t>();
    EXPECT_EQ(j["dropped"].get<int64_t>(), previous - i);
    EXPECT_FALSE(j.contains("stream_ms")) << "live frames have no file timestamp";
  }
  EXPECT_EQ(previous, N - 1) << "the last frame segmented is the newest";
  char last[32];
  std::snprintf(last, sizeof last, "%06lld.png", static_cast<long long>(k - 1));
  EXPECT_TRUE(fs::exists(out / "stream_ids" / last));
  auto j = nlohmann::json::parse(r.out.substr(r.out.rfind('{')));
  EXPECT_EQ(j["frames"], k);
  EXPECT_EQ(j["dropped"], sum["dropped"]);
  fs::remove_all(dir);
#else
  GTEST_SKIP() << "built without OpenCV: no capture backends in this build";
#endif
}
