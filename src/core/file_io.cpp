// See file_io.h.
#include "lightseg/file_io.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <stdexcept>

namespace lightseg {

std::string read_file(const std::string& path) {
  // (reading a directory would fail with a stream error that does not name it)
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) throw std::runtime_error("cannot read '" + path + "': is a directory");
  std::ifstream f(path, std::ios::binary);
  if (!f) throw std::runtime_error("cannot open '" + path + "'");
  return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

void write_file_atomic(const std::string& path, const std::string& bytes, bool sync) {
  std::filesystem::path p(path);
  if (p.has_parent_path() && !p.parent_path().empty()) std::filesystem::create_directories(p.parent_path());
  std::string tmp = path + ".tmp." + std::to_string(::getpid());
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) throw std::runtime_error("cannot write '" + tmp + "': " + std::strerror(errno));
  size_t done = 0;
  while (done < bytes.size()) {
    ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      int e = errno;
      ::close(fd);
      ::unlink(tmp.c_str());
      throw std::runtime_error("cannot write '" + tmp + "': " + std::strerror(e));
    }
    done += static_cast<size_t>(n);
  }
  if ((sync && ::fsync(fd) != 0) || ::close(fd) != 0) {
    ::unlink(tmp.c_str());
    throw std::runtime_error("cannot flush '" + tmp + "'");
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    int e = errno;
    ::unlink(tmp.c_str());
    throw std::runtime_error("cannot rename '" + tmp + "' to '" + path + "': " + std::strerror(e));
  }
}

}  // namespace lightseg
