// `lightseg segment` end to end: folders, single files, bad inputs, and a video round trip.
#include <sys/stat.h>

#include <chrono>

#include <gtest/gtest.h>

#include "cli_run.h"
#include "lightseg/features.h"
#include "lightseg/image_io.h"
#include "lightseg/palette.h"
#include "lightseg/predictor.h"
#include "predictor_fixtures.h"
#include "lightseg/file_io.h"

#if LIGHTSEG_HAVE_OPENCV
#include <opencv2/core.hpp>
#include <opencv2/imgproc.hpp>
#include <opencv2/videoio.hpp>
#endif

using namespace lightseg;
namespace fx = lightseg::fixtures;
namespace fs = std::filesystem;

namespace {

// The predictions the CLI should reproduce. Another process may round differently in rare
// near-ties, so label maps are compared by agreement, everything derived from them exactly.
constexpr double kAgree = 0.995;

}  // namespace

TEST(SegmentCli, FolderOfImagesWritesIdsColourAndOverlay) {
  fx::one_thread();
  auto dir = fx::temp_dir("segment_folder");
  const std::string weights = fx::random_weights(dir);
  Predictor ref(fx::random_network(), ModelMeta::camvid());
  const fs::path in = dir / "in";
  fs::create_directories(in / "sub" / "deeper");
  std::map<std::string, torch::Tensor> inputs;  // output stem → decoded input
  auto add = [&](const std::string& rel, const std::string& bytes, const std::string& stem) {
    std::ofstream(in / rel, std::ios::binary) << bytes;
    inputs[stem] = decode_image(bytes.data(), bytes.size());
  };
  add("a.png", encode_png(fx::shapes_sample(45, 61, 1).first), "a");
  add("sub/b.jpg", encode_jpeg(fx::shapes_sample(38, 50, 2).first), "sub/b");
  add("sub/deeper/c.PNG", encode_png(fx::shapes_sample(33, 40, 3).first.select(2, 0).contiguous()), "sub/deeper/c");
  add("d.png", encode_png(torch::cat({fx::shapes_sample(36, 36, 4).first, torch::full({36, 36, 1}, 128, torch::kUInt8)}, 2)), "d");
  std::ofstream(in / "notes.txt") << "not an image, not picked up";

  const fs::path out = dir / "out";
  auto r = fx::run_cli({"segment", in.string(), "--weights", weights, "--out", out.string(), "--format", "all",
                        "--alpha", "0.4", "--json", "--threads", "1"},
                       dir);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("segmented 4 images"), std::string::npos) << r.out;
  auto j = nlohmann::json::parse(r.out.substr(r.out.rfind('{')));
  EXPECT_EQ(j["images"], 4);
  EXPECT_EQ(j["files"], 12);
  EXPECT_EQ(j["failed"], 0);
  for (const auto& [stem, img] : inputs) {
    SCOPED_TRACE(stem);
    auto ids = read_label_file((out / (stem + ".png")).string());  // 8-bit single channel
    ASSERT_EQ(ids.size(0), img.size(0));
    ASSERT_EQ(ids.size(1), img.size(1));
    EXPECT_GE(fx::agreement(ids, ref.predict(img).labels), kAgree);
    auto colour = read_image_file((out / (stem + "_color.png")).string());
    EXPECT_TRUE(colour.equal(colorize(ids, ref.meta().palette)));
    auto over = read_image_file((out / (stem + "_overlay.png")).string());
    EXPECT_TRUE(over.equal(overlay(img, ids, ref.meta().palette, 0.4)));
  }
  EXPECT_FALSE(fs::exists(out / "notes.png"));
  fs::remove_all(dir);
}

TEST(SegmentCli, SingleFilesWithOneFormat) {
  fx::one_thread();
  auto dir = fx::temp_dir("segment_files");
  const std::string weights = fx::random_weights(dir);
  auto img = fx::shapes_sample(40, 52, 5).first;
  write_png((dir / "x.png").string(), img);
  write_jpeg((dir / "y.jpeg").string(), img);
  auto r = fx::run_cli({"segment", (dir / "x.png").string(), (dir / "y.jpeg").string(), "--weights", weights, "--out",
                        (dir / "o").string(), "--format", "ids"},
                       dir);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(read_label_file((dir / "o" / "x.png").string()).sizes(), (std::vector<int64_t>{40, 52}));
  EXPECT_TRUE(fs::exists(dir / "o" / "y.png"));
  EXPECT_FALSE(fs::exists(dir / "o" / "x_color.png"));
  EXPECT_FALSE(fs::exists(dir / "o" / "x_overlay.png"));
  // the same folder as the input: ids would replace x.png → refused
  r = fx::run_cli({"segment", (dir / "x.png").string(), "--weights", weights, "--out", dir.string(), "--format", "ids"}, dir);
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("would replace its input"), std::string::npos) << r.err;
  fs::remove_all(dir);
}

// --input-size: the network runs at that size, the ids come back at the input's own size.
TEST(SegmentCli, InputSizeWritesIdsAtTheInputSize) {
  fx::one_thread();
  auto dir = fx::temp_dir("segment_input_size");
  const std::string weights = fx::random_weights(dir);
  auto img = fx::shapes_sample(45, 77, 6).first;
  write_png((dir / "x.png").string(), img);
  auto r = fx::run_cli({"segment", (dir / "x.png").string(), "--weights", weights, "--out", (dir / "o").string(),
                        "--format", "ids", "--input-size", "64x96"},
                       dir);
  ASSERT_EQ(r.code, 0) << r.err;
  auto ids = read_label_file((dir / "o" / "x.png").string());
  EXPECT_EQ(ids.sizes(), (std::vector<int64_t>{45, 77}));
  PredictorOptions po;
  po.weights = weights;
  po.input_size = InputSize::parse("64x96");
  EXPECT_GE(fx::agreement(ids, Predictor(po).predict(img).labels), kAgree);
  r = fx::run_cli({"segment", (dir / "x.png").string(), "--weights", weights, "--out", (dir / "o2").string(),
                   "--input-size", "12"},
                  dir);
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.err.find("--input-size"), std::string::npos) << r.err;
  fs::remove_all(dir);
}

TEST(SegmentCli, BadInputsFailWithAClearMessage) {
  fx::one_thread();
  auto dir = fx::temp_dir("segment_bad");
  const std::string weights = fx::random_weights(dir);
  auto r = fx::run_cli({"segment", (dir / "missing.png").string(), "--weights", weights}, dir);
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("error: input '"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("does not exist"), std::string::npos) << r.err;

  r = fx::run_cli({"segment", "--weights", weights}, dir);
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("nothing to segment"), std::string::npos) << r.err;

  // a corrupt file among good ones: the good ones are written, the run fails naming the bad one
  fs::create_directories(dir / "mixed");
  auto img = fx::shapes_sample(40, 40, 6).first;
  write_png((dir / "mixed" / "good.png").string(), img);
  std::string png = encode_png(img);
  std::ofstream(dir / "mixed" / "broken.png", std::ios::binary) << png.substr(0, png.size() / 2);
  r = fx::run_cli({"segment", (dir / "mixed").string(), "--weights", weights, "--out", (dir / "o").string()}, dir);
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("broken.png"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("1 of 2 inputs"), std::string::npos) << r.err;
  EXPECT_TRUE(fs::exists(dir / "o" / "good.png"));
  EXPECT_TRUE(fs::exists(dir / "o" / "good_overlay.png"));

  // two inputs that would write the same files
  fs::create_directories(dir / "p");
  fs::create_directories(dir / "q");
  write_png((dir / "p" / "same.png").string(), img);
  write_png((dir / "q" / "same.png").string(), img);
  r = fx::run_cli({"segment", (dir / "p").string(), (dir / "q").string(), "--weights", weights, "--out",
                   (dir / "o2").string()},
                  dir);
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("would both be written"), std::string::npos) << r.err;

  r = fx::run_cli({"segment", (dir / "p").string(), "--weights", (dir / "nope.lsw").string()}, dir);
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("error: "), std::string::npos) << r.err;
  fs::remove_all(dir);
}

TEST(SegmentCli, NoOutputReplacesAnInputOrAnotherOutput) {
  // Every output path of the run is checked against every input and every other output
  // before anything is written, whatever --format says.
  fx::one_thread();
  auto dir = fx::temp_dir("segment_clash");
  const std::string weights = fx::random_weights(dir);
  auto img = fx::shapes_sample(32, 40, 8).first;
  const fs::path in = dir / "in";
  fs::create_directories(in);
  write_jpeg((in / "photo.jpg").string(), img);
  write_png((in / "photo_color.png").string(), img);
  write_png((in / "photo_overlay.png").string(), img);
  auto snapshot = [&] {
    std::map<std::string, std::string> files;
    for (const auto& e : fs::recursive_directory_iterator(in)) files[e.path().string()] = read_file(e.path().string());
    return files;
  };
  const auto before = snapshot();
  // photo.jpg's colour mask (overlay) would be written over the input photo_color.png (photo_overlay.png)
  for (const char* format : {"color", "overlay", "all"}) {
    SCOPED_TRACE(format);
    auto r = fx::run_cli({"segment", in.string(), "--weights", weights, "--out", in.string(), "--format", format}, dir);
    EXPECT_EQ(r.code, 1) << r.out;
    EXPECT_NE(r.err.find("would replace"), std::string::npos) << r.err;
    EXPECT_EQ(snapshot(), before);  // nothing modified, nothing added
  }
  // the same through another spelling of the folder
  auto r = fx::run_cli({"segment", (in / "photo.jpg").string(), (in / "photo_color.png").string(), "--weights", weights,
                        "--out", (in / "." / ".." / "in").string(), "--format", "color"},
                       dir);
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.err.find("would replace"), std::string::npos) << r.err;
  EXPECT_EQ(snapshot(), before);

  // two inputs whose outputs collide: an error (not a silent overwrite, not a renamed output)
  fs::create_directories(dir / "two");
  write_png((dir / "two" / "a.png").string(), img);
  write_png((dir / "two" / "a_color.png").string(), img);  // its ids file is a.png's colour mask
  const fs::path out = dir / "o";
  r = fx::run_cli({"segment", (dir / "two").string(), "--weights", weights, "--out", out.string(), "--format", "all"}, dir);
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.err.find("would both be written"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("a_color.png"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(out));
  // ... but with --format ids they do not collide
  r = fx::run_cli({"segment", (dir / "two").string(), "--weights", weights, "--out", out.string(), "--format", "ids"}, dir);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(fs::exists(out / "a.png"));
  EXPECT_TRUE(fs::exists(out / "a_color.png"));
  fs::remove_all(out);
  // a.png and a.jpg would both be a.png
  write_jpeg((dir / "two" / "a.jpg").string(), img);
  r = fx::run_cli({"segment", (dir / "two").string(), "--weights", weights, "--out", out.string(), "--format", "ids"}, dir);
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.err.find("would both be written"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(out));
  fs::remove_all(dir);
}

TEST(SegmentCli, AFailedWriteCountsItsInputOnce) {
  // An output that cannot be written fails its input: the summary counts inputs, not outputs.
  fx::one_thread();
  auto dir = fx::temp_dir("segment_writefail");
  const std::string weights = fx::random_weights(dir);
  auto img = fx::shapes_sample(32, 40, 9).first;
  write_png((dir / "good.png").string(), img);
  write_png((dir / "bad.png").string(), img);
  const fs::path out = dir / "o";
  fs::create_directories(out / "bad_color.png" / "in_the_way");  // a folder where bad's colour mask goes
  auto r = fx::run_cli({"segment", (dir / "good.png").string(), (dir / "bad.png").string(), "--weights", weights,
                        "--out", out.string(), "--format", "all", "--json"},
                       dir);
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.err.find("bad_color.png"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("1 of 2 inputs could not be segmented"), std::string::npos) << r.err;
  ASSERT_NE(r.out.rfind('{'), std::string::npos) << r.out;
  auto j = nlohmann::json::parse(r.out.substr(r.out.rfind('{')));
  EXPECT_EQ(j["images"], 1);
  EXPECT_EQ(j["failed"], 1);
  EXPECT_EQ(j["files"], 3);  // good's three; bad's ids, written before the failure, are removed (N8)
  EXPECT_FALSE(fs::exists(out / "bad.png")) << "a failed input left a partial output";
  EXPECT_NE(r.out.find("segmented 1 images"), std::string::npos) << r.out;
  EXPECT_TRUE(fs::exists(out / "good_overlay.png"));
  EXPECT_TRUE(fs::is_directory(out / "bad_color.png"));
  for (const auto& e : fs::directory_iterator(out))  // no temporary (NAME.tmp.PID) left behind
    EXPECT_EQ(e.path().filename().string().find(".tmp"), std::string::npos) << e.path();
  // one input alone
  r = fx::run_cli({"segment", (dir / "bad.png").string(), "--weights", weights, "--out", out.string()}, dir);
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.err.find("1 of 1 inputs could not be segmented"), std::string::npos) << r.err;
  fs::remove_all(dir);
}

TEST(SegmentCli, NonRegularInputsAreRefusedUpFront) {  // N9: a FIFO would block for ever
  fx::one_thread();
  auto dir = fx::temp_dir("segment_fifo");
  const std::string weights = fx::random_weights(dir);
  const fs::path fifo = dir / "f.png";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const auto t0 = std::chrono::steady_clock::now();
  auto r = fx::run_cli({"segment", fifo.string(), "--weights", weights, "--out", (dir / "o").string()}, dir);
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 60);
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.err.find("not a regular file"), std::string::npos) << r.err;
  fs::remove_all(dir);
}

TEST(SegmentCli, OutputsInsideTheInputFolderAreNotReadAgain) {  // N10: run it twice
  fx::one_thread();
  auto dir = fx::temp_dir("segment_twice");
  const std::string weights = fx::random_weights(dir);
  fs::create_directories(dir / "in");
  write_png((dir / "in" / "a.png").string(), fx::shapes_sample(32, 40, 9).first);
  for (int run = 0; run < 2; ++run) {
    auto r = fx::run_cli({"segment", (dir / "in").string(), "--weights", weights, "--out", (dir / "in" / "out").string(),
                          "--format", "all"},
                         dir);
    EXPECT_EQ(r.code, 0) << "run " << run << ": " << r.err;
    EXPECT_NE(r.out.find("segmented 1 images"), std::string::npos) << r.out;
  }
  EXPECT_FALSE(fs::exists(dir / "in" / "out" / "out"));
  fs::remove_all(dir);
}

TEST(SegmentCli, ADamagedVideoFailsUnlessPartialIsAllowed) {  // N7
  fx::one_thread();
#if LIGHTSEG_HAVE_OPENCV
  auto dir = fx::temp_dir("segment_damaged");
  const std::string weights = fx::random_weights(dir);
  const fs::path video = dir / "clip.avi";
  const int W = 64, H = 48, N = 20;
  {
    cv::VideoWriter w(video.string(), cv::VideoWriter::fourcc('M', 'J', 'P', 'G'), 10, cv::Size(W, H));
    if (!w.isOpened()) GTEST_SKIP() << "OpenCV cannot write an MJPG .avi here (no video I/O backend)";
    for (int i = 0; i < N; ++i) {
      auto rgb = fx::shapes_sample(H, W, 40 + i).first.contiguous();
      cv::Mat bgr;
      cv::cvtColor(cv::Mat(H, W, CV_8UC3, rgb.data_ptr<uint8_t>()), bgr, cv::COLOR_RGB2BGR);
      w.write(bgr);
    }
  }
  fs::resize_file(video, fs::file_size(video) / 2);
  {
    cv::VideoCapture cap(video.string());
    if (!cap.isOpened()) GTEST_SKIP() << "OpenCV cannot open the truncated .avi here";
  }
  const fs::path out = dir / "out";
  auto r = fx::run_cli({"segment", video.string(), "--weights", weights, "--out", out.string(), "--format", "all"}, dir);
  EXPECT_EQ(r.code, 1) << r.out << r.err;
  EXPECT_NE((r.out + r.err).find("frames could be read"), std::string::npos) << r.out << r.err;
  EXPECT_FALSE(fs::exists(out / "clip_ids")) << "a failed video left its frames";
  EXPECT_FALSE(fs::exists(out / "clip_overlay.avi"));
  r = fx::run_cli({"segment", video.string(), "--weights", weights, "--out", out.string(), "--format", "ids",
                   "--allow-partial"},
                  dir);
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_NE((r.out + r.err).find("warning"), std::string::npos) << r.out << r.err;
  EXPECT_TRUE(fs::exists(out / "clip_ids" / "000000.png"));
  fs::remove_all(dir);
#else
  GTEST_SKIP() << "built without OpenCV: video input is not available in this build";
#endif
}

TEST(SegmentCli, VideoRoundTrip) {
  fx::one_thread();
#if LIGHTSEG_HAVE_OPENCV
  auto dir = fx::temp_dir("segment_video");
  const std::string weights = fx::random_weights(dir);
  const fs::path video = dir / "clip.avi";
  const int W = 64, H = 48, N = 6;
  {
    cv::VideoWriter w(video.string(), cv::VideoWriter::fourcc('M', 'J', 'P', 'G'), 10, cv::Size(W, H));
    if (!w.isOpened()) GTEST_SKIP() << "OpenCV cannot write an MJPG .avi here (no video I/O backend)";
    for (int i = 0; i < N; ++i) {
      auto rgb = fx::shapes_sample(H, W, 40 + i).first.contiguous();
      cv::Mat bgr;
      cv::cvtColor(cv::Mat(H, W, CV_8UC3, rgb.data_ptr<uint8_t>()), bgr, cv::COLOR_RGB2BGR);
      w.write(bgr);
    }
  }
  // what the CLI will see: the frames as OpenCV decodes them
  std::vector<torch::Tensor> frames;
  {
    cv::VideoCapture cap(video.string());
    if (!cap.isOpened()) GTEST_SKIP() << "OpenCV cannot read back an MJPG .avi here (no video I/O backend)";
    cv::Mat f, rgb;
    while (cap.read(f) && !f.empty()) {
      cv::cvtColor(f, rgb, cv::COLOR_BGR2RGB);
      frames.push_back(torch::from_blob(rgb.data, {rgb.rows, rgb.cols, 3}, torch::kUInt8).clone());
    }
  }
  ASSERT_EQ(static_cast<int>(frames.size()), N);
  const fs::path out = dir / "out";
  auto r = fx::run_cli({"segment", video.string(), "--weights", weights, "--out", out.string(), "--format", "all"}, dir);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("and 6 video frames"), std::string::npos) << r.out;
  Predictor ref(fx::random_network(), ModelMeta::camvid());
  for (int i = 0; i < N; ++i) {
    char name[32];
    std::snprintf(name, sizeof name, "%06d.png", i);
    auto ids = read_label_file((out / "clip_ids" / name).string());
    ASSERT_EQ(ids.sizes(), (std::vector<int64_t>{H, W}));
    EXPECT_GE(fx::agreement(ids, ref.predict(frames[i]).labels), kAgree) << "frame " << i;
  }
  for (const char* suffix : {"_overlay.avi", "_color.avi"}) {
    cv::VideoCapture cap((out / (std::string("clip") + suffix)).string());
    ASSERT_TRUE(cap.isOpened()) << suffix;
    int n = 0;
    cv::Mat f;
    while (cap.read(f) && !f.empty()) {
      EXPECT_EQ(f.cols, W);
      EXPECT_EQ(f.rows, H);
      ++n;
    }
    EXPECT_EQ(n, N) << suffix;
  }
  // --max-frames stops early
  r = fx::run_cli({"segment", video.string(), "--weights", weights, "--out", (dir / "o2").string(), "--format", "ids",
                   "--max-frames", "2"},
                  dir);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(fs::exists(dir / "o2" / "clip_ids" / "000001.png"));
  EXPECT_FALSE(fs::exists(dir / "o2" / "clip_ids" / "000002.png"));
  fs::remove_all(dir);
#else
  GTEST_SKIP() << "built without OpenCV: video input is not available in this build";
#endif
}

// stderr that is not a terminal (a log file): no line at the start, whose rate and ETA would
// carry the start-up (a 3 s job once logged "ETA 31s"), and a last line for the last item.
TEST(SegmentCli, ProgressInALogFile) {
  fx::one_thread();
  auto dir = fx::temp_dir("segment_progress");
  const std::string weights = fx::random_weights(dir);
  fs::create_directories(dir / "in");
  for (int i = 0; i < 3; ++i) write_png((dir / "in" / ("p" + std::to_string(i) + ".png")).string(), fx::shapes_sample(40, 48, 70 + i).first);
  auto r = fx::run_cli({"segment", (dir / "in").string(), "--weights", weights, "--out", (dir / "out").string(),
                        "--format", "ids"},
                       dir);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("segment 3/3 images"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("ETA 0s"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("segment 1/3"), std::string::npos) << "a line from the start-up:\n" << r.err;
  EXPECT_EQ(r.err.find('\r'), std::string::npos) << "terminal control characters in a log file";
  fs::remove_all(dir);
}
