// x86 (AVX-512, AVX512-BF16): bf16 loads and the tile conversions to and from bf16.
// Part of the onednn plans (plan_impl.h includes it, once per channel-block width): not a
// standalone header; it sees what the files before it in plan_impl.h define.

inline __attribute__((always_inline)) vb in_load(const uint16_t* p) {
  vb r;
  asm("vpmovzxwd %1, %0\n\tvpslld $16, %0, %0" : "=v"(r) : "m"(*reinterpret_cast<const char(*)[32]>(p)));
  return r;
}

// np vectors of t → bf16 at d (16 per pixel). bf16 values exist only in bf16 plans, which
// need AVX512-BF16: one vcvtneps2bf16 per vector (round to nearest even, as store_bf16),
// instead of the seven instructions GCC makes of store_bf16.
__attribute__((target("avx512f,avx512bf16"), noinline)) void store_tile_bf16(uint16_t* d, const vb* t, int64_t np) {
  for (int64_t i = 0; i < np; ++i)
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(d + i * kBlock),
                        (__m256i)_mm512_cvtneps_pbh(reinterpret_cast<const __m512*>(t)[i]));
}
// t[i] = (or +=) the bf16 vector at s + 16·i, likewise (vpmovzxwd + vpslld).
__attribute__((target("avx512f"), noinline)) void load_tile_bf16(vb* t, const uint16_t* s, int64_t np, bool add) {
  for (int64_t i = 0; i < np; ++i) {
    const vb v = in_load(s + i * kBlock);
    t[i] = add ? t[i] + v : v;
  }
}
