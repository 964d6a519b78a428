// Reading and writing whole files: the one place every writer of lightseg goes through
// (weights and checkpoints, logs, curves, class weights, images, ONNX models, segment outputs).
#pragma once

#include <string>

namespace lightseg {

// The file's bytes. Throws std::runtime_error naming the path (a directory, a missing file).
std::string read_file(const std::string& path);

// Writes `bytes` to `path` atomically: a temporary PATH.tmp.PID in the same folder (created if
// needed), then rename, so a reader never sees half a file, even after a crash or kill -9.
// sync: fsync before the rename, so that the file also survives a power loss (checkpoints,
// weights); outputs that can be made again skip it. Throws std::runtime_error naming the path.
void write_file_atomic(const std::string& path, const std::string& bytes, bool sync = true);

}  // namespace lightseg
