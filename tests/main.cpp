#include <gtest/gtest.h>

#include <execinfo.h>
#include <cstdio>
#include <exception>
#include <signal.h>
#include <unistd.h>

#include "lightseg/runtime.h"

namespace {
// A crash (the Cuda.* tests ended in a bare segmentation fault on a GPU machine) prints where it
// happened before the process dies as it would have: the frames, for addr2line or c++filt.
void print_frames_and_die(int sig) {
  void* frames[64];
  const int n = backtrace(frames, 64);
  const char head[] = "\nlightseg_tests: fatal signal; the stack (most recent first):\n";
  (void)!write(STDERR_FILENO, head, sizeof head - 1);
  backtrace_symbols_fd(frames, n, STDERR_FILENO);
  signal(sig, SIG_DFL);
  raise(sig);
}
}  // namespace

int main(int argc, char** argv) {
  // The CLI's wait policy (lightseg/runtime.h), the same way: GNU OpenMP read its variables when
  // it was loaded, so a fresh image of this program runs with them. Without it, two test
  // processes side by side (ctest -j2 on two cores) spin against each other: one training test
  // took 89 s beside the others instead of 7 s alone. Under an emulator, set GOMP_SPINCOUNT
  // (tests/avx2_emulated.sh does): the new image would run natively.
  try {
    lightseg::reexec_with_thread_wait_defaults(argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "lightseg_tests: %s\n", e.what());
    return 2;
  }
  for (int sig : {SIGSEGV, SIGBUS, SIGFPE, SIGILL}) signal(sig, print_frames_and_die);
  lightseg::init_runtime();
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
