// A dense convolution cut by output channel blocks, for the claim pool (claim_pool.h,
// pool plans, batch 1): each slice is a oneDNN primitive made for one thread (its
// kernel runs on whichever thread claims the slice, with no OpenMP region and no barrier), and
// its pass runs on the same blocks right after, while they are in cache. The convolution and
// its pass are one step, and every step of the plan is on the same threads: on the claim pool
// a step ends when its pieces are done, so a thread another process holds is not waited for.
// Part of the onednn plans (plan_impl.h includes it, once per channel-block width): not a
// standalone header; it sees what the files before it in plan_impl.h define.

struct SlicedConv {
  struct Slice {
    dnnl::convolution_forward prim;
    std::unordered_map<int, dnnl::memory> args;  // src, weights, bias, dst, scratchpad
    int64_t g0 = 0, g1 = 0;                      // its output channel blocks
  };
  std::vector<Slice> slices;
  std::vector<torch::Tensor> storage;  // the slices' weights, biases and scratchpads
  const Epilogue* pass = nullptr;      // or none: the convolution writes the value
  dnnl::engine eng;
};

// This thread's stream of `eng` (a stream is not to be shared by threads running at once).
dnnl::stream& thread_stream(const dnnl::engine& eng) {
  static thread_local std::vector<std::pair<dnnl_engine_t, dnnl::stream>> streams;
  for (auto& [e, s] : streams)
    if (e == eng.get()) return s;
  streams.emplace_back(eng.get(), dnnl::stream(eng));
  return streams.back().second;
}

void run_sliced_conv(const SlicedConv& c) {
  parallel_steps(0, static_cast<int64_t>(c.slices.size()), 1, [&](int64_t b, int64_t e) {
    dnnl::stream& st = thread_stream(c.eng);
    for (int64_t i = b; i < e; ++i) {
      const auto& s = c.slices[static_cast<size_t>(i)];
      s.prim.execute(st, s.args);
      st.wait();
      if (c.pass) run_epilogue_blocks(*c.pass, 0, s.g0, s.g1);
    }
  });
}
