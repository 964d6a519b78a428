// lightseg segment: images, folders, videos and cameras → label-id PNGs, colour masks, overlays.
#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <future>
#include <iostream>
#include <map>
#include <set>
#include <tuple>

#include <nlohmann/json.hpp>

#include "args.h"
#include "core/file_io.h"
#include "lightseg/features.h"
#include "lightseg/image_io.h"
#include "lightseg/palette.h"
#include "lightseg/predictor.h"
#include "lightseg/runtime.h"
#include "progress.h"

#if LIGHTSEG_HAVE_OPENCV
#include <opencv2/core.hpp>
#include <opencv2/imgproc.hpp>
#include <opencv2/videoio.hpp>
#endif

namespace fs = std::filesystem;

namespace lightseg::cli {

namespace {

struct SegmentArgs {
  std::vector<std::string> inputs;
  std::string format = "all";
  double alpha = 0.5;
  int camera = -1;
  int64_t max_frames = 0;
  bool allow_partial = false;
};

struct Outputs {
  bool ids = false, color = false, overlay = false;
};

struct Job {
  fs::path input;
  std::string stem;  // output name relative to --out, without suffix or extension
  bool video = false;
};

// First Ctrl-C: finish the current image/frame, write what is done, print the summary.
std::atomic<bool> g_interrupted{false};
extern "C" void on_interrupt(int) {
  g_interrupted = true;
  std::signal(SIGINT, SIG_DFL);  // a second Ctrl-C ends the process
}

std::string lower_ext(const fs::path& p) {
  std::string e = p.extension().string();
  std::transform(e.begin(), e.end(), e.begin(), [](unsigned char c) { return std::tolower(c); });
  return e;
}
bool is_image_ext(const std::string& e) { return e == ".png" || e == ".jpg" || e == ".jpeg"; }
bool is_video_ext(const std::string& e) {
  static const std::set<std::string> v{".mp4", ".avi", ".mkv", ".mov", ".webm", ".m4v", ".mpg", ".mpeg", ".wmv", ".flv", ".ts", ".mjpeg", ".mjpg"};
  return v.count(e) > 0;
}

// Inputs are regular files or folders of them: a FIFO, device or socket given by name is
// refused before any work (reading one could block for ever). A folder's walk skips `out` (the
// outputs of an earlier run into a folder inside the input are not inputs).
std::vector<Job> collect_jobs(const std::vector<std::string>& inputs, const fs::path& out) {
  std::vector<Job> jobs;
  std::error_code ec;
  const fs::path out_key = fs::weakly_canonical(out, ec);
  for (const auto& in : inputs) {
    fs::path p(in);
    if (!fs::exists(p, ec)) throw std::runtime_error("input '" + in + "' does not exist");
    if (fs::is_directory(p, ec)) {
      std::vector<fs::path> files;
      for (auto it = fs::recursive_directory_iterator(p, fs::directory_options::skip_permission_denied);
           it != fs::recursive_directory_iterator(); ++it) {
        if (it->is_directory(ec) && fs::weakly_canonical(it->path(), ec) == out_key) {
          it.disable_recursion_pending();
          continue;
        }
        if (it->is_regular_file(ec) && is_image_ext(lower_ext(it->path()))) files.push_back(it->path());
      }
      if (files.empty()) throw std::runtime_error("folder '" + in + "' has no .png/.jpg/.jpeg images");
      std::sort(files.begin(), files.end());
      for (const auto& f : files) {
        fs::path rel = f.lexically_relative(p);
        jobs.push_back({f, (rel.parent_path() / rel.stem()).string(), false});
      }
    } else {
      if (!fs::is_regular_file(p, ec))
        throw std::runtime_error("input '" + in + "' is not a regular file (a FIFO, device or socket): give files or folders");
      const bool video = is_video_ext(lower_ext(p));
#if !LIGHTSEG_HAVE_OPENCV
      if (video)
        throw std::runtime_error("'" + in + "' is a video: this build has no video support (OpenCV was not found)");
#endif
      jobs.push_back({p, p.stem().string(), video});
    }
  }
  return jobs;
}

// A file's identity (device, inode): the same file whatever the path's spelling, symbolic
// links, hard links or bind mounts.
using FileId = std::pair<uint64_t, uint64_t>;
bool file_id(const fs::path& p, FileId& id) {
  struct stat st {};
  if (::stat(p.c_str(), &st) != 0) return false;
  id = {static_cast<uint64_t>(st.st_dev), static_cast<uint64_t>(st.st_ino)};
  return true;
}

// The path with symbolic links resolved as far as it exists.
std::string canonical_key(const fs::path& p) {
  std::error_code ec;
  fs::path c = fs::weakly_canonical(p, ec);
  return ec ? fs::absolute(p, ec).lexically_normal().string() : c.string();
}

// Video label ids go into a folder as 000000.png, 000001.png, ...
bool is_frame_name(const std::string& f) {
  return f.size() >= 10 && f.compare(f.size() - 4, 4, ".png") == 0 &&
         f.find_first_not_of("0123456789") == f.size() - 4;
}

// Every path the run writes is checked, before anything is written, against every input
// (no output may replace one) and every other output (two inputs must not write the same
// file: an error rather than a renamed output, so that NAME → NAME.png etc. always holds).
void check_outputs(const std::vector<Job>& jobs, int camera, const fs::path& out, const Outputs& o) {
  struct Target {
    fs::path path;
    std::string from;     // the input it comes from
    size_t job;           // jobs.size(): the camera
    bool folder = false;  // video label ids: frame files inside
  };
  std::vector<Target> targets;
  auto add_video = [&](const fs::path& base, const std::string& from, size_t job) {
    if (o.ids) targets.push_back({base.string() + "_ids", from, job, true});
    if (o.color) targets.push_back({base.string() + "_color.avi", from, job});
    if (o.overlay) targets.push_back({base.string() + "_overlay.avi", from, job});
  };
  for (size_t i = 0; i < jobs.size(); ++i) {
    const fs::path base = out / jobs[i].stem;
    if (jobs[i].video) {
      add_video(base, jobs[i].input.string(), i);
      continue;
    }
    if (o.ids) targets.push_back({base.string() + ".png", jobs[i].input.string(), i});
    if (o.color) targets.push_back({base.string() + "_color.png", jobs[i].input.string(), i});
    if (o.overlay) targets.push_back({base.string() + "_overlay.png", jobs[i].input.string(), i});
  }
  if (camera >= 0) add_video(out / ("camera" + std::to_string(camera)), "camera " + std::to_string(camera), jobs.size());

  // Against the inputs, by identity: only a target that exists can be one.
  std::map<FileId, size_t> input_ids;
  std::map<FileId, std::vector<size_t>> input_dirs;  // parent folder → inputs named like frames
  for (size_t i = 0; i < jobs.size(); ++i) {
    FileId id;
    if (file_id(jobs[i].input, id)) input_ids.emplace(id, i);
    if (is_frame_name(jobs[i].input.filename().string()) &&
        file_id(jobs[i].input.has_parent_path() ? jobs[i].input.parent_path() : fs::path("."), id))
      input_dirs[id].push_back(i);
  }
  for (const auto& t : targets) {
    FileId id;
    if (!file_id(t.path, id)) continue;
    if (t.folder) {
      auto it = input_dirs.find(id);
      if (it != input_dirs.end())
        throw std::runtime_error("writing the frames of '" + t.from + "' into " + t.path.string() +
                                 " would replace the input '" + jobs[it->second.front()].input.string() +
                                 "'; choose another --out");
      continue;
    }
    auto it = input_ids.find(id);
    if (it == input_ids.end()) continue;
    if (it->second == t.job)
      throw std::runtime_error("writing " + t.path.string() + " would replace its input; choose another --out");
    throw std::runtime_error("writing " + t.path.string() + " (from '" + t.from + "') would replace the input '" +
                             jobs[it->second].input.string() + "'; choose another --out");
  }

  // Against each other, by canonical path (most do not exist yet).
  std::map<std::string, const Target*> seen;
  std::map<std::string, const Target*> frame_folders;
  for (const auto& t : targets) {
    const std::string key = canonical_key(t.path);
    auto [it, fresh] = seen.emplace(key, &t);
    if (!fresh)
      throw std::runtime_error("'" + it->second->from + "' and '" + t.from + "' would both be written to " +
                               t.path.string() + ": rename one, or segment them into different --out folders");
    if (t.folder) frame_folders.emplace(key, &t);
  }
  for (const auto& t : targets) {
    if (t.folder || !is_frame_name(t.path.filename().string())) continue;
    auto it = frame_folders.find(canonical_key(t.path.parent_path()));
    if (it != frame_folders.end())
      throw std::runtime_error("'" + it->second->from + "' and '" + t.from + "' would both be written to " +
                               t.path.string() + ": rename one, or segment them into different --out folders");
  }
}

// Through a temporary name (no half-written outputs after a crash or Ctrl-C); no fsync: the
// outputs can be made again.
void write_bytes(const fs::path& path, const std::string& bytes) { write_file_atomic(path.string(), bytes, /*sync=*/false); }

// One image's files, all or none: a failure removes the ones already written for it.
struct Written {
  int files = 0;
  std::string error;
};
Written write_image_outputs(const fs::path& base, const Outputs& o, const torch::Tensor& image,
                            const torch::Tensor& labels, const ModelMeta& meta, double alpha) {
  Written w;
  std::vector<std::string> done;
  try {
    fs::create_directories(base.parent_path());
    for (auto [wanted, what, suffix] : {std::tuple{o.ids, Render::Ids, ".png"}, {o.color, Render::Color, "_color.png"},
                                         {o.overlay, Render::Overlay, "_overlay.png"}}) {
      if (!wanted) continue;
      write_bytes(base.string() + suffix, render(image, labels, meta.palette, what, alpha));
      done.push_back(base.string() + suffix);
    }
    w.files = static_cast<int>(done.size());
  } catch (const std::exception& e) {
    w.error = e.what();
    std::error_code ec;
    for (const auto& f : done) fs::remove(f, ec);
  }
  return w;
}

// Each input ends up in exactly one of images, videos and failed (the summary counts inputs).
struct Totals {
  int64_t images = 0, videos = 0, frames = 0, failed = 0, files = 0, pixels = 0;
  double network_s = 0;
};

std::string rate_line(const std::string& what, int64_t done, int64_t total, double seconds) {
  char b[256];
  const double rate = done / std::max(seconds, 1e-9);
  if (total > 0)
    std::snprintf(b, sizeof b, "segment %lld/%lld %s · %.1f %s/s · ETA %s", static_cast<long long>(done),
                  static_cast<long long>(total), what.c_str(), rate, what.c_str(),
                  fmt_duration((total - done) / std::max(rate, 1e-9)).c_str());
  else
    std::snprintf(b, sizeof b, "segment %lld %s · %.1f %s/s", static_cast<long long>(done), what.c_str(), rate, what.c_str());
  return b;
}

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// Images: decoding of the next image and writing of the previous one overlap the forward pass.
void segment_images(const std::vector<Job>& jobs, const fs::path& out, const Outputs& o, const Predictor& p,
                    double alpha, ProgressLine& line, Totals& t) {
  if (jobs.empty()) return;
  struct Decoded {
    torch::Tensor image;
    std::string error;
  };
  auto decode = [&](size_t i) {
    Decoded d;
    try {
      const std::string what = "'" + jobs[i].input.string() + "'";
      std::string bytes = read_file(jobs[i].input.string());
      p.inspect(bytes.data(), bytes.size(), {}, what);  // the front door: header, pixel limit
      d.image = decode_image(bytes.data(), bytes.size(), what);
    } catch (const std::exception& e) {
      d.error = e.what();
    }
    return d;
  };
  const auto t0 = Clock::now();
  std::future<Decoded> next = std::async(std::launch::async, decode, 0);
  // An image counts as segmented once its files are written; a write failure fails it instead.
  std::future<Written> writing;
  int64_t writing_pixels = 0;
  auto finish_write = [&] {
    if (!writing.valid()) return;
    const Written w = writing.get();
    t.files += w.files;
    if (w.error.empty()) {
      ++t.images;
      t.pixels += writing_pixels;
    } else {
      line.print("error: " + w.error);
      ++t.failed;
    }
  };
  for (size_t i = 0; i < jobs.size() && !g_interrupted; ++i) {
    Decoded d = next.get();
    if (i + 1 < jobs.size()) next = std::async(std::launch::async, decode, i + 1);
    if (!d.error.empty()) {
      line.print("skipped: " + d.error);
      ++t.failed;
      continue;
    }
    const auto tn = Clock::now();
    Prediction pr = p.predict(d.image);
    t.network_s += seconds_since(tn);
    finish_write();
    writing = std::async(std::launch::async, write_image_outputs, out / jobs[i].stem, o, d.image, pr.labels,
                         std::cref(p.meta()), alpha);
    writing_pixels = d.image.size(0) * d.image.size(1);
    line.update(rate_line("images", static_cast<int64_t>(i) + 1, static_cast<int64_t>(jobs.size()), seconds_since(t0)));
  }
  finish_write();
  if (next.valid()) next.wait();
}

#if LIGHTSEG_HAVE_OPENCV
// A video file or a camera: an overlaid (and/or colour) MJPG .avi at the source's frame rate,
// label-id PNGs per frame in <stem>_ids/.
// The files a video or camera writes (segment_stream), removed when it fails.
void remove_stream_outputs(const fs::path& base, const Outputs& o) {
  std::error_code ec;
  if (o.ids) fs::remove_all(base.string() + "_ids", ec);
  if (o.color) fs::remove(base.string() + "_color.avi", ec);
  if (o.overlay) fs::remove(base.string() + "_overlay.avi", ec);
}

// Returns the frames written; throws when none could be read, or (unless allow_partial) when
// fewer than the container announces were (a damaged or truncated file).
int64_t segment_stream(cv::VideoCapture& cap, const std::string& name, const fs::path& base, const Outputs& o,
                    const Predictor& p, double alpha, int64_t max_frames, bool allow_partial, ProgressLine& line, Totals& t) {
  double fps = cap.get(cv::CAP_PROP_FPS);
  if (!(fps >= 1 && fps <= 240)) fps = 25;
  int64_t total = static_cast<int64_t>(cap.get(cv::CAP_PROP_FRAME_COUNT));
  if (total <= 0) total = 0;
  const int64_t announced = total;
  if (max_frames > 0 && (total == 0 || max_frames < total)) total = max_frames;
  fs::create_directories(base.parent_path());
  const fs::path ids_dir = base.string() + "_ids";
  if (o.ids) fs::create_directories(ids_dir);
  cv::VideoWriter w_overlay, w_color;
  auto open_writer = [&](cv::VideoWriter& w, const std::string& suffix, cv::Size size) {
    const std::string path = base.string() + suffix;
    if (!w.open(path, cv::VideoWriter::fourcc('M', 'J', 'P', 'G'), fps, size))
      throw std::runtime_error("cannot write video '" + path + "'");
    ++t.files;
  };
  cv::Mat frame, rgb, bgr;
  const auto t0 = Clock::now();
  int64_t n = 0;
  while (!g_interrupted && (max_frames <= 0 || n < max_frames) && cap.read(frame) && !frame.empty()) {
    if (frame.channels() == 1) cv::cvtColor(frame, rgb, cv::COLOR_GRAY2RGB);
    else if (frame.channels() == 4) cv::cvtColor(frame, rgb, cv::COLOR_BGRA2RGB);
    else cv::cvtColor(frame, rgb, cv::COLOR_BGR2RGB);
    auto image = torch::from_blob(rgb.data, {rgb.rows, rgb.cols, 3}, torch::kUInt8);
    const auto tn = Clock::now();
    Prediction pr = p.predict(image);
    const double ms = seconds_since(tn) * 1000;
    t.network_s += ms / 1000;
    const cv::Size size(rgb.cols, rgb.rows);
    if (o.ids) {
      char fname[32];
      std::snprintf(fname, sizeof fname, "%06lld.png", static_cast<long long>(n));
      write_bytes(ids_dir / fname, encode_png(pr.labels));
      ++t.files;
    }
    if (o.overlay) {
      auto ov = overlay(image, pr.labels, p.meta().palette, alpha);
      cv::cvtColor(cv::Mat(size, CV_8UC3, ov.data_ptr<uint8_t>()), bgr, cv::COLOR_RGB2BGR);
      char stamp[48];
      std::snprintf(stamp, sizeof stamp, "%.0f ms", ms);
      const double scale = std::max(0.4, rgb.rows / 720.0);
      cv::putText(bgr, stamp, {8, static_cast<int>(8 + 22 * scale)}, cv::FONT_HERSHEY_SIMPLEX, scale, {0, 0, 0}, 3, cv::LINE_AA);
      cv::putText(bgr, stamp, {8, static_cast<int>(8 + 22 * scale)}, cv::FONT_HERSHEY_SIMPLEX, scale, {255, 255, 255}, 1, cv::LINE_AA);
      if (!w_overlay.isOpened()) open_writer(w_overlay, "_overlay.avi", size);
      w_overlay.write(bgr);
    }
    if (o.color) {
      auto col = colorize(pr.labels, p.meta().palette);
      cv::cvtColor(cv::Mat(size, CV_8UC3, col.data_ptr<uint8_t>()), bgr, cv::COLOR_RGB2BGR);
      if (!w_color.isOpened()) open_writer(w_color, "_color.avi", size);
      w_color.write(bgr);
    }
    ++n;
    t.pixels += static_cast<int64_t>(rgb.rows) * rgb.cols;
    line.update(name + ": " + rate_line("frames", n, total, seconds_since(t0)));
  }
  if (n == 0) throw std::runtime_error(name + ": no frames could be read");
  const int64_t expected = max_frames > 0 && announced > 0 ? std::min(max_frames, announced) : announced;
  if (!g_interrupted && expected > 0 && n < expected) {
    const std::string what = name + ": only " + std::to_string(n) + " of " + std::to_string(expected) +
                             " frames could be read (a damaged or truncated file?)";
    if (!allow_partial) throw std::runtime_error(what + "; --allow-partial keeps what was read");
    line.print("warning: " + what + "; kept (--allow-partial)");
  }
  t.frames += n;
  line.print(name + ": " + std::to_string(n) + " frames → " + base.string() + "*");
  return n;
}
#endif

}  // namespace

void add_segment(CLI::App& app, Args& a) {
  auto* sub = app.add_subcommand(
      "segment", "Segment images, folders (recursive .png/.jpg), videos or a camera: label-id PNGs, colour masks, overlays");
  add_options(sub, a, {Opt::Weights, Opt::Out, Opt::Json, Opt::Device, Opt::Backend, Opt::Precision, Opt::Threads, Opt::Tta, Opt::InputSize});
  static SegmentArgs s;
  sub->add_option("inputs", s.inputs, "Image files, folders or video files");
  sub->add_option("--format", s.format,
                  "What to write per image: ids (8-bit label-id PNG, NAME.png), color (NAME_color.png), "
                  "overlay (NAME_overlay.png) or all; videos: NAME_ids/ frames, NAME_color.avi, NAME_overlay.avi")
      ->check(CLI::IsMember({"ids", "color", "overlay", "all"}))
      ->capture_default_str();
  sub->add_option("--alpha", s.alpha, "Opacity of the colour mask in overlays")->check(CLI::Range(0.0, 1.0))->capture_default_str();
  sub->add_option("--camera", s.camera, "Also read camera N (OpenCV) until Ctrl-C or --max-frames")->check(CLI::NonNegativeNumber);
  sub->add_option("--max-frames", s.max_frames, "Stop each video or camera after N frames (0: no limit)")
      ->check(CLI::NonNegativeNumber);
  sub->add_flag("--allow-partial", s.allow_partial,
                "Keep a video of which fewer frames could be read than it announces (damaged or truncated), "
                "with a warning; otherwise it fails and its outputs are removed");
  sub->callback([&a]() {
    if (s.inputs.empty() && s.camera < 0)
      throw std::runtime_error("nothing to segment: give image files, folders, video files or --camera N");
#if !LIGHTSEG_HAVE_OPENCV
    if (s.camera >= 0) throw std::runtime_error("--camera: this build has no camera support (OpenCV was not found)");
#endif
    Outputs o;
    o.ids = s.format == "ids" || s.format == "all";
    o.color = s.format == "color" || s.format == "all";
    o.overlay = s.format == "overlay" || s.format == "all";
    const fs::path out = a.out.empty() ? fs::path("out") : fs::path(a.out);
    const auto jobs = collect_jobs(s.inputs, out);  // validates every input before any work
    check_outputs(jobs, s.camera, out, o);

    init_runtime(a.threads);
    PredictorOptions po;
    po.weights = resolve_weights(a.weights);
    po.engine = engine_options(a);
    po.input_size = InputSize::parse(a.input_size);
    Predictor predictor(po);
    fs::create_directories(out);

    g_interrupted = false;
    auto previous = std::signal(SIGINT, on_interrupt);
    ProgressLine line;
    Totals t;
    const auto t0 = Clock::now();
    std::vector<Job> images;
    for (const auto& j : jobs)
      if (!j.video) images.push_back(j);
    segment_images(images, out, o, predictor, s.alpha, line, t);
#if LIGHTSEG_HAVE_OPENCV
    for (const auto& j : jobs) {
      if (!j.video || g_interrupted) continue;
      cv::VideoCapture cap(j.input.string());
      if (!cap.isOpened()) {
        line.print("skipped: '" + j.input.string() + "': cannot open the video");
        ++t.failed;
        continue;
      }
      const int64_t files_before = t.files;
      try {
        segment_stream(cap, j.input.string(), out / j.stem, o, predictor, s.alpha, s.max_frames, s.allow_partial,
                       line, t);
        ++t.videos;
      } catch (const std::exception& e) {
        line.print(std::string("skipped: ") + e.what());
        remove_stream_outputs(out / j.stem, o);  // a failed input leaves no files
        t.files = files_before;
        ++t.failed;
      }
    }
    if (s.camera >= 0 && !g_interrupted) {
      cv::VideoCapture cap(s.camera);
      if (!cap.isOpened()) throw std::runtime_error("cannot open camera " + std::to_string(s.camera));
      line.print("camera " + std::to_string(s.camera) + ": segmenting until Ctrl-C" +
                 (s.max_frames > 0 ? " or " + std::to_string(s.max_frames) + " frames" : std::string()));
      segment_stream(cap, "camera " + std::to_string(s.camera), out / ("camera" + std::to_string(s.camera)), o,
                     predictor, s.alpha, s.max_frames, /*allow_partial=*/true, line, t);
    }
#endif
    std::signal(SIGINT, previous);
    line.done();
    const double secs = seconds_since(t0);
    const int64_t n = t.images + t.frames;
    std::printf("segmented %lld images", static_cast<long long>(t.images));
    if (t.frames) std::printf(" and %lld video frames", static_cast<long long>(t.frames));
    std::printf(" (%.1f Mpx) in %.2f s: %.2f images/s (network %.2f s); %lld files in %s\n", t.pixels / 1e6, secs,
                n / std::max(secs, 1e-9), t.network_s, static_cast<long long>(t.files), out.string().c_str());
    if (g_interrupted) std::printf("interrupted: stopped early\n");
    if (a.json) {
      nlohmann::json j{{"images", t.images}, {"frames", t.frames}, {"failed", t.failed}, {"files", t.files},
                       {"pixels", t.pixels}, {"seconds", secs}, {"network_seconds", t.network_s},
                       {"images_per_second", n / std::max(secs, 1e-9)}, {"out", out.string()},
                       {"weights", po.weights}, {"backend", predictor.backend()}, {"interrupted", g_interrupted.load()}};
      std::cout << j.dump() << std::endl;
    }
    std::fflush(stdout);
    if (t.failed > 0)
      throw std::runtime_error(std::to_string(t.failed) + " of " + std::to_string(t.failed + t.images + t.videos) +
                               " inputs could not be segmented (see the messages above)");
  });
}

}  // namespace lightseg::cli
