// The claim pool: how a plan's own steps (our kernels and passes, not oneDNN's convolutions)
// share their work among threads when the CPU is shared with other processes.
//
// An OpenMP region (at::parallel_for) splits a step evenly and ends at a barrier that every
// thread of the team must reach: when another process holds a core, the step waits for the
// thread that is not running, once per step (a plan has ~110). On the claim pool a step is cut
// into pieces that whichever thread runs claims, and the step is over when its pieces are done:
// a thread that comes late finds none and is not waited for. LIGHTSEG_STEPS=auto (the default)
// goes to it while a plan's calls run slow, =pool always, =openmp never;
// docs/guide/deployment.md (Threads) has the measurements. Independent of
// the channel-block width: compiled once (claim_pool.cpp), used by both widths' kernels.
#pragma once

#include <algorithm>
#include <cstdint>

#include <ATen/Parallel.h>

namespace lightseg::onednn {

// Tests only: widens the moments where a claim could race with the next step (rounds of a spin).
void set_claim_pool_race_window(int rounds);
// Tests only: every pool plan the engine builds from now on fails (auto keeps the plan it has).
void set_pool_plans_fail_for_tests(bool fail);
bool pool_plans_fail_for_tests();

// The most pieces one step of the pool has (its claim word holds the count in 16 bits).
constexpr int64_t kMaxPieces = 0xffff;

// The process's pool, for the thread count LibTorch has now (at::get_num_threads()), leased
// for one step: `ready()` when this thread holds it until the lease goes out of scope. Not
// ready when another thread is running a step on it (`busy()`), when called from one of its
// own pieces (it then runs inline), with one thread, or on a system without futexes.
class ClaimPoolLease {
 public:
  ClaimPoolLease();
  ~ClaimPoolLease();
  ClaimPoolLease(const ClaimPoolLease&) = delete;
  ClaimPoolLease& operator=(const ClaimPoolLease&) = delete;
  bool ready() const { return held_; }
  bool busy() const { return busy_; }
  int threads() const { return threads_; }
  // Runs piece(ctx, i) for every i in [0, pieces), on this thread and the pool's; returns when
  // all are done. Only when ready(); 1 <= pieces <= kMaxPieces.
  void run(int64_t pieces, void (*piece)(void*, int64_t), void* ctx);

 private:
  int threads_ = 1;
  bool held_ = false, busy_ = false;
};

// What runs a plan's own steps (LIGHTSEG_STEPS): OpenMP (at::parallel_for), the claim pool, or
// auto (the default): each plan runs on OpenMP while its calls keep near its best quiet call,
// and on the pool (with a pool plan of its own, built at a size's second call) while they run
// well over it (AutoSteps). An unknown value is an error (std::invalid_argument) the first
// time it is read.
enum class StepScheduler { OpenMP, Pool, Auto };
StepScheduler step_scheduler();
const char* step_scheduler_name(StepScheduler s);
// Chooses for the process, whatever LIGHTSEG_STEPS says (tests; a program's own setting).
void choose_step_scheduler(StepScheduler s);

// Whether the steps this thread runs now go to the claim pool: within a PoolSteps(true) scope
// (the engine's calls of a pool plan, and their building) or a piece of the pool.
bool steps_on_pool();
class PoolSteps {
 public:
  explicit PoolSteps(bool on);
  ~PoolSteps();
  PoolSteps(const PoolSteps&) = delete;
  PoolSteps& operator=(const PoolSteps&) = delete;

 private:
  bool was_;
};

// LIGHTSEG_STEPS=auto's choice for one plan, from the time of its calls and how long the
// calling thread waited for a CPU meanwhile (its run delay: runnable, not running). On OpenMP:
// `best` is the fastest call so far; after kSlowCalls calls in a row over kSlow x best, or
// that waited more than kBusyShare of their time (another process holds a core: OpenMP's
// barriers wait for it), the plan goes to the pool. The wait counts where no quiet call was
// ever seen to compare with: a process started on a busy CPU. On the pool: after kQuietCalls
// calls in a row under kQuiet x best that waited less than kQuietShare of their time (the CPU
// is ours again; the pool plan costs 4-9 % on a quiet CPU) it comes back. Calls on the pool
// never lower `best`. Where the kernel keeps no run delay, time alone decides.
struct AutoSteps {
  static constexpr double kSlow = 1.5, kQuiet = 1.3;             // the defaults of set_auto_steps_factors
  static constexpr double kBusyShare = 0.15, kQuietShare = 0.05;  // likewise
  static constexpr int kSlowCalls = 3, kQuietCalls = 8;
  bool on_pool = false;
  double best = 0;  // seconds; 0: no call yet
  int run = 0;      // calls in a row that point to the other side
  uint64_t calls = 0, pool_calls = 0, switches = 0;
  // The call just timed (on the pool when on_pool), and the seconds its thread waited for a
  // CPU (< 0: unknown); true when the next call changes side.
  bool record(double seconds, double waited = -1);
};
// Replaces kSlow, kQuiet, kBusyShare and kQuietShare for the process (tests: slow 0 sends every
// plan to the pool after kSlowCalls calls; quiet and calm 1e9 bring it back after kQuietCalls).
void set_auto_steps_factors(double slow = AutoSteps::kSlow, double quiet = AutoSteps::kQuiet,
                            double busy = AutoSteps::kBusyShare, double calm = AutoSteps::kQuietShare);
// Seconds this thread has waited for a CPU since it started (Linux's schedstat run delay);
// -1 where the kernel does not say.
double thread_run_delay();

// at::parallel_for's contract (f(b, e) on consecutive ranges of at least `grain`, each index
// once), on the claim pool when it is chosen and free: up to 8 pieces per thread.
template <class F>
void parallel_steps(int64_t begin, int64_t end, int64_t grain, const F& f) {
  if (end <= begin) return;
  if (!steps_on_pool()) {
    at::parallel_for(begin, end, grain, f);
    return;
  }
  ClaimPoolLease pool;
  const int64_t n = end - begin, g = std::max<int64_t>(grain, 1);
  int64_t pieces = std::min<int64_t>({std::max<int64_t>(n / g, 1), 8 * int64_t{pool.threads()}, kMaxPieces});
  if (pool.busy() && !at::in_parallel_region()) {  // another caller's step: OpenMP's threads
    at::parallel_for(begin, end, grain, f);
    return;
  }
  if (!pool.ready() || pieces <= 1) {  // one piece, one thread, or within a piece: here
    f(begin, end);
    return;
  }
  struct Range {
    const F* f;
    int64_t begin, end, chunk;
  } r{&f, begin, end, (n + pieces - 1) / pieces};
  pieces = (n + r.chunk - 1) / r.chunk;
  pool.run(
      pieces,
      [](void* c, int64_t i) {
        const auto& x = *static_cast<const Range*>(c);
        const int64_t b = x.begin + i * x.chunk;
        (*x.f)(b, std::min(x.end, b + x.chunk));
      },
      &r);
}

}  // namespace lightseg::onednn
