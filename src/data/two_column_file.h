// Text files of two columns per line ("image label" list files, "image group" group files):
// blank lines and lines starting with '#' skipped, CRLF accepted, a short line an error that
// names the file, the line number and the expected columns.
#pragma once

#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>

namespace lightseg {

// Calls fn(first, second) for each line of `path`; `columns` names them for errors
// (e.g. "image label"); `cannot_open` is the whole message when the file cannot be read.
template <class Fn>
void for_each_two_column_line(const std::string& path, const std::string& columns, const std::string& cannot_open, Fn fn) {
  std::ifstream f(path);
  if (!f) throw std::runtime_error(cannot_open);
  std::string line;
  int n = 0;
  while (std::getline(f, line)) {
    ++n;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty() || line[0] == '#') continue;
    std::istringstream ss(line);
    std::string a, b;
    if (!(ss >> a >> b))
      throw std::runtime_error(path + ":" + std::to_string(n) + ": expected \"" + columns + "\", got '" + line + "'");
    fn(a, b);
  }
}

}  // namespace lightseg
