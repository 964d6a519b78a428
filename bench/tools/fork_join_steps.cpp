// How the length of a parallel step decides what a shared CPU costs (docs/guide/deployment.md,
// Threads). The same work, split over the OpenMP threads, as STEPS fork-join steps per call;
// 200 calls timed, median and p99, quiet and then with BUSY other processes spinning (nice 0).
// Not part of the build:
//
//   g++ -O2 -fopenmp bench/tools/fork_join_steps.cpp -o /tmp/fork_join_steps
//   OMP_NUM_THREADS=2 GOMP_SPINCOUNT=1000 /tmp/fork_join_steps 2 111   # [BUSY] [STEPS...]
//
// Variants, by environment:
//   MODE=pool     each step on a claim pool instead of an OpenMP region: the work is CHUNKS
//                 (default 16) pieces that whichever thread runs takes, and a step ends when its
//                 pieces are done, not when every thread has arrived (a late thread finds none)
//   SLICE_US=N    every worker thread asks the scheduler (EEVDF, Linux >= 6.12) for an N us slice
//                 (sched_setattr's sched_runtime for SCHED_OTHER: earlier deadlines, same share)
//   SETSID=1      the busy processes start their own session (another autogroup), as another
//                 program on the machine would be
// and OMP_PROC_BIND / OMP_PLACES as OpenMP reads them.
#include <linux/futex.h>
#include <omp.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

namespace {

volatile float sink;
constexpr long kWork = 8000000;  // iterations of a dependent multiply-add per call, ~14 ms on one core

long env_long(const char* name, long fallback) { return std::getenv(name) ? std::atol(std::getenv(name)) : fallback; }

void spin_work(long from, long to, float seed) {
  float x = seed;
  for (long i = from; i < to; ++i) x = x * 0.9999f + 1.0f;
  sink = x;
}

// SLICE_US: the calling thread's requested slice (struct sched_attr as the kernel reads it).
void request_slice() {
  const long us = env_long("SLICE_US", 0);
  if (us <= 0) return;
  struct {
    uint32_t size, policy;
    uint64_t flags;
    int32_t nice;
    uint32_t priority;
    uint64_t runtime, deadline, period;
    uint32_t util_min, util_max;
  } a{};
  a.size = sizeof a;
  a.runtime = static_cast<uint64_t>(us) * 1000;
  if (syscall(SYS_sched_setattr, 0, &a, 0) != 0) std::perror("sched_setattr (SLICE_US)");
}

long futex(std::atomic<uint32_t>* word, int op, uint32_t value) {
  return syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), op, value, nullptr, nullptr, 0);
}

// MODE=pool: the caller publishes a step and works on it; workers spin GOMP_SPINCOUNT-like rounds
// (1000), then sleep on a futex. Pieces are claimed with one fetch_add on (generation, next piece).
class ClaimPool {
 public:
  explicit ClaimPool(int threads) {
    for (int i = 1; i < threads; ++i) workers_.emplace_back([this] {
      request_slice();
      work();
    });
  }
  ~ClaimPool() {
    stop_ = true;
    generation_.fetch_add(1);
    futex(&generation_, FUTEX_WAKE_PRIVATE, INT32_MAX);
    for (auto& t : workers_) t.join();
  }
  void step(int pieces, long per_piece) {
    pieces_ = pieces;
    per_piece_ = per_piece;
    done_.store(0);
    const uint32_t g = generation_.load() + 1;
    next_.store(static_cast<uint64_t>(g) << 32);
    generation_.store(g);
    futex(&generation_, FUTEX_WAKE_PRIVATE, INT32_MAX);
    claim();
    for (int s = 0; done_.load() != static_cast<uint32_t>(pieces_);) {
      if (++s < kSpin) continue;
      caller_sleeps_.store(true);
      const uint32_t d = done_.load();
      if (d != static_cast<uint32_t>(pieces_)) futex(&done_, FUTEX_WAIT_PRIVATE, d);
      caller_sleeps_.store(false);
    }
  }

 private:
  static constexpr int kSpin = 1000;
  void claim() {
    for (;;) {
      const auto piece = static_cast<uint32_t>(next_.fetch_add(1));
      if (piece >= static_cast<uint32_t>(pieces_)) return;
      spin_work(0, per_piece_, static_cast<float>(piece));
      if (done_.fetch_add(1) + 1 == static_cast<uint32_t>(pieces_) && caller_sleeps_.load())
        futex(&done_, FUTEX_WAKE_PRIVATE, 1);
    }
  }
  void work() {
    uint32_t seen = 0;
    while (!stop_) {
      for (int s = 0; generation_.load() == seen && s < kSpin; ++s) {
      }
      if (generation_.load() == seen) {
        futex(&generation_, FUTEX_WAIT_PRIVATE, seen);
        continue;
      }
      seen = generation_.load();
      if (!stop_) claim();
    }
  }
  std::atomic<uint64_t> next_{0};
  std::atomic<uint32_t> generation_{0}, done_{0};
  std::atomic<bool> caller_sleeps_{false}, stop_{false};
  int pieces_ = 1;
  long per_piece_ = 0;
  std::vector<std::thread> workers_;
};

ClaimPool* pool = nullptr;

// One call: kWork iterations in `steps` parallel steps, each split evenly over the threads (or,
// MODE=pool, into CHUNKS pieces claimed by whichever thread runs).
void call(int steps) {
  static const long pieces = env_long("CHUNKS", 16);
  for (int s = 0; s < steps; ++s) {
    if (pool) {
      pool->step(static_cast<int>(pieces), kWork / steps / pieces);
      continue;
    }
#pragma omp parallel
    {
      const long t = omp_get_thread_num(), n = omp_get_num_threads(), per = kWork / steps;
      spin_work(per * t / n, per * (t + 1) / n, static_cast<float>(t));
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
#pragma omp parallel
  request_slice();
  const bool use_pool = std::getenv("MODE") && std::strcmp(std::getenv("MODE"), "pool") == 0;
  ClaimPool claim_pool(use_pool ? omp_get_max_threads() : 1);
  if (use_pool) pool = &claim_pool;
  std::printf("%d threads (%s), %d busy processes\n", omp_get_max_threads(), use_pool ? "claim pool" : "OpenMP", busy);
  for (int s : steps) measure(s, "quiet");
  std::vector<pid_t> pids;
  for (int i = 0; i < busy; ++i) {
    const pid_t pid = fork();
    if (pid == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (std::getenv("SETSID")) setsid();
      for (volatile unsigned long x = 0;; x = x + 1) {
      }
    }
    pids.push_back(pid);
  }
  for (int s : steps) measure(s, "contended");
  for (pid_t p : pids) kill(p, SIGKILL);
  for (pid_t p : pids) waitpid(p, nullptr, 0);
}
