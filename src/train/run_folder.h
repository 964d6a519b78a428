// A run folder's exclusive lock and the clean-up of checkpoint writes a kill interrupted (internal).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace lightseg {

class SegDataset;
struct TrainOptions;

// RUN/.lock, flock()ed for as long as this object lives. The kernel drops the lock when the
// process ends, however it ends, so a killed trainer never leaves the folder locked; the file
// itself stays (removing it would let two trainers lock two different files of that name).
class RunFolderLock {
 public:
  // Throws std::runtime_error when another process (or another RunFolderLock of this one)
  // holds the folder, naming the folder and the holder's process as it wrote it.
  explicit RunFolderLock(const std::string& dir);
  ~RunFolderLock();
  RunFolderLock(const RunFolderLock&) = delete;
  RunFolderLock& operator=(const RunFolderLock&) = delete;
  // Empty when locked; else why the file system would not lock (then nothing is held).
  const std::string& unsupported() const { return unsupported_; }

 private:
  int fd_ = -1;
  std::string unsupported_;
};

struct StaleTemporaries {
  std::vector<std::string> removed;  // file names, in the folder
  uintmax_t bytes = 0;               // their size in all
  std::vector<std::string> kept;     // "NAME (process N is alive)"
};

// Removes DIR/NAME.tmp.PID for each NAME in `names`: the temporaries of write_file_atomic that
// a kill during the write left behind. Call it with the folder's lock held, so that no writer
// of these names can be at work; a PID that is a live process is still kept (a trainer
// without a lock, or the PID reused: either way the file can wait for the next run).
StaleTemporaries remove_stale_temporaries(const std::string& dir, const std::vector<std::string>& names);

// The class weights of the training set (class_weights_from_counts of its label histogram by
// o.class_weighting); the histogram is cached in RUN/class_weights.json under a key of the
// dataset kind, folder, split, size and held-out groups; `say` tells when it is computed (a
// pass over every label).
std::vector<float> cached_class_weights(const SegDataset& ds, const TrainOptions& o,
                                        const std::function<void(const std::string&)>& say);

}  // namespace lightseg
