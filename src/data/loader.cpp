#include "data/loader.h"

#include <omp.h>

#include <chrono>

namespace lightseg {

BatchLoader::BatchLoader(MakeBatch make, std::vector<std::vector<size_t>> batches, int workers, int prefetch, bool on_caller)
    : make_(std::move(make)),
      batches_(std::move(batches)),
      workers_(static_cast<size_t>(std::max(1, workers))),
      prefetch_(static_cast<size_t>(std::max(1, prefetch))),
      on_caller_(on_caller) {
  if (on_caller_) return;
  for (size_t w = 0; w < workers_; ++w) threads_.emplace_back([this, w] { work(w); });
}

BatchLoader::~BatchLoader() {
  {
    std::lock_guard<std::mutex> l(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  for (auto& t : threads_) t.join();
}

void BatchLoader::work(size_t first) {
  omp_set_num_threads(1);  // this thread's torch ops stay single-threaded
  torch::NoGradGuard ng;
  for (size_t b = first; b < batches_.size(); b += workers_) {
    {
      std::unique_lock<std::mutex> l(mu_);
      cv_.wait(l, [&] { return stop_ || b < consumed_ + prefetch_; });
      if (stop_) return;
    }
    Batch batch;
    std::exception_ptr err;
    try {
      batch = make_(batches_[b]);
      batch.indices = batches_[b];
    } catch (...) {
      err = std::current_exception();
    }
    {
      std::lock_guard<std::mutex> l(mu_);
      if (err) errors_[b] = err;
      else ready_[b] = std::move(batch);
    }
    cv_.notify_all();
    if (err) return;
  }
}

bool BatchLoader::next(Batch& out) {
  if (consumed_ >= batches_.size()) return false;
  auto t0 = std::chrono::steady_clock::now();
  if (on_caller_) {
    torch::NoGradGuard ng;
    out = make_(batches_[consumed_]);
    out.indices = batches_[consumed_];
    ++consumed_;
    wait_s_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return true;
  }
  std::unique_lock<std::mutex> l(mu_);
  const size_t b = consumed_;
  cv_.wait(l, [&] { return ready_.count(b) || errors_.count(b); });
  if (errors_.count(b)) std::rethrow_exception(errors_[b]);
  out = std::move(ready_[b]);
  ready_.erase(b);
  ++consumed_;
  l.unlock();
  cv_.notify_all();
  wait_s_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return true;
}

}  // namespace lightseg
