#include "lightseg/runtime.h"

#include <malloc.h>

#include <cstdlib>
#include <string>
#include <thread>

#include <torch/torch.h>

#include "core/isa.h"

namespace lightseg {

int init_runtime(int threads) {
  apply_isa_cap_to_onednn();  // before oneDNN's first use (it reads its variable then)
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
