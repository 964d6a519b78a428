// The claim pool: how a plan's own steps (our kernels and passes, not oneDNN's convolutions)
// share their work among threads when the CPU is shared with other processes.
//
// An OpenMP region (at::parallel_for) splits a step evenly and ends at a barrier that every
// thread of the team must reach: when another process holds a core, the step waits for the
// thread that is not running, once per step (a plan has ~110). On the claim pool a step is cut
// into pieces that whichever thread runs claims, and the step is over when its pieces are done:
// a thread that comes late finds none and is not waited for. Chosen with LIGHTSEG_STEPS=pool
// (default: openmp); docs/guide/deployment.md (Threads) has the measurements. Independent of
// the channel-block width: compiled once (claim_pool.cpp), used by both widths' kernels.
#pragma once

#include <algorithm>
#include <cstdint>

#include <ATen/Parallel.h>

namespace lightseg::onednn {

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
  // all are done. Only when ready().
  void run(int64_t pieces, void (*piece)(void*, int64_t), void* ctx);

 private:
  int threads_ = 1;
  bool held_ = false, busy_ = false;
};

// Whether LIGHTSEG_STEPS chose the pool ("pool"; "openmp" or unset: at::parallel_for). An
// unknown value is an error (std::invalid_argument) the first time it is read.
bool claim_pool_chosen();
// Chooses for the process, whatever LIGHTSEG_STEPS says (tests; a program's own setting).
void choose_claim_pool(bool pool);

// at::parallel_for's contract (f(b, e) on consecutive ranges of at least `grain`, each index
// once), on the claim pool when it is chosen and free: up to 8 pieces per thread.
template <class F>
void parallel_steps(int64_t begin, int64_t end, int64_t grain, const F& f) {
  if (end <= begin) return;
  if (!claim_pool_chosen()) {
    at::parallel_for(begin, end, grain, f);
    return;
  }
  ClaimPoolLease pool;
  const int64_t n = end - begin, g = std::max<int64_t>(grain, 1);
  int64_t pieces = std::min<int64_t>(std::max<int64_t>(n / g, 1), 8 * int64_t{pool.threads()});
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
