#include "lightseg/runtime.h"

#include <malloc.h>

#include <cstdlib>
#include <string>
#include <thread>

#include <torch/torch.h>

namespace lightseg {

int init_runtime(int threads) {
  mallopt(M_MMAP_THRESHOLD, 1 << 30);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
  int n = threads;
  if (n <= 0) {
    if (const char* env = std::getenv("OMP_NUM_THREADS")) n = std::atoi(env);
  }
  if (n <= 0) n = static_cast<int>(std::thread::hardware_concurrency());
  if (n <= 0) n = 1;
  torch::set_num_threads(n);
  return n;
}

}  // namespace lightseg
