// The plan of one input shape: its members and its buffer pool. Building its steps from the
// analysis of the operation list (analysis.h: liveness, fusions, pairing, bf16 storage, int8
// convolutions): plan_build.h; running them: plan_run.h.
// Part of the onednn plans (plan_impl.h includes it, once per channel-block width): not a
// standalone header; it sees what the files before it in plan_impl.h define.

class Plan {
 public:
  // bf16: values in bf16 storage where the analysis allows, dense convolutions in bf16; int8:
  // dense convolutions in int8 (int8_conv.h) instead, on f.act_absmax's calibration. like: a
  // plan of the same network and shape whose measured layout choices this one takes (auto's
  // pool plan: the same arithmetic, so the same results, on either scheduler).
  Plan(const FusedNetwork& f, const dnnl::engine& eng, int64_t N, int64_t H, int64_t W, bool bf16, bool int8 = false,
       const Plan* like = nullptr);
  void set_profiling(bool on) { profile_ = on; }
  // The mean time of every step over the profiled calls ("" when none).
  std::string report() const;
  torch::Tensor run(const torch::Tensor& images, dnnl::stream& strm);
  // N×H×W int64 labels: every step but the output resize, then upsampling + argmax.
  torch::Tensor labels(const torch::Tensor& images, dnnl::stream& strm);

 private:
  friend class PlanBuilder;  // plan_build.h: builds the steps and the views
  using Step = std::function<void(dnnl::stream&)>;
  float* alloc(size_t floats);
  void release(float* p, size_t floats);

  const FusedNetwork& f_;
  const dnnl::engine& eng_;
  int64_t N_, H_, W_;
  std::vector<View> views_;
  std::vector<uint16_t*> shadow_;                      // per value: its bf16 copy (bf16 plans), or null
  std::vector<int8_t*> q8_;                            // per value: its int8 NHWC copy (int8 plans), or null
  std::vector<float> q8_scale_;                        // ... and that copy's scale
  std::vector<signed char> nhwc_;                      // per operation: its bf16 convolution in NHWC (1), not (0), -1 n/a
  const Plan* like_ = nullptr;                         // whose choices this plan takes (while it is built)
  std::vector<Step> steps_;
  std::vector<std::string> labels_;                    // what each step runs (op, kernel): for debuggers
  struct Buffer {
    std::unique_ptr<float, void (*)(void*)> data;
    size_t floats;
  };
  std::vector<Buffer> storage_;                        // every buffer, kept between calls
  std::multimap<size_t, float*> free_;                 // released buffers by size (in release order)
  std::vector<std::unique_ptr<Epilogue>> epilogues_;   // referenced by steps
  std::vector<torch::Tensor> params_;                  // padded per-channel arrays
  const float* input_ = nullptr;                       // set per call
  std::shared_ptr<OutputResize> output_resize_;        // the last step's (labels() runs it differently)
  bool profile_ = false;
  std::vector<double> step_seconds_;                   // profiling: time per step, summed
  int64_t profiled_runs_ = 0;
  float* output_ = nullptr;                            // set per call
};

// Reuses the smallest released buffer that is large enough (of those, the most recently
// released: the one most likely still in cache); else a new zeroed buffer in 2 MiB pages
// (transparent huge pages where the kernel offers them on request: fewer TLB misses).
float* Plan::alloc(size_t floats) {
  auto it = free_.lower_bound(floats);
  if (it != free_.end()) {
    auto last = free_.upper_bound(it->first);
    auto pick = std::prev(last);
    float* p = pick->second;
    free_.erase(pick);
    return p;
  }
  constexpr size_t kPage = size_t{2} << 20;
  const size_t bytes = (floats * sizeof(float) + kPage - 1) / kPage * kPage;
  void* p = std::aligned_alloc(kPage, bytes);
  if (!p) throw std::bad_alloc();
#ifdef MADV_HUGEPAGE
  madvise(p, bytes, MADV_HUGEPAGE);
#endif
  std::memset(p, 0, bytes);
  storage_.push_back({std::unique_ptr<float, void (*)(void*)>(static_cast<float*>(p), std::free), bytes / sizeof(float)});
  return static_cast<float*>(p);
}

void Plan::release(float* p, size_t floats) {
  for (const auto& b : storage_)
    if (b.data.get() == p) floats = b.floats;  // its capacity
  free_.emplace(floats, p);
}
