// Shared by the fuzz targets (fuzz/README.md): one-time set-up and invariant checks.
#pragma once

#include <cstdio>
#include <cstdlib>

#include <torch/torch.h>

namespace lightseg::fuzz {

// Decoded images are bounded, as `serve` bounds them (--max-pixels), so that one input cannot
// spend the run allocating; the 413 path is fuzzed instead.
constexpr int64_t kMaxPixels = 1 << 16;

inline void once() {
  static const bool done = [] {
    torch::set_num_threads(1);  // a fuzzer is one process on one core
    return true;
  }();
  (void)done;
}

// A broken invariant is a finding: abort, so that libFuzzer saves the input.
inline void require(bool ok, const char* what) {
  if (ok) return;
  std::fprintf(stderr, "fuzz invariant broken: %s\n", what);
  std::abort();
}

}  // namespace lightseg::fuzz
