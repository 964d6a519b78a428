// What an OpenCV capture string is (a device index, a device path, a file, a stream URL, a
// GStreamer pipeline), and which container and codec a video's outputs get. Pure text rules,
// OpenCV-free, so the tests check them directly; video_pipeline.cpp opens and writes.
#pragma once

#include <algorithm>
#include <cctype>
#include <string>

namespace lightseg::cli {

enum class SourceKind { File, Device, Url, Pipeline };

struct CaptureSource {
  SourceKind kind = SourceKind::File;
  std::string text;  // as given
  int index = -1;    // Device given as a number
  std::string name;  // for messages: "camera 0", "stream 'rtsp://...'", the file's path
  std::string stem;  // the outputs' name under --out: camera0, video0, stream, or the file's stem
  // Cameras, URLs and pipelines run in real time: latest-frame semantics, stale frames dropped.
  bool live() const { return kind != SourceKind::File; }
};

inline bool looks_like_url(const std::string& s) {
  const auto p = s.find("://");
  if (p == std::string::npos || p == 0) return false;
  return std::all_of(s.begin(), s.begin() + static_cast<long>(p),
                     [](unsigned char c) { return std::isalnum(c) || c == '+' || c == '-' || c == '.'; });
}
// GStreamer's gst-launch syntax links elements with '!' (a file name with '!' is rare; a file
// that exists is taken as a file first by classify_source's caller).
inline bool looks_like_pipeline(const std::string& s) { return s.find('!') != std::string::npos; }
inline bool looks_live(const std::string& s) { return looks_like_url(s) || looks_like_pipeline(s); }

// `exists_as_file`: the text names an existing regular file (the caller checks the file system).
inline CaptureSource classify_source(const std::string& s, bool exists_as_file) {
  CaptureSource c;
  c.text = s;
  if (!s.empty() && s.size() <= 4 && std::all_of(s.begin(), s.end(), [](unsigned char ch) { return std::isdigit(ch); })) {
    c.kind = SourceKind::Device;
    c.index = std::stoi(s);
    c.name = "camera " + s;
    c.stem = "camera" + s;
  } else if (exists_as_file) {
    c.kind = SourceKind::File;
    c.name = s;
    const auto slash = s.find_last_of('/');
    std::string base = slash == std::string::npos ? s : s.substr(slash + 1);
    const auto dot = base.find_last_of('.');
    c.stem = dot == std::string::npos || dot == 0 ? base : base.substr(0, dot);
  } else if (looks_like_url(s)) {
    c.kind = SourceKind::Url;
    c.name = "stream '" + s + "'";
    c.stem = "stream";
  } else if (looks_like_pipeline(s)) {
    c.kind = SourceKind::Pipeline;
    c.name = "pipeline '" + s + "'";
    c.stem = "stream";
  } else if (s.rfind("/dev/", 0) == 0) {
    c.kind = SourceKind::Device;
    c.name = "camera " + s;
    c.stem = s.substr(s.find_last_of('/') + 1);
  } else {
    c.kind = SourceKind::File;  // the caller reports that it does not exist
    c.name = s;
  }
  return c;
}

// The container and codec of a video's outputs: the input's where OpenCV's writer can make it
// (mp4v in .mp4/.m4v/.mov/.mkv), MJPG in .avi otherwise and for live sources (an .avi cut
// short by a crash still plays; an .mp4 without its index does not).
struct Container {
  std::string ext;     // ".mp4", ".avi", ...
  char fourcc[5];      // "mp4v", "MJPG"
};
inline Container container_for(const std::string& input_ext_lower, bool live) {
  if (!live && (input_ext_lower == ".mp4" || input_ext_lower == ".m4v" || input_ext_lower == ".mov" ||
                input_ext_lower == ".mkv"))
    return {input_ext_lower, {'m', 'p', '4', 'v', 0}};
  return {".avi", {'M', 'J', 'P', 'G', 0}};
}
inline Container fallback_container() { return {".avi", {'M', 'J', 'P', 'G', 0}}; }

}  // namespace lightseg::cli
