// Runs the built `lightseg` binary for end-to-end tests: exit code, stdout and stderr.
#pragma once

#include <sys/wait.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "test_paths.h"

namespace lightseg::fixtures {

struct CliResult {
  int code = -1;
  std::string out, err;
};

inline std::string shell_quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

// `dir` receives the captured streams; a run over 2 minutes is killed (exit code 124;
// LIGHTSEG_TEST_CLI_TIMEOUT=SECONDS changes the limit, for an emulated CPU: scripts/cross_arm64.sh).
// One intra-op thread (OMP_NUM_THREADS=1, unless --threads says otherwise): tests use tiny images
// and ctest runs several at once.
inline CliResult run_cli(const std::vector<std::string>& args, const std::filesystem::path& dir) {
  const char* limit = std::getenv("LIGHTSEG_TEST_CLI_TIMEOUT");
  const std::string seconds = limit && std::strspn(limit, "0123456789") == std::strlen(limit) && *limit ? limit : "120";
  std::string cmd = "OMP_NUM_THREADS=1 timeout -k 5 " + seconds + " " + shell_quote(LIGHTSEG_CLI);
  for (const auto& a : args) cmd += " " + shell_quote(a);
  const auto out = dir / "cli_stdout.txt", err = dir / "cli_stderr.txt";
  cmd += " >" + shell_quote(out.string()) + " 2>" + shell_quote(err.string()) + " </dev/null";
  const int status = std::system(cmd.c_str());
  CliResult r;
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  auto slurp = [](const std::filesystem::path& p) {
    std::ifstream f(p);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
  };
  r.out = slurp(out);
  r.err = slurp(err);
  return r;
}

}  // namespace lightseg::fixtures
