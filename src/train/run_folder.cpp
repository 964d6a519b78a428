// The run folder's lock and the removal of stale checkpoint temporaries (see run_folder.h).
#include "run_folder.h"

#include "lightseg/file_io.h"
#include "core/json_io.h"
#include "core/json_number.h"
#include "lightseg/dataset.h"
#include "lightseg/train.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <stdexcept>

namespace lightseg {

namespace fs = std::filesystem;

namespace {

std::string host_name() {
  char b[256] = {};
  return ::gethostname(b, sizeof b - 1) == 0 ? std::string(b) : std::string();
}

// "process N" (", on HOST" when another machine wrote it: the folder may be on a shared file
// system), from the line the holder wrote; empty when there is none yet.
std::string holder_of(const std::string& lock_path) {
  std::ifstream f(lock_path);
  long long pid = 0;
  std::string host;
  if (!(f >> pid) || pid <= 0) return "";
  f >> host;
  std::string r = "process " + std::to_string(pid);
  if (!host.empty() && host != host_name()) r += " on " + host;
  return r;
}

bool process_alive(long long pid) {
  if (pid <= 0 || pid != static_cast<pid_t>(pid)) return false;
  return ::kill(static_cast<pid_t>(pid), 0) == 0 || errno == EPERM;  // EPERM: alive, someone else's
}

}  // namespace

RunFolderLock::RunFolderLock(const std::string& dir) {
  const std::string path = (fs::path(dir) / ".lock").string();
  // O_CLOEXEC: a program the trainer runs must not inherit, and so extend, the lock.
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd_ < 0) throw std::runtime_error("cannot open '" + path + "': " + std::strerror(errno));
  while (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    const int e = errno;
    if (e == EINTR) continue;
    ::close(fd_);
    fd_ = -1;
    if (e == EWOULDBLOCK) {
      const std::string who = holder_of(path);
      throw std::runtime_error("run folder '" + dir + "' is in use by another training" +
                               (who.empty() ? std::string() : " (" + who + ")") +
                               ": wait for it to end, or choose another output folder");
    }
    if (e == ENOLCK || e == ENOSYS || e == EOPNOTSUPP) {  // a file system without locks: train unguarded, as before
      unsupported_ = std::strerror(e);
      return;
    }
    throw std::runtime_error("cannot lock '" + path + "': " + std::strerror(e));
  }
  // Who holds it, for the message of a second trainer. Written after taking the lock, so a
  // reader may for an instant still see the previous holder's line: good enough for a message.
  const std::string line = std::to_string(::getpid()) + " " + host_name() + "\n";
  const bool wrote = ::ftruncate(fd_, 0) == 0 && ::pwrite(fd_, line.data(), line.size(), 0) == static_cast<ssize_t>(line.size());
  (void)wrote;  // best effort: the lock holds without the line, only that message would lack the PID
}

RunFolderLock::~RunFolderLock() {
  if (fd_ >= 0) ::close(fd_);  // closing the last descriptor releases the lock
}

StaleTemporaries remove_stale_temporaries(const std::string& dir, const std::vector<std::string>& names) {
  StaleTemporaries r;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string file = it->path().filename().string();
    for (const auto& name : names) {
      const std::string prefix = name + ".tmp.";  // write_file_atomic's NAME.tmp.PID
      if (file.size() <= prefix.size() || file.compare(0, prefix.size(), prefix) != 0) continue;
      const std::string digits = file.substr(prefix.size());
      if (digits.size() > 18 || digits.find_first_not_of("0123456789") != std::string::npos) continue;
      const long long pid = std::stoll(digits);
      // Our own PID is a former process's (the lock keeps this one's writers out of the folder until now).
      if (pid != ::getpid() && process_alive(pid)) {
        r.kept.push_back(file + " (process " + digits + " is alive)");
        continue;
      }
      std::error_code e2;
      const uintmax_t size = fs::file_size(it->path(), e2);
      if (fs::remove(it->path(), e2)) {
        r.removed.push_back(file);
        if (size != static_cast<uintmax_t>(-1)) r.bytes += size;
      }
    }
  }
  return r;
}

std::vector<float> cached_class_weights(const SegDataset& ds, const TrainOptions& o,
                                        const std::function<void(const std::string&)>& say) {
  using nlohmann::json;
  fs::path cache = fs::path(o.out_dir) / "class_weights.json";
  // The pixel counts are cached; the weights follow from them by o.class_weighting.
  std::string key = ds.kind() + ":" + fs::weakly_canonical(o.data).string() + ":" + o.train_split + ":" +
                    std::to_string(ds.size());
  if (!o.val_groups.empty()) {
    key += ":pooled " + pool_splits(o.train_split, o.val_split) + " without";
    for (const auto& g : o.val_groups) key += " " + g;
    key += " by " + o.group_by;
  }
  std::vector<int64_t> counts;
  if (fs::exists(cache)) {
    try {
      auto j = read_json_file(cache.string());
      if (j.value("key", "") == key) counts = j.at("counts").get<std::vector<int64_t>>();
    } catch (...) {  // unreadable or stale: computed again below
      counts.clear();
    }
  }
  if (counts.size() != static_cast<size_t>(ds.num_classes())) {
    if (say) say("computing class weights from " + std::to_string(ds.size()) + " training labels");
    counts = ds.class_histogram();
  }
  auto w = class_weights_from_counts(counts, o.class_weighting);
  write_file_atomic(cache.string(),
                    json{{"key", key}, {"counts", counts}, {"method", o.class_weighting}, {"weights", w}}.dump(1));
  return w;
}

}  // namespace lightseg
