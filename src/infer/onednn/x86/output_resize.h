// x86 (AVX-512): the labels' vector argmax and the packed logits of the output resize.
// Part of the onednn plans (plan_impl.h includes it, once per channel-block width): not a
// standalone header; it sees what the files before it in plan_impl.h define.

// One block of classes (K ≤ 16) with AVX-512: the argmax of a pixel as a vector max, a compare
// and the lowest set bit (the first maximum, as the scalar loop and torch::argmax).
__attribute__((target("avx512f"))) void label_row_avx512(const OutputResize& r, int64_t* out, int64_t n, int64_t y) {
  const int64_t K = r.src.C, sw = r.src.W;
  const float wy1 = r.th.w1[y], wy0 = 1.f - wy1;
  int64_t* o = out + (n * r.H + y) * r.W;
  const float* base = r.src.block(n, 0);
  const float* row0 = base + r.th.i0[y] * sw * kBlock;
  const float* row1 = base + r.th.i1[y] * sw * kBlock;
  const __mmask16 valid = static_cast<__mmask16>(K >= kBlock ? 0xffffu : (1u << K) - 1);
  const __m512 low = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  for (int64_t x = 0; x < r.W; ++x) {
    const vb v = interpolate(r, row0, row1, wy0, wy1, x);
    const __m512 z = _mm512_mask_blend_ps(valid, low, reinterpret_cast<const __m512&>(v));
    // the maximum in every lane (lanes_max: halving shuffles; GCC 12's intrinsics for this, which
    // use an "undefined" register, draw -Wmaybe-uninitialized)
    const vb m = lanes_max(reinterpret_cast<const vb&>(z));
    const __mmask16 at = _mm512_mask_cmp_ps_mask(valid, z, reinterpret_cast<const __m512&>(m), _CMP_EQ_OQ);
    o[x] = at ? __builtin_ctz(at) : 0;
  }
}

// 8 ≤ K < 16 classes with AVX-512: 16 pixels (16·K floats) are packed in registers into K whole
// vectors (vector k takes lanes of pixels p0[k] .. p0[k] + 2: two permutes) and streamed out
// with aligned non-temporal 64-byte stores, where the row starts 64-byte aligned; other pixels
// get a masked store of their K channels. Against one 64-byte store per pixel overlapping the
// next: up4 0.60 -> 0.50 ms (360x480, median of 5 alternated; aligned ordinary stores 0.70).
struct OutputPack {
  int64_t K = 0;
  int p0[kBlock];
  alignas(64) int32_t idx1[kBlock][kBlock], idx2[kBlock][kBlock];
  uint16_t mask2[kBlock];
};
OutputPack output_pack(int64_t K) {
  OutputPack q;
  q.K = K;
  for (int64_t k = 0; k < K; ++k) {
    q.p0[k] = static_cast<int>(16 * k / K);
    q.mask2[k] = 0;
    for (int l = 0; l < kBlock; ++l) {
      const int64_t f = 16 * k + l, px = f / K - q.p0[k], c = f % K;
      q.idx1[k][l] = static_cast<int32_t>(px == 0 ? c : 16 + c);
      q.idx2[k][l] = static_cast<int32_t>(c);
      if (px == 2) q.mask2[k] |= static_cast<uint16_t>(1u << l);
    }
  }
  return q;
}

__attribute__((target("avx512f"))) void output_row_packed(const OutputResize& r, const OutputPack& q, float* out,
                                                          int64_t n, int64_t y) {
  const int64_t K = r.src.C, sw = r.src.W;
  const float wy1 = r.th.w1[y], wy0 = 1.f - wy1;
  float* o = out + (n * r.H + y) * r.W * K;
  const float* base = r.src.block(n, 0);
  const float* row0 = base + r.th.i0[y] * sw * kBlock;
  const float* row1 = base + r.th.i1[y] * sw * kBlock;
  int64_t x = 0;
  if (reinterpret_cast<uintptr_t>(o) % 64 == 0)
    for (; x + 16 <= r.W; x += 16) {
      __m512 px[kBlock + 2];
      for (int j = 0; j < kBlock; ++j) {
        const vb v = interpolate(r, row0, row1, wy0, wy1, x + j);
        px[j] = reinterpret_cast<const __m512&>(v);
      }
      px[16] = px[17] = _mm512_setzero_ps();
      float* d = o + x * K;
      for (int64_t k = 0; k < K; ++k) {
        const int a = q.p0[k];
        __m512 v = _mm512_permutex2var_ps(px[a], _mm512_load_si512(q.idx1[k]), px[a + 1]);
        v = _mm512_mask_permutexvar_ps(v, q.mask2[k], _mm512_load_si512(q.idx2[k]), px[a + 2]);
        _mm512_stream_ps(d + k * kBlock, v);
      }
    }
  const __mmask16 m = static_cast<__mmask16>((1u << K) - 1);
  for (; x < r.W; ++x) {
    const vb v = interpolate(r, row0, row1, wy0, wy1, x);
    _mm512_mask_storeu_ps(o + x * K, m, reinterpret_cast<const __m512&>(v));
  }
  _mm_sfence();  // the streamed stores are weakly ordered
}
