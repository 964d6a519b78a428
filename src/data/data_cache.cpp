#include "data/data_cache.h"

#include <omp.h>

#include <atomic>
#include <exception>
#include <mutex>
#include <stdexcept>
#include <thread>

#include "data/batch_augment.h"

namespace lightseg {

DataCache::DataCache(torch::Tensor images, torch::Tensor labels) : images_(std::move(images)), labels_(std::move(labels)) {
  if (images_.dim() != 4 || images_.size(1) != 3 || images_.scalar_type() != torch::kUInt8 || labels_.dim() != 3 ||
      labels_.scalar_type() != torch::kUInt8 || labels_.size(0) != images_.size(0) || labels_.size(1) != images_.size(2) ||
      labels_.size(2) != images_.size(3) || labels_.device() != images_.device())
    throw std::invalid_argument("DataCache: images must be N×3×H×W uint8 and labels N×H×W uint8 on the same device");
  images_ = images_.contiguous();
  labels_ = labels_.contiguous();
}

DataCache DataCache::build(const SegDataset& ds, torch::Device device, int threads) {
  const int64_t n = static_cast<int64_t>(ds.size());
  if (n == 0) throw std::runtime_error("data cache: the training split is empty");
  auto [img0, lab0] = ds.load(0);
  const int64_t H = img0.size(0), W = img0.size(1);
  auto images = torch::empty({n, 3, H, W}, torch::kUInt8);
  auto labels = torch::empty({n, H, W}, torch::kUInt8);
  images[0].copy_(img0.permute({2, 0, 1}));
  labels[0].copy_(lab0);
  std::atomic<int64_t> next{1};
  std::exception_ptr error;
  std::mutex mu;
  auto work = [&] {
    omp_set_num_threads(1);
    torch::NoGradGuard ng;
    for (int64_t i; (i = next++) < n;) {
      try {
        auto [img, lab] = ds.load(static_cast<size_t>(i));
        if (img.size(0) != H || img.size(1) != W)
          throw std::runtime_error("data cache: " + ds.sample(static_cast<size_t>(i)).image + " is " +
                                   std::to_string(img.size(1)) + "x" + std::to_string(img.size(0)) + ", not " +
                                   std::to_string(W) + "x" + std::to_string(H) + " as " + ds.sample(0).image +
                                   " (the cache needs one image size; --data-cache off)");
        images[i].copy_(img.permute({2, 0, 1}));
        labels[i].copy_(lab);
      } catch (...) {
        std::lock_guard<std::mutex> l(mu);
        if (!error) error = std::current_exception();
        next = n;
      }
    }
  };
  std::vector<std::thread> pool;
  for (int t = 0; t < std::max(1, threads); ++t) pool.emplace_back(work);
  for (auto& t : pool) t.join();
  if (error) std::rethrow_exception(error);
  return DataCache(images.to(device), labels.to(device));
}

std::pair<torch::Tensor, torch::Tensor> DataCache::batch(const std::vector<size_t>& samples,
                                                         const std::vector<AugmentDraw>& draws, const AugmentOptions& o,
                                                         const ModelMeta& meta) const {
  std::vector<int64_t> index(samples.begin(), samples.end());
  for (int64_t i : index)
    if (i < 0 || i >= size()) throw std::out_of_range("data cache: sample " + std::to_string(i) + " of " + std::to_string(size()));
  return augment_batch(images_, labels_, index, draws, o, meta);
}

}  // namespace lightseg
