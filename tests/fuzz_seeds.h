// The files some tests write are also the fuzz targets' seeds (fuzz/corpus/TARGET): with
// LIGHTSEG_FUZZ_SEEDS=DIR each is saved to DIR/TARGET/NAME as well (fuzz/README.md).
#pragma once

#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

namespace lightseg::fixtures {

inline void save_fuzz_seed(const std::string& target, const std::string& name, const std::string& bytes) {
  const char* dir = std::getenv("LIGHTSEG_FUZZ_SEEDS");
  if (!dir || !*dir) return;
  std::string file;
  for (char c : name) file += std::isalnum(static_cast<unsigned char>(c)) || c == '.' ? c : '_';
  const auto folder = std::filesystem::path(dir) / target;
  std::filesystem::create_directories(folder);
  std::ofstream(folder / file, std::ios::binary) << bytes;
}

}  // namespace lightseg::fixtures
