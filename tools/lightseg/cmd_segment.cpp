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
#include <optional>
#include <set>
#include <tuple>

#include <nlohmann/json.hpp>

#include "args.h"
#include "lightseg/file_io.h"
#include "lightseg/features.h"
#include "lightseg/image_io.h"
#include "lightseg/palette.h"
#include "lightseg/predictor.h"
#include "lightseg/runtime.h"
#include "progress.h"
#include "video_pipeline.h"

namespace fs = std::filesystem;

namespace lightseg::cli {

namespace {

struct SegmentArgs {
  std::vector<std::string> inputs;
  std::string format = "all";
  double alpha = 0.5;
  std::string camera;  // any OpenCV capture string: N, /dev/videoN, a file, a URL, a GStreamer pipeline
  std::string log;     // --log FILE.jsonl
  int64_t max_frames = 0;
  bool allow_partial = false;
};

struct Job {
  fs::path input;
  std::string stem;  // output name relative to --out, without suffix or extension
  bool video = false;
};

// A video file as a capture source (its outputs keep the job's stem: folder/name).
CaptureSource file_source(const Job& j) {
  CaptureSource c = classify_source(j.input.string(), /*exists_as_file=*/true);
  c.kind = SourceKind::File;
  c.name = j.input.string();
  c.stem = j.stem;
  return c;
}

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
void check_outputs(const std::vector<Job>& jobs, const CaptureSource* live, const fs::path& out, const Outputs& o) {
  struct Target {
    fs::path path;
    std::string from;     // the input it comes from
    size_t job;           // jobs.size(): the live source
    bool folder = false;  // video label ids: frame files inside
  };
  std::vector<Target> targets;
  auto add_video = [&](const fs::path& base, const std::string& from, size_t job, const std::string& ext) {
    if (o.ids) targets.push_back({base.string() + "_ids", from, job, true});
    if (o.color) targets.push_back({base.string() + "_color" + ext, from, job});
    if (o.overlay) targets.push_back({base.string() + "_overlay" + ext, from, job});
  };
  for (size_t i = 0; i < jobs.size(); ++i) {
    const fs::path base = out / jobs[i].stem;
    if (jobs[i].video) {
      add_video(base, jobs[i].input.string(), i, output_container(file_source(jobs[i])).ext);
      continue;
    }
    if (o.ids) targets.push_back({base.string() + ".png", jobs[i].input.string(), i});
    if (o.color) targets.push_back({base.string() + "_color.png", jobs[i].input.string(), i});
    if (o.overlay) targets.push_back({base.string() + "_overlay.png", jobs[i].input.string(), i});
  }
  if (live) add_video(out / live->stem, live->name, jobs.size(), output_container(*live).ext);

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
  double first_s = 0;
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
    if (i == 0) first_s = seconds_since(t0);
    line.update(rate_line("images", static_cast<int64_t>(i) + 1, static_cast<int64_t>(jobs.size()), seconds_since(t0), first_s),
                /*force=*/i + 1 == jobs.size());
  }
  finish_write();
  if (next.valid()) next.wait();
}

}  // namespace

void add_segment(CLI::App& app, Args& a) {
  auto* sub = app.add_subcommand(
      "segment", "Segment images, folders (recursive .png/.jpg), videos, a camera or a stream: label-id PNGs, colour masks, overlays");
  add_options(sub, a, {Opt::Weights, Opt::Out, Opt::Json, Opt::Device, Opt::Backend, Opt::Precision, Opt::Threads, Opt::Tta, Opt::InputSize});
  static SegmentArgs s;
  sub->add_option("inputs", s.inputs,
                  "Image files, folders, video files, or one live source: a stream URL (rtsp://, http://, ...) or a "
                  "GStreamer pipeline (text with '!', ending in appsink)");
  sub->add_option("--format", s.format,
                  "What to write per image: ids (8-bit label-id PNG, NAME.png), color (NAME_color.png), "
                  "overlay (NAME_overlay.png) or all; videos: NAME_ids/ frames, NAME_color.EXT, NAME_overlay.EXT in the "
                  "input's container where OpenCV can write it (.mp4/.m4v/.mov/.mkv: mp4v), otherwise and for cameras "
                  "and streams MJPG .avi (a note says when it falls back)")
      ->check(CLI::IsMember({"ids", "color", "overlay", "all"}))
      ->capture_default_str();
  sub->add_option("--alpha", s.alpha, "Opacity of the colour mask in overlays")->check(CLI::Range(0.0, 1.0))->capture_default_str();
  sub->add_option("--camera", s.camera,
                  "Also read a live source until Ctrl-C or --max-frames: any OpenCV capture string, a camera index N, "
                  "/dev/videoN, a stream URL (rtsp://..., http://...; gives up after 10 s without an answer) or a "
                  "GStreamer pipeline ('... ! appsink'; refused when OpenCV lacks GStreamer); a file is read as a video. "
                  "Live sources keep only the newest frame: stale frames are dropped and counted");
  sub->add_option("--log", s.log,
                  "Videos, cameras, streams: write a JSONL log, one line per frame (source, frame, sequence, capture_time "
                  "in Unix seconds, latency_ms from capture to outputs written, inference_ms, dropped so far) and a "
                  "summary line per source (frames, dropped, fps, latency mean/p50/p99/max)");
  sub->add_option("--max-frames", s.max_frames, "Stop each video or camera after N frames (0: no limit)")
      ->check(CLI::NonNegativeNumber);
  sub->add_flag("--allow-partial", s.allow_partial,
                "Keep a video of which fewer frames could be read than it announces (damaged or truncated), "
                "with a warning; otherwise it fails and its outputs are removed");
  sub->callback([&a]() {
    // The live source: --camera, or one input that is a URL or a pipeline (not a file that exists).
    std::vector<std::string> inputs;
    std::optional<CaptureSource> live;
    auto set_live = [&](const CaptureSource& c) {
      if (live)
        throw std::runtime_error("one live source per run: " + live->name + " and " + c.name +
                                 " (run segment once for each)");
      live = c;
    };
    std::error_code ec;
    for (const auto& in : s.inputs) {
      if (looks_live(in) && !fs::exists(in, ec)) set_live(classify_source(in, false));
      else inputs.push_back(in);
    }
    if (!s.camera.empty()) {
      const CaptureSource c = classify_source(s.camera, fs::is_regular_file(s.camera, ec));
      if (c.kind == SourceKind::File) {
        if (!fs::exists(s.camera, ec))
          throw std::runtime_error("--camera '" + s.camera +
                                   "' is not a camera index, a /dev/ device, a URL (scheme://...), a GStreamer pipeline "
                                   "(with '!') or a file that exists");
        inputs.push_back(s.camera);  // a file: a video, read frame by frame
      } else {
        set_live(c);
      }
    }
    if (inputs.empty() && !live)
      throw std::runtime_error("nothing to segment: give image files, folders, video files, a stream URL or --camera SRC");
#if !LIGHTSEG_HAVE_OPENCV
    if (live) throw std::runtime_error(live->name + ": this build has no camera or stream support (OpenCV was not found)");
#endif
    Outputs o;
    o.ids = s.format == "ids" || s.format == "all";
    o.color = s.format == "color" || s.format == "all";
    o.overlay = s.format == "overlay" || s.format == "all";
    const fs::path out = a.out.empty() ? fs::path("out") : fs::path(a.out);
    const auto jobs = collect_jobs(inputs, out);  // validates every input before any work
    check_outputs(jobs, live ? &*live : nullptr, out, o);
    std::ofstream log;
    if (!s.log.empty()) {
      if (fs::path(s.log).has_parent_path()) fs::create_directories(fs::path(s.log).parent_path());
      log.open(s.log, std::ios::trunc);
      if (!log) throw std::runtime_error("--log: cannot write '" + s.log + "'");
    }

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
    StreamSettings ss;
    ss.outputs = o;
    ss.alpha = s.alpha;
    ss.max_frames = s.max_frames;
    ss.allow_partial = s.allow_partial;
    ss.log = log.is_open() ? &log : nullptr;
    for (const auto& j : jobs) {
      if (!j.video || g_interrupted) continue;
      const int64_t files_before = t.files;
      const CaptureSource src = file_source(j);
      try {
        segment_source(src, out / j.stem, ss, predictor, line, t);
        ++t.videos;
      } catch (const std::exception& e) {
        line.print(std::string("skipped: ") + e.what());
        remove_stream_outputs(out / j.stem, o, src);  // a failed input leaves no files
        t.files = files_before;
        ++t.failed;
      }
    }
    if (live && !g_interrupted) {
      StreamSettings ls = ss;
      ls.allow_partial = true;
      const int64_t files_before = t.files;
      try {
        segment_source(*live, out / live->stem, ls, predictor, line, t);
      } catch (...) {
        remove_stream_outputs(out / live->stem, o, *live);
        t.files = files_before;
        throw;  // the only source that failed to open: an error, not a summary
      }
    }
    std::signal(SIGINT, previous);
    line.done();
    const double secs = seconds_since(t0);
    const int64_t n = t.images + t.frames;
    std::printf("segmented %lld images", static_cast<long long>(t.images));
    if (t.frames) std::printf(" and %lld video frames", static_cast<long long>(t.frames));
    if (t.dropped) std::printf(" (%lld stale frames dropped)", static_cast<long long>(t.dropped));
    std::printf(" (%.1f Mpx) in %.2f s: %.2f images/s (network %.2f s); %lld files in %s\n", t.pixels / 1e6, secs,
                n / std::max(secs, 1e-9), t.network_s, static_cast<long long>(t.files), out.string().c_str());
    if (g_interrupted) std::printf("interrupted: stopped early\n");
    if (a.json) {
      nlohmann::json j{{"images", t.images}, {"frames", t.frames}, {"dropped", t.dropped}, {"failed", t.failed},
                       {"files", t.files}, {"pixels", t.pixels}, {"seconds", secs}, {"network_seconds", t.network_s},
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
