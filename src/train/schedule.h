// What each epoch trains on, in which order, with which augmentation seed (internal; the
// learning-rate schedule poly_lr is public, in train.h).
//
// Determinism: the shuffle of epoch e is a function of (seed, e) and the augmentation of
// sample i in epoch e one of (seed, e, i), so a resumed run replays an uninterrupted one.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace lightseg {

// A 64-bit seed from three numbers (std::seed_seq over their halves).
uint64_t mix_seed(uint64_t a, uint64_t b, uint64_t c);

// The batches of `epoch` (0-based) for `rank` of `world`: one permutation of 0..n-1 shared by
// all ranks, each rank taking every world-th index; full batches only (BatchNorm wants them);
// at most max_iters (> 0) of them.
std::vector<std::vector<size_t>> epoch_batches(size_t n, int batch, uint64_t seed, int epoch, int rank, int world,
                                               int64_t max_iters);

// The augmentation seed of sample i in epoch `epoch` (0-based).
inline uint64_t sample_seed(uint64_t seed, int epoch, size_t i) {
  return mix_seed(seed, static_cast<uint64_t>(epoch) + 1, i);
}

}  // namespace lightseg
