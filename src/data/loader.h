// Multi-threaded batch loading with prefetch. Batches come out in order; worker threads
// build them with single-threaded torch ops (no oversubscription of the compute threads).
#pragma once

#include <condition_variable>
#include <exception>
#include <functional>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include <torch/torch.h>

namespace lightseg {

struct Batch {
  torch::Tensor images;  // N×3×H×W float (normalised)
  torch::Tensor labels;  // N×H×W int64 (255 = ignore)
  std::vector<size_t> indices;
};

class BatchLoader {
 public:
  using MakeBatch = std::function<Batch(const std::vector<size_t>& indices)>;
  // on_caller: no threads; next() makes each batch itself (batches that are a few
  // asynchronous device operations: the cached data set on a GPU).
  BatchLoader(MakeBatch make, std::vector<std::vector<size_t>> batches, int workers, int prefetch, bool on_caller = false);
  ~BatchLoader();
  BatchLoader(const BatchLoader&) = delete;
  BatchLoader& operator=(const BatchLoader&) = delete;
  // Next batch in order; false at the end. Rethrows a worker's exception.
  bool next(Batch& out);
  double wait_seconds() const { return wait_s_; }

 private:
  void work(size_t first);
  MakeBatch make_;
  std::vector<std::vector<size_t>> batches_;
  size_t workers_, prefetch_;
  bool on_caller_;
  size_t consumed_ = 0;
  bool stop_ = false;
  std::map<size_t, Batch> ready_;
  std::map<size_t, std::exception_ptr> errors_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::thread> threads_;
  double wait_s_ = 0;
};

}  // namespace lightseg
