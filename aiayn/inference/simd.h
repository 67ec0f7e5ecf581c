// The vector pieces the native kernels share (aiayn/inference/gemv.cpp, attend_one.cpp, gelu_tanh.cpp; built together
// by aiayn/inference/gemv.py with -march=native, so each uses this CPU's width): loads widened to fp32, a prefetch hint,
// the dot products of rows with a vector, a vectorised exp, a bf16 store rounded as torch rounds, and transposes of
// blocks in registers (transpose.cpp, attention_tiles.cpp).
#pragma once

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif

namespace aiayn_simd {

// Sixteen (AVX-512) or eight (AVX2) weights from w + k, widened to fp32: fp32 as they are, bf16 by a shift into the
// high half (exact), int8 by sign extension and conversion (exact; the row's scale is applied to the sum).
#if defined(__AVX512F__)
inline __m512 load16(const float* w) { return _mm512_loadu_ps(w); }
inline __m512 load16(const at::BFloat16* w) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w))), 16));
}
inline __m512 load16(const int8_t* w) { return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w)))); }
#elif defined(__AVX2__) && defined(__FMA__)
inline __m256 load8(const float* w) { return _mm256_loadu_ps(w); }
inline __m256 load8(const at::BFloat16* w) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w))), 16));
}
inline __m256 load8(const int8_t* w) { return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(w)))); }
#endif

#if defined(__AVX2__)
// The 8 x 8 32-bit elements of r[0..7] transposed in place (r[i] becomes column i).
inline void transpose8x8(__m256 r[8]) {
  __m256 t[8], u[8];
  for (int i = 0; i < 4; ++i) {
    t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  for (int h = 0; h < 2; ++h) {  // rows 0-3, then 4-7
    u[4 * h + 0] = _mm256_shuffle_ps(t[4 * h], t[4 * h + 2], 0x44);
    u[4 * h + 1] = _mm256_shuffle_ps(t[4 * h], t[4 * h + 2], 0xEE);
    u[4 * h + 2] = _mm256_shuffle_ps(t[4 * h + 1], t[4 * h + 3], 0x44);
    u[4 * h + 3] = _mm256_shuffle_ps(t[4 * h + 1], t[4 * h + 3], 0xEE);
  }
  for (int i = 0; i < 4; ++i) {
    r[i] = _mm256_permute2f128_ps(u[i], u[4 + i], 0x20);
    r[4 + i] = _mm256_permute2f128_ps(u[i], u[4 + i], 0x31);
  }
}

// 8 x 8 32-bit elements from x (row stride sx) to out (row stride so), transposed.
inline void block32(const uint32_t* x, int64_t sx, uint32_t* out, int64_t so) {
  __m256 r[8];
  for (int i = 0; i < 8; ++i) r[i] = _mm256_loadu_ps(reinterpret_cast<const float*>(x + i * sx));
  transpose8x8(r);
  for (int i = 0; i < 8; ++i) _mm256_storeu_ps(reinterpret_cast<float*>(out + i * so), r[i]);
}

// 16 x 16 16-bit elements, transposed: rows 2k and 2k+1 interleaved into 32-bit pairs (columns 0-3 and 8-11 in one
// register, 4-7 and 12-15 in the other: unpacking works within 128-bit lanes), then two 8 x 8 32-bit transposes, whose
// rows are the output's rows, 16 elements each.
inline void block16(const uint16_t* x, int64_t sx, uint16_t* out, int64_t so) {
  __m256 lo[8], hi[8];
  for (int k = 0; k < 8; ++k) {
    const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + 2 * k * sx));
    const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + (2 * k + 1) * sx));
    lo[k] = _mm256_castsi256_ps(_mm256_unpacklo_epi16(a, b));
    hi[k] = _mm256_castsi256_ps(_mm256_unpackhi_epi16(a, b));
  }
  transpose8x8(lo);
  transpose8x8(hi);
  static constexpr int kLo[8] = {0, 1, 2, 3, 8, 9, 10, 11}, kHi[8] = {4, 5, 6, 7, 12, 13, 14, 15};
  for (int i = 0; i < 8; ++i) {
    _mm256_storeu_ps(reinterpret_cast<float*>(out + kLo[i] * so), lo[i]);
    _mm256_storeu_ps(reinterpret_cast<float*>(out + kHi[i] * so), hi[i]);
  }
}
#endif

// out = x^T for a rows x cols block of 2- or 4-byte elements (x's rows sx elements apart, out's so): the register blocks
// above (16 x 16 or 8 x 8) where there is AVX2, the elements off them one by one (everything, without AVX2).
template <typename T>
inline void transpose_block(const T* x, int64_t rows, int64_t cols, int64_t sx, T* out, int64_t so) {
  static_assert(sizeof(T) == 2 || sizeof(T) == 4, "2- or 4-byte elements");
  int64_t c = 0;
#if defined(__AVX2__)
  constexpr int64_t B = sizeof(T) == 2 ? 16 : 8;
  for (; c + B <= cols; c += B) {
    int64_t r = 0;
    for (; r + B <= rows; r += B) {
      if constexpr (B == 16) {
        block16(reinterpret_cast<const uint16_t*>(x + r * sx + c), sx, reinterpret_cast<uint16_t*>(out + c * so + r), so);
      } else {
        block32(reinterpret_cast<const uint32_t*>(x + r * sx + c), sx, reinterpret_cast<uint32_t*>(out + c * so + r), so);
      }
    }
    for (int64_t cc = c; cc < c + B; ++cc) {
      for (int64_t rr = r; rr < rows; ++rr) out[cc * so + rr] = x[rr * sx + cc];
    }
  }
#endif
  for (; c < cols; ++c) {
    for (int64_t r = 0; r < rows; ++r) out[c * so + r] = x[r * sx + c];
  }
}

// Ask for the cache lines of `bytes` bytes at p into L2 (a hint: no fault past the end of the weight).
inline void prefetch_l2(const void* p, int64_t bytes) {
  for (int64_t off = 0; off < bytes; off += 64) __builtin_prefetch(static_cast<const char*>(p) + off, 0, 2);
}

#if defined(__AVX2__)
// The sum of a vector's 8 lanes in a fixed order: lane i + lane i+4, then i + i+2, then i + i+1.
inline float sum8(__m256 a) {
  __m128 h = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  h = _mm_add_ps(h, _mm_movehl_ps(h, h));
  return _mm_cvtss_f32(_mm_add_ss(h, _mm_movehdup_ps(h)));
}
#endif

#if defined(__AVX512F__)
// The lanes of the 16 elements from j that lie before n: a loop's last vector, loaded and stored masked.
inline __mmask16 tail_mask(int64_t j, int64_t n) { return j + 16 <= n ? 0xFFFF : static_cast<__mmask16>((1u << (n - j)) - 1); }
#endif

#if defined(__AVX512F__)
// The sum of a vector's 16 lanes in a fixed order: lane i + lane i+8, then i + i+4, then i + i+2, then i + i+1 (the
// order GCC's _mm512_reduce_add_ps takes, written out so that sums16() can follow it for 16 vectors at once).
inline float sum16(__m512 a) {
  const __m256 t3 = _mm256_add_ps(_mm512_castps512_ps256(a), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a), 1)));
  const __m128 t6 = _mm_add_ps(_mm256_castps256_ps128(t3), _mm256_extractf128_ps(t3, 1));
  const __m128 t8 = _mm_add_ps(t6, _mm_shuffle_ps(t6, t6, _MM_SHUFFLE(1, 0, 3, 2)));
  return _mm_cvtss_f32(_mm_add_ss(t8, _mm_movehdup_ps(t8)));
}

// sum16() of each of a[0..15], as one vector (lane r: the sum of a[r]): the same additions of the same pairs, each
// level done for all 16 at once by moving blocks of lanes side by side, instead of 16 horizontal sums one after another.
inline __m512 sums16(const __m512* a) {
  __m512 b[8], c[4], d[2];
  for (int r = 0; r < 8; ++r) {  // lanes i + i+8: b[r] holds a[r]'s 8 sums, then a[r + 8]'s
    b[r] = _mm512_add_ps(_mm512_shuffle_f32x4(a[r], a[r + 8], 0x44), _mm512_shuffle_f32x4(a[r], a[r + 8], 0xEE));
  }
  for (int r = 0; r < 4; ++r) {  // i + i+4: c[r]'s blocks of 4 are those of a[r], a[r + 8], a[r + 4], a[r + 12]
    c[r] = _mm512_add_ps(_mm512_shuffle_f32x4(b[r], b[r + 4], 0x88), _mm512_shuffle_f32x4(b[r], b[r + 4], 0xDD));
  }
  for (int r = 0; r < 2; ++r) {  // i + i+2: in each block, two sums of c[r]'s vector, then two of c[r + 2]'s
    d[r] = _mm512_add_ps(_mm512_shuffle_ps(c[r], c[r + 2], _MM_SHUFFLE(1, 0, 1, 0)), _mm512_shuffle_ps(c[r], c[r + 2], _MM_SHUFFLE(3, 2, 3, 2)));
  }
  // i + i+1: block j holds the sums of a[0], a[2], a[1], a[3] plus (0, 8, 4, 12)[j]; put each in its own lane
  const __m512 e = _mm512_add_ps(_mm512_shuffle_ps(d[0], d[1], _MM_SHUFFLE(2, 0, 2, 0)), _mm512_shuffle_ps(d[0], d[1], _MM_SHUFFLE(3, 1, 3, 1)));
  return _mm512_permutexvar_ps(_mm512_setr_epi32(0, 2, 1, 3, 8, 10, 9, 11, 4, 6, 5, 7, 12, 14, 13, 15), e);
}
#endif

// The dot products of R weight rows (`n` apart from one another) with M input rows x (fp32, also `n` apart), into
// out[r * M + m], each in four independent partial sums (so the additions do not wait on one another); `ahead` > 0
// prefetches the weights that many bytes ahead. Each weight vector is loaded (and widened) once for the M inputs, each
// input vector once for the R rows; every sum is the same operations in the same order whatever R and M, so the same
// bits whichever rows a thread's block pairs and however many inputs a call carries (one row of a batch gives what it
// gives alone).
template <int R, int M = 1, typename W>
inline void dots(const W* __restrict w, const float* __restrict x, int64_t n, int64_t ahead, float* out) {
  int64_t k = 0;
#if defined(__AVX512F__)
  __m512 a[R][M][4];
  for (int r = 0; r < R; ++r) {
    for (int m = 0; m < M; ++m) a[r][m][0] = a[r][m][1] = a[r][m][2] = a[r][m][3] = _mm512_setzero_ps();
  }
  for (; k + 64 <= n; k += 64) {
    for (int r = 0; r < R && ahead; ++r) prefetch_l2(reinterpret_cast<const char*>(w + r * n + k) + ahead, 64 * sizeof(W));
    for (int j = 0; j < 4; ++j) {
      __m512 wj[R];
      for (int r = 0; r < R; ++r) wj[r] = load16(w + r * n + k + 16 * j);
      for (int m = 0; m < M; ++m) {
        const __m512 xj = _mm512_loadu_ps(x + m * n + k + 16 * j);
        for (int r = 0; r < R; ++r) a[r][m][j] = _mm512_fmadd_ps(wj[r], xj, a[r][m][j]);
      }
    }
  }
  for (; k + 16 <= n; k += 16) {
    for (int r = 0; r < R; ++r) {
      const __m512 wk = load16(w + r * n + k);
      for (int m = 0; m < M; ++m) a[r][m][0] = _mm512_fmadd_ps(wk, _mm512_loadu_ps(x + m * n + k), a[r][m][0]);
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int m = 0; m < M; ++m) {
      out[r * M + m] = sum16(_mm512_add_ps(_mm512_add_ps(a[r][m][0], a[r][m][1]), _mm512_add_ps(a[r][m][2], a[r][m][3])));
    }
  }
#elif defined(__AVX2__) && defined(__FMA__)
  __m256 a[R][M][4];
  for (int r = 0; r < R; ++r) {
    for (int m = 0; m < M; ++m) a[r][m][0] = a[r][m][1] = a[r][m][2] = a[r][m][3] = _mm256_setzero_ps();
  }
  for (; k + 32 <= n; k += 32) {
    for (int r = 0; r < R && ahead; ++r) prefetch_l2(reinterpret_cast<const char*>(w + r * n + k) + ahead, 32 * sizeof(W));
    for (int j = 0; j < 4; ++j) {
      __m256 wj[R];
      for (int r = 0; r < R; ++r) wj[r] = load8(w + r * n + k + 8 * j);
      for (int m = 0; m < M; ++m) {
        const __m256 xj = _mm256_loadu_ps(x + m * n + k + 8 * j);
        for (int r = 0; r < R; ++r) a[r][m][j] = _mm256_fmadd_ps(wj[r], xj, a[r][m][j]);
      }
    }
  }
  for (; k + 8 <= n; k += 8) {
    for (int r = 0; r < R; ++r) {
      const __m256 wk = load8(w + r * n + k);
      for (int m = 0; m < M; ++m) a[r][m][0] = _mm256_fmadd_ps(wk, _mm256_loadu_ps(x + m * n + k), a[r][m][0]);
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int m = 0; m < M; ++m) {
      out[r * M + m] = sum8(_mm256_add_ps(_mm256_add_ps(a[r][m][0], a[r][m][1]), _mm256_add_ps(a[r][m][2], a[r][m][3])));
    }
  }
#else
  for (int i = 0; i < R * M; ++i) out[i] = 0.f;
#endif
  for (int r = 0; r < R; ++r) {
    for (int m = 0; m < M; ++m) {
      for (int64_t i = k; i < n; ++i) out[r * M + m] += static_cast<float>(w[r * n + i]) * x[m * n + i];
    }
  }
}

#if defined(__AVX512F__)
// dots<1>() of 16 rows (`stride` apart) with one input x, for n a multiple of 16: each row's four partial sums made as
// dots() makes them, then the 16 lane sums at once (sums16()), so the same bits as 16 calls of dots<1>() at a fraction
// of their horizontal additions (attention's scores: a head of 32 spends as long summing a key's lanes as multiplying).
// It keeps its own copy of dots()'s AVX-512 loop: through one helper shared with dots(), 8 queries' attention took 1.3x
// the time (6 x 32 heads over 120 and 240 keys, Zen 4 EPYC, 2026-12-07). Outside AVX512-BF16's guard: a CPU with
// AVX-512 but without it (Skylake to Ice Lake) builds it too.
template <typename W>
inline void dots16(const W* __restrict w, int64_t stride, const float* __restrict x, int64_t n, float* out) {
  __m512 a[16];
  for (int r = 0; r < 16; ++r) {
    const W* row = w + r * stride;
    __m512 p[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
    int64_t k = 0;
    for (; k + 64 <= n; k += 64) {
      for (int j = 0; j < 4; ++j) p[j] = _mm512_fmadd_ps(load16(row + k + 16 * j), _mm512_loadu_ps(x + k + 16 * j), p[j]);
    }
    for (; k + 16 <= n; k += 16) p[0] = _mm512_fmadd_ps(load16(row + k), _mm512_loadu_ps(x + k), p[0]);
    a[r] = _mm512_add_ps(_mm512_add_ps(p[0], p[1]), _mm512_add_ps(p[2], p[3]));
  }
  _mm512_storeu_ps(out, sums16(a));
}
#endif

#if defined(__AVX512BF16__)
// The dot products of one bf16 weight row with M bf16 input rows (`n` apart), n a multiple of 32, into out[m]: the
// products of pairs summed in fp32 by AVX512-BF16's dot instruction (exact products, as dots() takes them after widening
// both; the additions in another order), in two partial sums, each weight vector loaded once for the M inputs, `ahead` >
// 0 prefetching the weights that many bytes ahead. Every input's sums are the same operations whatever M (a row of a
// batch gives what it gives alone). Beside dots() over the widened row, one instruction for two widenings and a
// multiply-add a vector: one GPT-2-small token's bf16 weight reads 1.04-1.16x as fast (the widening kernel beside this
// one in one process, five runs, Zen 4 EPYC, 2026-12-07; docs/benchmarks.md).
template <int M>
inline void dots_bf16(const at::BFloat16* __restrict w, const at::BFloat16* __restrict x, int64_t n, int64_t ahead, float* out) {
  __m512 a[M][2];
  for (int m = 0; m < M; ++m) a[m][0] = a[m][1] = _mm512_setzero_ps();
  int64_t k = 0;
  for (; k + 64 <= n; k += 64) {
    if (ahead) prefetch_l2(reinterpret_cast<const char*>(w + k) + ahead, 64 * sizeof(at::BFloat16));
    const __m512bh w0 = (__m512bh)_mm512_loadu_si512(w + k), w1 = (__m512bh)_mm512_loadu_si512(w + k + 32);
    for (int m = 0; m < M; ++m) {
      a[m][0] = _mm512_dpbf16_ps(a[m][0], w0, (__m512bh)_mm512_loadu_si512(x + m * n + k));
      a[m][1] = _mm512_dpbf16_ps(a[m][1], w1, (__m512bh)_mm512_loadu_si512(x + m * n + k + 32));
    }
  }
  if (k < n) {  // the last 32
    const __m512bh wk = (__m512bh)_mm512_loadu_si512(w + k);
    for (int m = 0; m < M; ++m) a[m][0] = _mm512_dpbf16_ps(a[m][0], wk, (__m512bh)_mm512_loadu_si512(x + m * n + k));
  }
  for (int m = 0; m < M; ++m) out[m] = sum16(_mm512_add_ps(a[m][0], a[m][1]));
}

#endif

#if defined(__AVX512F__)
// e^a in 16 lanes, a clamped to [-87, 88] (so -inf gives about 1e-38), as Cephes' expf: 2^k times a degree-6
// polynomial of the remainder, relative error about 1e-7.
inline __m512 exp16(__m512 a) {
  constexpr float log2e = 1.44269504088896341f, ln2_hi = 0.693359375f, ln2_lo = -2.12194440e-4f;
  constexpr float c[6] = {1.9875691500e-4f, 1.3981999507e-3f, 8.3334519073e-3f, 4.1665795894e-2f, 1.6666665459e-1f, 5.0000001201e-1f};
  a = _mm512_min_ps(_mm512_max_ps(a, _mm512_set1_ps(-87.f)), _mm512_set1_ps(88.f));
  const __m512 k = _mm512_roundscale_ps(_mm512_mul_ps(a, _mm512_set1_ps(log2e)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 r = _mm512_fnmadd_ps(k, _mm512_set1_ps(ln2_lo), _mm512_fnmadd_ps(k, _mm512_set1_ps(ln2_hi), a));
  __m512 p = _mm512_set1_ps(c[0]);
  for (int j = 1; j < 6; ++j) p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(c[j]));
  p = _mm512_fmadd_ps(_mm512_mul_ps(p, r), r, _mm512_add_ps(r, _mm512_set1_ps(1.f)));
  return _mm512_scalef_ps(p, k);
}

// 16 fp32 lanes stored at p: as they are, or rounded to the nearest bf16 (ties to even, NaN kept a NaN), as torch rounds.
inline void store16(float* p, __m512 v) { _mm512_storeu_ps(p, v); }
inline void store16(at::BFloat16* p, __m512 v) {
  const __m512i bits = _mm512_castps_si512(v);
  const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
  __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(bits, _mm512_add_epi32(odd, _mm512_set1_epi32(0x7FFF))), 16);
  rounded = _mm512_mask_mov_epi32(rounded, _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), _mm512_set1_epi32(0x7FC0));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtepi32_epi16(rounded));
}
#elif defined(__AVX2__) && defined(__FMA__)
// 8 fp32 lanes stored at p, the same way (AVX2).
inline void store8(float* p, __m256 v) { _mm256_storeu_ps(p, v); }
inline void store8(at::BFloat16* p, __m256 v) {
  const __m256i bits = _mm256_castps_si256(v);
  const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
  __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(bits, _mm256_add_epi32(odd, _mm256_set1_epi32(0x7FFF))), 16);
  rounded = _mm256_blendv_epi8(rounded, _mm256_set1_epi32(0x7FC0), _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q)));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm_packus_epi32(_mm256_castsi256_si128(rounded), _mm256_extracti128_si256(rounded, 1)));
}
#endif

}  // namespace aiayn_simd
