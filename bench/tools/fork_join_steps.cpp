// How the length of a parallel step decides what a shared CPU costs (docs/guide/deployment.md,
// Threads). The same work, split over the OpenMP threads, as STEPS fork-join steps per call;
// 200 calls timed, median and p99, quiet and then with BUSY other processes spinning (nice 0).
// Not part of the build:
//
//   g++ -O2 -fopenmp bench/tools/fork_join_steps.cpp -o /tmp/fork_join_steps
//   OMP_NUM_THREADS=2 GOMP_SPINCOUNT=1000 /tmp/fork_join_steps 2 111   # [BUSY] [STEPS...]
#include <omp.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

namespace {

volatile float sink;
constexpr long kWork = 8000000;  // iterations of a dependent multiply-add per call, ~14 ms on one core

// One call: kWork iterations in `steps` parallel regions, each split evenly over the threads.
void call(int steps) {
  for (int s = 0; s < steps; ++s) {
#pragma omp parallel
    {
      const long t = omp_get_thread_num(), n = omp_get_num_threads(), per = kWork / steps;
      float x = static_cast<float>(t);
      for (long i = per * t / n; i < per * (t + 1) / n; ++i) x = x * 0.9999f + 1.0f;
      sink = x;
    }
  }
}

void measure(int steps, const char* label) {
  std::vector<double> ms;
  for (int c = 0; c < 210; ++c) {
    const auto t0 = std::chrono::steady_clock::now();
    call(steps);
    if (c >= 10) ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(ms.begin(), ms.end());
  std::printf("%-10s %4d steps of %.3f ms: median %6.2f ms, p99 %6.2f ms\n", label, steps, ms[ms.size() / 2] / steps,
              ms[ms.size() / 2], ms[ms.size() * 99 / 100]);
}

}  // namespace

int main(int argc, char** argv) {
  const int busy = argc > 1 ? std::atoi(argv[1]) : 2;
  std::vector<int> steps;
  for (int i = 2; i < argc; ++i) steps.push_back(std::atoi(argv[i]));
  if (steps.empty()) steps = {1, 10, 111, 300};
  std::printf("%d threads, %d busy processes\n", omp_get_max_threads(), busy);
  for (int s : steps) measure(s, "quiet");
  std::vector<pid_t> pids;
  for (int i = 0; i < busy; ++i) {
    const pid_t pid = fork();
    if (pid == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      for (volatile unsigned long x = 0;; x = x + 1) {
      }
    }
    pids.push_back(pid);
  }
  for (int s : steps) measure(s, "contended");
  for (pid_t p : pids) kill(p, SIGKILL);
  for (pid_t p : pids) waitpid(p, nullptr, 0);
}
