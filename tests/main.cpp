#include <gtest/gtest.h>

#include <execinfo.h>
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
  for (int sig : {SIGSEGV, SIGBUS, SIGFPE, SIGILL}) signal(sig, print_frames_and_die);
  lightseg::init_runtime();
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
