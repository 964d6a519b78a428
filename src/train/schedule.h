// What each epoch trains on, in which order, with which augmentation seed, and the
// learning-rate schedule (internal).
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

// Poly LR with linear warm-up: step in [0, total).
double poly_lr(double base, int64_t step, int64_t total, int64_t warmup, double warmup_start, double power);

}  // namespace lightseg
