// Concats whose parts do not start on a channel block (odd channel counts).
// Part of the onednn plans (plan_impl.h includes it, once per channel-block width): not a
// standalone header; it sees what the files before it in plan_impl.h define.

// A concat whose parts do not start on channel blocks (configurations with channel counts
// that are not multiples of the block): each pixel's channels gathered from the parts, the
// padding lanes of the last block zeroed (oneDNN's kernels read them).
struct ChannelConcat {
  std::vector<View> parts;  // f32, each in its own buffer
  View dst;                 // f32, the whole value
};

void run_channel_concat(const ChannelConcat& c) {
  const View& d = c.dst;
  const int64_t P = d.pixels(), blocks = round_up(d.C) / kBlock;
  parallel_steps(0, d.N * P, 256, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const int64_t n = i / P, p = i % P;
      int64_t off = 0;
      for (const View& s : c.parts) {
        for (int64_t ch = 0; ch < s.C; ++ch) {
          const int64_t o = off + ch;
          d.block(n, o / kBlock)[p * kBlock + o % kBlock] = s.block(n, ch / kBlock)[p * kBlock + ch % kBlock];
        }
        off += s.C;
      }
      for (int64_t o = off; o < blocks * kBlock; ++o) d.block(n, o / kBlock)[p * kBlock + o % kBlock] = 0.f;
    }
  });
}
