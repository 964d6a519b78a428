// The CLI's OpenMP wait policy (lightseg/runtime.h: set_thread_wait_defaults) and
// `bench --contention`: what a user on a shared robot CPU gets without setting anything.
#include <gtest/gtest.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "cli_run.h"
#include "lightseg/runtime.h"

namespace {

namespace fs = std::filesystem;
using lightseg::fixtures::run_cli;

// Sets (or unsets) environment variables for one scope; the CLI inherits them.
class ScopedEnv {
 public:
  explicit ScopedEnv(const std::map<std::string, std::optional<std::string>>& vars) {
    for (const auto& [k, v] : vars) {
      const char* old = std::getenv(k.c_str());
      saved_[k] = old ? std::optional<std::string>(old) : std::nullopt;
      if (v) setenv(k.c_str(), v->c_str(), 1);
      else unsetenv(k.c_str());
    }
  }
  ~ScopedEnv() {
    for (const auto& [k, v] : saved_) {
      if (v) setenv(k.c_str(), v->c_str(), 1);
      else unsetenv(k.c_str());
    }
  }

 private:
  std::map<std::string, std::optional<std::string>> saved_;
};

const std::map<std::string, std::optional<std::string>> kNoWaitVars = {
    {"OMP_WAIT_POLICY", std::nullopt}, {"GOMP_SPINCOUNT", std::nullopt}, {"KMP_BLOCKTIME", std::nullopt},
    {"LIGHTSEG_SPIN", std::nullopt},   {"LIGHTSEG_SET_SPINCOUNT", std::nullopt}};

fs::path temp_dir(const std::string& name) {
  auto d = fs::temp_directory_path() / ("lightseg_thread_wait_" + name + "_" + std::to_string(getpid()));
  fs::create_directories(d);
  return d;
}

const std::vector<std::string> kTinyBench = {"bench", "--size", "64x64", "--iters", "2", "--threads", "1"};

}  // namespace

TEST(ThreadWait, CliSpinsBrieflyWhenTheUserSetNothing) {
  auto dir = temp_dir("default");
  ScopedEnv env(kNoWaitVars);
  auto r = run_cli(kTinyBench, dir);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find(std::string("threads: GOMP_SPINCOUNT=") + lightseg::kDefaultSpinCount + " (lightseg's default"),
            std::string::npos)
      << r.out;
  fs::remove_all(dir);
}

// The `threads:` line of a tiny bench run with one wait variable set.
static std::string policy_line_with(const fs::path& dir, const std::string& var, const std::string& value) {
  auto vars = kNoWaitVars;
  vars[var] = value;
  ScopedEnv env(vars);
  auto r = run_cli(kTinyBench, dir);
  EXPECT_EQ(r.code, 0) << r.err;
  return r.out;
}

TEST(ThreadWait, TheUsersSettingWins) {
  auto dir = temp_dir("user");
  auto out = policy_line_with(dir, "GOMP_SPINCOUNT", "77");
  EXPECT_NE(out.find("threads: GOMP_SPINCOUNT=77 (set by you)"), std::string::npos) << out;
  out = policy_line_with(dir, "OMP_WAIT_POLICY", "passive");
  EXPECT_NE(out.find("threads: OMP_WAIT_POLICY=passive (set by you)"), std::string::npos) << out;
  out = policy_line_with(dir, "LIGHTSEG_SPIN", "default");
  EXPECT_NE(out.find("threads: OpenMP's default"), std::string::npos) << out;
  fs::remove_all(dir);
}

TEST(ThreadWait, ABadSpinCountIsAClearError) {
  auto dir = temp_dir("bad");
  auto vars = kNoWaitVars;
  vars["LIGHTSEG_SPIN"] = "fast";
  ScopedEnv env(vars);
  auto r = run_cli({"info"}, dir);
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.err.find("LIGHTSEG_SPIN must be a spin count"), std::string::npos) << r.err;
  fs::remove_all(dir);
}

namespace {
// Processes `lightseg --bench-busy-loop-child FD PID` whose PID no longer runs.
int orphaned_busy_processes() {
  int n = 0;
  for (const auto& e : fs::directory_iterator("/proc")) {
    std::ifstream f(e.path() / "cmdline", std::ios::binary);
    std::vector<std::string> argv;
    for (std::string a; std::getline(f, a, '\0');) argv.push_back(a);
    if (argv.size() == 4 && argv[1] == "--bench-busy-loop-child" && kill(std::atoi(argv[3].c_str()), 0) != 0) ++n;
  }
  return n;
}
}  // namespace

TEST(ThreadWait, BenchTimesUnderContentionAndLeavesNoBusyProcess) {
  auto dir = temp_dir("contention");
  ScopedEnv env(kNoWaitVars);
  // A command line no other test runs (under ctest -j2 the next test's bench, also with
  // --contention 2, may be running beside this one): 64x72, 3 iterations.
  const std::vector<std::string> args = {"bench",        "--size", "64x72", "--iters", "3", "--threads", "1",
                                         "--contention", "2",      "--json"};
  auto r = run_cli(args, dir);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("timed with 2 other busy processes"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("\"contention\": 2"), std::string::npos) << r.out;
  // The busy children (`lightseg --bench-busy-loop-child FD PID`, a fresh image each) were
  // reaped: none is left whose bench (PID) has ended. (Another test's bench may be running.)
  EXPECT_EQ(orphaned_busy_processes(), 0);
  fs::remove_all(dir);
}

// The busy processes stand for a robot's ordinary programs: nice 0 whatever lightseg's own
// priority, so `nice -n -10 lightseg bench --contention 2` measures a prioritised lightseg. Here
// lightseg runs at 3 above this process; only a privileged parent may set its children below its
// own nice value, so as root they are at 0, otherwise no higher than lightseg.
TEST(ThreadWait, BusyProcessesRunAtTheDefaultPriorityWhateverLightsegs) {
  auto dir = temp_dir("nice");
  ScopedEnv env(kNoWaitVars);
  errno = 0;
  const int base = getpriority(PRIO_PROCESS, 0);
  ASSERT_EQ(errno, 0);
  const int expected = std::min(19, base + 3);
  const std::string cmd = "OMP_NUM_THREADS=1 timeout -k 5 120 nice -n 3 " + lightseg::fixtures::shell_quote(LIGHTSEG_CLI) +
                          " bench --size 64x64 --iters 2 --threads 1 --contention 2 --json >" +
                          lightseg::fixtures::shell_quote((dir / "out.txt").string()) + " 2>&1 </dev/null";
  ASSERT_EQ(std::system(cmd.c_str()), 0);
  std::ifstream f(dir / "out.txt");
  std::string line, last;
  while (std::getline(f, line))
    if (!line.empty()) last = line;
  const auto j = nlohmann::json::parse(last);
  EXPECT_EQ(j.at("nice").get<int>(), expected) << last;
  const auto others = j.at("contention_nice").get<std::vector<int>>();
  ASSERT_EQ(others.size(), 2u) << last;
  for (int n : others) {
    if (geteuid() == 0) EXPECT_EQ(n, 0) << last;
    else EXPECT_LE(n, expected) << last;
  }
  fs::remove_all(dir);
}

// `bench --times FILE`: each timed call's milliseconds, one per line, in call order; a path
// that cannot be written is refused before anything is timed.
TEST(ThreadWait, BenchWritesEachCallsTime) {
  auto dir = temp_dir("times");
  ScopedEnv env(kNoWaitVars);
  auto args = kTinyBench;
  args.insert(args.end(), {"--times", (dir / "times.txt").string(), "--json"});
  auto r = run_cli(args, dir);
  ASSERT_EQ(r.code, 0) << r.err;
  std::ifstream f(dir / "times.txt");
  std::vector<double> ms;
  for (double v; f >> v;) ms.push_back(v);
  ASSERT_EQ(ms.size(), 2u);  // --iters 2
  const auto j = nlohmann::json::parse(r.out.substr(r.out.rfind("\n{") + 1));
  EXPECT_NEAR(*std::max_element(ms.begin(), ms.end()), j.at("p99_ms").get<double>(), 1e-3);
  EXPECT_NEAR(*std::min_element(ms.begin(), ms.end()), j.at("min_ms").get<double>(), 1e-3);
  args = kTinyBench;
  args.insert(args.end(), {"--times", (dir / "no-such-folder" / "times.txt").string()});
  r = run_cli(args, dir);
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.err.find("--times: cannot write"), std::string::npos) << r.err;
  EXPECT_EQ(r.out.find("latency:"), std::string::npos) << "timed although the file cannot be written";
  fs::remove_all(dir);
}

TEST(ThreadWait, BadContentionIsRefused) {
  auto dir = temp_dir("badcontention");
  auto args = kTinyBench;
  args.insert(args.end(), {"--contention", "-1"});
  auto r = run_cli(args, dir);
  EXPECT_NE(r.code, 0);
  fs::remove_all(dir);
}
