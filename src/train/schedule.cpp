#include "train/schedule.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

#include "lightseg/train.h"

namespace lightseg {

uint64_t mix_seed(uint64_t a, uint64_t b, uint64_t c) {
  std::seed_seq s{static_cast<uint32_t>(a), static_cast<uint32_t>(a >> 32), static_cast<uint32_t>(b),
                  static_cast<uint32_t>(b >> 32), static_cast<uint32_t>(c), static_cast<uint32_t>(c >> 32)};
  uint64_t out[1];
  s.generate(reinterpret_cast<uint32_t*>(out), reinterpret_cast<uint32_t*>(out) + 2);
  return out[0];
}

std::vector<std::vector<size_t>> epoch_batches(size_t n, int batch, uint64_t seed, int epoch, int rank, int world,
                                               int64_t max_iters) {
  std::vector<size_t> perm(n);
  std::iota(perm.begin(), perm.end(), 0);
  std::mt19937_64 rng(mix_seed(seed, static_cast<uint64_t>(epoch), 0x5EEDull));
  std::shuffle(perm.begin(), perm.end(), rng);
  std::vector<size_t> shard;
  for (size_t i = static_cast<size_t>(rank); i < n; i += static_cast<size_t>(world)) shard.push_back(perm[i]);
  std::vector<std::vector<size_t>> out;
  for (size_t i = 0; i + static_cast<size_t>(batch) <= shard.size(); i += static_cast<size_t>(batch))
    out.emplace_back(shard.begin() + i, shard.begin() + i + batch);
  if (max_iters > 0 && static_cast<int64_t>(out.size()) > max_iters) out.resize(static_cast<size_t>(max_iters));
  return out;
}

double poly_lr(double base, int64_t step, int64_t total, int64_t warmup, double warmup_start, double power) {
  if (warmup > 0 && step < warmup) {
    const double a = static_cast<double>(step) / static_cast<double>(warmup);
    return base * (warmup_start + (1.0 - warmup_start) * a);
  }
  const double frac = total > 0 ? std::min(1.0, static_cast<double>(step) / static_cast<double>(total)) : 0.0;
  return base * std::pow(1.0 - frac, power);
}

}  // namespace lightseg
