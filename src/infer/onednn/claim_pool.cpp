// The claim pool (claim_pool.h): a step's pieces are claimed by whichever thread runs, and the
// step ends when they are done, not when every thread has checked in.
//
// One step at a time: the caller publishes (generation, piece count, next piece) in one 64-bit
// word and the step's fields, wakes the workers and claims pieces itself. A piece is claimed by
// a CAS on that word, so a worker that read an older generation's word fails its CAS and claims
// nothing; a worker whose CAS succeeds holds an unfinished piece of the current step, which
// therefore cannot have ended, so the fields it read are that step's. The count is in the word
// (not a field beside it) because a claim is judged by it: with the count of the next step and
// the word of the last, a worker could claim a piece past the last step's end while the new
// step's fields were being written, run it twice and count it twice, and done_ then passed the
// count and the caller waited forever (seen once in ~2,000 contended runs of 400 calls, issue 41).
// Workers spin a little, then sleep on a futex; the caller likewise waits for the last piece.
#include "infer/onednn/claim_pool.h"

#include <atomic>
#include <algorithm>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#if defined(__linux__)
#include <fcntl.h>
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>
#define LIGHTSEG_CLAIM_POOL 1
#else
#define LIGHTSEG_CLAIM_POOL 0
#endif

namespace lightseg::onednn {

namespace {

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

#if LIGHTSEG_CLAIM_POOL
void futex_wait(std::atomic<uint32_t>* word, uint32_t value) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT_PRIVATE, value, nullptr, nullptr, 0);
}
void futex_wake(std::atomic<uint32_t>* word, int n) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE_PRIVATE, n, nullptr, nullptr, 0);
}
#endif

// Rounds of cpu_relax (~40-70 cycles each) a thread waits before it sleeps: a few
// microseconds, about what the CLI's GOMP_SPINCOUNT=1000 gives OpenMP's threads.
// (Measured on a shared CPU, 2 threads: 300 rounds or fewer lost more to the wake-ups of
// sleeping threads than they saved; 20,000 or more cost a quiet CPU 15-40 %.)
constexpr int kSpin = 2000;

thread_local bool in_piece = false;

// Tests only (set_claim_pool_race_window): rounds of cpu_relax between a step's fields and its
// word, and between reading the word and judging a claim, where a claim could go wrong.
std::atomic<int> race_window{0};
inline void widen_race_window() {
  for (int r = race_window.load(std::memory_order_relaxed); r > 0; --r) cpu_relax();
}

class Pool {
 public:
  explicit Pool(int threads) : threads_(threads) {
    for (int i = 1; i < threads; ++i) workers_.emplace_back([this] { work(); });
  }
  ~Pool() {
    stop_.store(true);
    generation_.fetch_add(1);
#if LIGHTSEG_CLAIM_POOL
    futex_wake(&generation_, INT_MAX);
#endif
    for (auto& t : workers_) t.join();
  }
  int threads() const { return threads_; }

  void run(int64_t pieces, void (*piece)(void*, int64_t), void* ctx) {
    if (pieces < 1 || pieces > kMaxPieces) throw std::logic_error("claim pool: a step of " + std::to_string(pieces) + " pieces");
    piece_.store(piece, std::memory_order_relaxed);
    ctx_.store(ctx, std::memory_order_relaxed);
    widen_race_window();
    done_.store(0, std::memory_order_relaxed);
    const uint32_t g = generation_.load(std::memory_order_relaxed) + 1;
    next_.store(static_cast<uint64_t>(g) << 32 | static_cast<uint64_t>(pieces) << 16, std::memory_order_release);
    generation_.store(g);  // seq_cst: ordered before the read of sleepers_ (a worker's mirror)
#if LIGHTSEG_CLAIM_POOL
    if (sleepers_.load() > 0) futex_wake(&generation_, INT_MAX);
#endif
    claim();
    const auto all = static_cast<uint32_t>(pieces);
    for (int s = 0; done_.load(std::memory_order_acquire) != all;) {
      if (++s < kSpin) {
        cpu_relax();
        continue;
      }
#if LIGHTSEG_CLAIM_POOL
      caller_sleeps_.store(true);
      const uint32_t d = done_.load();
      if (d != all) futex_wait(&done_, d);
      caller_sleeps_.store(false);
#endif
    }
  }

  std::mutex lease;  // one caller's step at a time

 private:
  // Claims and runs pieces of the current step until none is left.
  void claim() {
    uint64_t w = next_.load(std::memory_order_acquire);
    for (;;) {
      widen_race_window();
      const uint32_t i = static_cast<uint32_t>(w & 0xffff), all = static_cast<uint32_t>((w >> 16) & 0xffff);
      auto* piece = piece_.load(std::memory_order_relaxed);
      void* ctx = ctx_.load(std::memory_order_relaxed);
      if (i >= all) return;
      if (!next_.compare_exchange_weak(w, w + 1, std::memory_order_acq_rel, std::memory_order_acquire)) continue;
      in_piece = true;
      piece(ctx, i);
      in_piece = false;
      if (done_.fetch_add(1, std::memory_order_acq_rel) + 1 == all && caller_sleeps_.load()) {
#if LIGHTSEG_CLAIM_POOL
        futex_wake(&done_, 1);
#endif
      }
      w = next_.load(std::memory_order_acquire);
    }
  }
  void work() {
    uint32_t seen = 0;
    while (!stop_.load()) {
      for (int s = 0; generation_.load(std::memory_order_acquire) == seen && s < kSpin; ++s) cpu_relax();
      if (generation_.load() == seen) {
#if LIGHTSEG_CLAIM_POOL
        sleepers_.fetch_add(1);
        if (generation_.load() == seen) futex_wait(&generation_, seen);
        sleepers_.fetch_sub(1);
#endif
        continue;
      }
      seen = generation_.load(std::memory_order_acquire);
      if (!stop_.load()) claim();
    }
  }

  const int threads_;
  std::atomic<uint64_t> next_{0};  // generation << 32 | pieces << 16 | next unclaimed piece
  std::atomic<uint32_t> generation_{0}, done_{0};
  std::atomic<int> sleepers_{0};
  std::atomic<bool> caller_sleeps_{false}, stop_{false};
  std::atomic<void (*)(void*, int64_t)> piece_{nullptr};
  std::atomic<void*> ctx_{nullptr};
  std::vector<std::thread> workers_;
};

// The process's pool, rebuilt when LibTorch's thread count changes (under `rebuild`).
std::mutex rebuild;
std::unique_ptr<Pool> the_pool;

}  // namespace

namespace {
std::atomic<int> chosen{-1};  // -1: LIGHTSEG_STEPS not read yet; else a StepScheduler
thread_local bool on_pool = false;
}

StepScheduler step_scheduler() {
  int c = chosen.load(std::memory_order_relaxed);
  if (c >= 0) return static_cast<StepScheduler>(c);
  const char* v = std::getenv("LIGHTSEG_STEPS");
  StepScheduler s = StepScheduler::Auto;
  if (!v || !*v || std::strcmp(v, "auto") == 0) s = LIGHTSEG_CLAIM_POOL ? StepScheduler::Auto : StepScheduler::OpenMP;
  else if (std::strcmp(v, "openmp") == 0) s = StepScheduler::OpenMP;
  else if (std::strcmp(v, "pool") != 0)
    throw std::invalid_argument(std::string("LIGHTSEG_STEPS must be auto, openmp or pool, not '") + v + "'");
  else if (!LIGHTSEG_CLAIM_POOL)
    throw std::invalid_argument("LIGHTSEG_STEPS=pool needs Linux's futexes; use openmp");
  else s = StepScheduler::Pool;
  chosen.store(static_cast<int>(s), std::memory_order_relaxed);
  return s;
}

const char* step_scheduler_name(StepScheduler s) {
  return s == StepScheduler::Pool ? "pool" : s == StepScheduler::Auto ? "auto" : "openmp";
}

void choose_step_scheduler(StepScheduler s) {
  if (s != StepScheduler::OpenMP && !LIGHTSEG_CLAIM_POOL) throw std::invalid_argument("the claim pool needs Linux's futexes");
  chosen.store(static_cast<int>(s), std::memory_order_relaxed);
}

bool steps_on_pool() { return on_pool || in_piece; }
PoolSteps::PoolSteps(bool on) : was_(on_pool) { on_pool = on && LIGHTSEG_CLAIM_POOL; }
PoolSteps::~PoolSteps() { on_pool = was_; }

namespace {
std::atomic<double> slow_factor{AutoSteps::kSlow}, quiet_factor{AutoSteps::kQuiet};
std::atomic<double> busy_share{AutoSteps::kBusyShare}, quiet_share{AutoSteps::kQuietShare};
}
void set_auto_steps_factors(double slow, double quiet, double busy, double calm) {
  slow_factor.store(slow);
  quiet_factor.store(quiet);
  busy_share.store(busy);
  quiet_share.store(calm);
}

void set_claim_pool_race_window(int rounds) { race_window.store(rounds, std::memory_order_relaxed); }

namespace {
std::atomic<bool> pool_plans_fail{false};
}
void set_pool_plans_fail_for_tests(bool fail) { pool_plans_fail.store(fail); }
bool pool_plans_fail_for_tests() { return pool_plans_fail.load(std::memory_order_relaxed); }

double thread_run_delay() {
#if defined(__linux__)
  // sum_exec_runtime, run_delay (ns), timeslices; all zero where the kernel keeps no sched info
  const int fd = open("/proc/thread-self/schedstat", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  char buf[128];
  const ssize_t n = read(fd, buf, sizeof buf - 1);
  close(fd);
  if (n <= 0) return -1;
  buf[n] = 0;
  unsigned long long ran = 0, waited = 0;
  if (std::sscanf(buf, "%llu %llu", &ran, &waited) != 2 || ran == 0) return -1;
  return static_cast<double>(waited) * 1e-9;
#else
  return -1;
#endif
}

bool AutoSteps::record(double seconds, double waited) {
  ++calls;
  if (on_pool) ++pool_calls;
  if (!on_pool && (best == 0 || seconds < best)) best = seconds;
  const bool known = waited >= 0;
  const bool other_side =
      on_pool ? seconds < quiet_factor.load(std::memory_order_relaxed) * best &&
                    (!known || waited < quiet_share.load(std::memory_order_relaxed) * seconds)
              : seconds > slow_factor.load(std::memory_order_relaxed) * best ||
                    (known && waited > busy_share.load(std::memory_order_relaxed) * seconds);
  run = other_side ? run + 1 : 0;
  if (run < (on_pool ? kQuietCalls : kSlowCalls)) return false;
  on_pool = !on_pool;
  run = 0;
  ++switches;
  return true;
}

ClaimPoolLease::ClaimPoolLease() {
  if (in_piece) return;  // within a piece: not ready, not busy (the caller runs it inline)
  const int threads = at::get_num_threads();
  if (threads <= 1) return;
  std::lock_guard<std::mutex> g(rebuild);
  if (!the_pool || the_pool->threads() != threads) {
    if (the_pool && !the_pool->lease.try_lock()) {  // in use by another caller: not rebuilt now
      busy_ = true;
      return;
    }
    if (the_pool) the_pool->lease.unlock();
    the_pool = std::make_unique<Pool>(threads);
  }
  if (!the_pool->lease.try_lock()) {
    busy_ = true;
    return;
  }
  held_ = true;
  threads_ = threads;
}

ClaimPoolLease::~ClaimPoolLease() {
  if (held_) the_pool->lease.unlock();
}

void ClaimPoolLease::run(int64_t pieces, void (*piece)(void*, int64_t), void* ctx) {
  if (!held_) throw std::logic_error("ClaimPoolLease::run without the pool");
  the_pool->run(pieces, piece, ctx);
}

}  // namespace lightseg::onednn
