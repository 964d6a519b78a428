#include "lightseg/runtime.h"

#include <malloc.h>
#include <unistd.h>

#include <cstdlib>
#include <stdexcept>
#include <string>
#include <thread>

#include <torch/torch.h>

#include "core/isa.h"

namespace lightseg {

int init_runtime(int threads) {
  apply_isa_cap_to_onednn();  // before oneDNN's first use (it reads its variable then)
  mallopt(M_MMAP_THRESHOLD, 1 << 30);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
  int n = threads;
  if (n <= 0) {
    if (const char* env = std::getenv("OMP_NUM_THREADS")) n = std::atoi(env);
  }
  if (n <= 0) n = static_cast<int>(std::thread::hardware_concurrency());
  if (n <= 0) n = 1;
  torch::set_num_threads(n);
  return n;
}

namespace {
const char* env_or_null(const char* name) {
  const char* v = std::getenv(name);
  return v && *v ? v : nullptr;
}
// Marks the values lightseg put into the environment, so that `info` can tell them from the user's.
constexpr const char* kMarker = "LIGHTSEG_SET_SPINCOUNT";
}  // namespace

bool set_thread_wait_defaults() {
  if (env_or_null("OMP_WAIT_POLICY") || env_or_null("GOMP_SPINCOUNT") || env_or_null("KMP_BLOCKTIME")) return false;
  std::string spin = kDefaultSpinCount;
  if (const char* v = env_or_null("LIGHTSEG_SPIN")) {
    if (std::string(v) == "default") return false;
    spin = v;
    if (spin.find_first_not_of("0123456789") != std::string::npos || spin.size() > 12)
      throw std::invalid_argument("LIGHTSEG_SPIN must be a spin count (digits) or 'default', got '" + spin + "'");
  }
  setenv("GOMP_SPINCOUNT", spin.c_str(), 1);
  // LLVM OpenMP (libomp) blocks after KMP_BLOCKTIME ms (default 200): 1 ms is its short form.
  setenv("KMP_BLOCKTIME", spin == "0" ? "0" : "1", 1);
  setenv(kMarker, spin.c_str(), 1);
  return true;
}

void reexec_with_thread_wait_defaults(char** argv) {
  if (set_thread_wait_defaults()) execv("/proc/self/exe", argv);  // returns only on failure
}

std::string thread_wait_policy() {
  const char* mine = env_or_null(kMarker);
  const char* spin = env_or_null("GOMP_SPINCOUNT");
  if (const char* p = env_or_null("OMP_WAIT_POLICY")) return std::string("OMP_WAIT_POLICY=") + p + " (set by you)";
  if (spin && mine && std::string(spin) == mine)
    return std::string("GOMP_SPINCOUNT=") + spin + " (lightseg's default: a short spin, then waiting threads sleep)";
  if (spin) return std::string("GOMP_SPINCOUNT=") + spin + " (set by you)";
  if (const char* b = env_or_null("KMP_BLOCKTIME")) return std::string("KMP_BLOCKTIME=") + b + " (set by you)";
  return std::string("OpenMP's default (GNU: spins 300,000 rounds; slow when other processes share the cores: "
                     "set GOMP_SPINCOUNT=") + kDefaultSpinCount + ")";
}

}  // namespace lightseg
