// The loops of gemv_int4.h: x quantised to 8 bits a group, and each group's integer sums of codes times inputs.

#include "gemv_int4.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "simd.h"

namespace aiayn_int4 {

namespace {

// Where input i of a row of `in` goes among its prepared bytes: each two chunks of 32 inputs (A, B) as A's 16 even
// inputs, B's, A's 16 odd ones, B's (the low nibbles of 32 bytes of codes, then the high ones); a last chunk alone as its
// even inputs, then its odd ones.
int64_t position(int64_t i, int64_t in) {
  const int64_t c = i / kChunk, j = i % kChunk, pair = c / 2, odd = j % 2;
  if (2 * pair + 1 < in / kChunk) return 2 * kChunk * pair + odd * kChunk + (c % 2) * (kChunk / 2) + j / 2;
  return 2 * kChunk * pair + odd * (kChunk / 2) + j / 2;
}

}  // namespace

// Each call prepares its rows of x on one thread, before the rows of codes are shared out: by 8-lane vectors where there
// is AVX2, 0.31 us a row of 768 inputs and 1.15 us one of 3072, where the scalar loop (kept for older CPUs) took 3.1 and
// 12.2 (one thread, Zen 4 EPYC, 2026-12-07, a throw-away harness timing both; the same codes and steps, bit for bit):
// about a quarter of a millisecond a token of int4 GPT-2 small, while the other thread waited.
#if defined(__AVX2__)
namespace {

// The largest |x_i| and the sum of x's n inputs (n a multiple of 8), 8 lanes at a time.
inline void largest_and_sum(const float* x, int64_t n, float& largest, float& sum) {
  const __m256 magnitude = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  __m256 top = _mm256_setzero_ps(), total = _mm256_setzero_ps();
  for (int64_t i = 0; i < n; i += 8) {
    const __m256 v = _mm256_loadu_ps(x + i);
    top = _mm256_max_ps(top, _mm256_and_ps(v, magnitude));  // a NaN input may or may not win: its sum is NaN either way
    total = _mm256_add_ps(total, v);
  }
  __m128 t = _mm_max_ps(_mm256_castps256_ps128(top), _mm256_extractf128_ps(top, 1));
  t = _mm_max_ps(t, _mm_movehl_ps(t, t));
  largest = _mm_cvtss_f32(_mm_max_ss(t, _mm_movehdup_ps(t)));
  sum = aiayn_simd::sum8(total);
}

// 8 inputs times `inverse`, rounded to the nearest integer (ties to even, as std::nearbyint) and clamped to
// [-127, 127] (a NaN's -2^31 to -127, as the scalar clamp gives it).
inline __m256i codes8(const float* x, __m256 inverse) {
  const __m256i v = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x), inverse));
  return _mm256_min_epi32(_mm256_max_epi32(v, _mm256_set1_epi32(-127)), _mm256_set1_epi32(127));
}

// A chunk's 32 inputs quantised, then its 16 even ones stored at `even` and its 16 odd ones at `odd` (position()).
inline void quantise_chunk(const float* x, __m256 inverse, int8_t* even, int8_t* odd) {
  const __m256i words = _mm256_packs_epi16(_mm256_packs_epi32(codes8(x, inverse), codes8(x + 8, inverse)),
                                           _mm256_packs_epi32(codes8(x + 16, inverse), codes8(x + 24, inverse)));
  // the packs interleave the 128-bit halves four bytes at a time: back to the inputs' order
  const __m256i bytes = _mm256_permutevar8x32_epi32(words, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
  // each half's even bytes, then its odd ones; then the halves' even quarters together, and their odd ones
  const __m256i split = _mm256_shuffle_epi8(bytes, _mm256_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15,
                                                                    0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15));
  const __m256i sorted = _mm256_permute4x64_epi64(split, 0xD8);  // quarters 0, 2, 1, 3
  _mm_storeu_si128(reinterpret_cast<__m128i*>(even), _mm256_castsi256_si128(sorted));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(odd), _mm256_extracti128_si256(sorted, 1));
}

}  // namespace
#endif

Inputs prepare(const float* x, int64_t m_rows, int64_t in, int64_t group) {
  const int64_t groups = in / group;
  Inputs p{m_rows, in, group, std::vector<int8_t>(m_rows * in), std::vector<float>(m_rows * groups), std::vector<float>(m_rows * groups)};
  for (int64_t m = 0; m < m_rows; ++m) {
    for (int64_t g = 0; g < groups; ++g) {
      const float* xg = x + m * in + g * group;
      float largest = 0.f, sum = 0.f;
#if defined(__AVX2__)
      largest_and_sum(xg, group, largest, sum);  // a group is 32, 64 or 128 inputs
#else
      for (int64_t i = 0; i < group; ++i) {
        largest = std::max(largest, std::fabs(xg[i]));
        sum += xg[i];
      }
#endif
      // an infinite or NaN input gives NaN outputs, as the sums of fp32 products would (0 * inf)
      const float step = std::isfinite(largest) ? largest / 127.f : std::numeric_limits<float>::quiet_NaN();
      p.dx[m * groups + g] = step;
      p.sums[m * groups + g] = sum;
      const float inverse = step > 0.f ? 1.f / step : 0.f;  // a product a weight, not a division (0: all zeros)
      int8_t* k = p.k.data() + m * in;
#if defined(__AVX2__)
      for (int64_t i = g * group; i < (g + 1) * group; i += kChunk) {
        quantise_chunk(x + m * in + i, _mm256_set1_ps(inverse), k + position(i, in), k + position(i + 1, in));
      }
#else
      for (int64_t i = g * group; i < (g + 1) * group; ++i) {
        const float v = std::min(127.f, std::max(-127.f, std::nearbyint(x[m * in + i] * inverse)));
        k[position(i, in)] = static_cast<int8_t>(v);
      }
#endif
    }
  }
  return p;
}

namespace {

// One row of codes with M prepared inputs (k `in` apart) into out[0..M). `scale`: the row's scales s_g and `least` its
// least values (bf16); `dx`: each input's steps dx_g and `sums` its group sums (`groups` apart). Each group's step
// s_g dx_g is one fp32 product, made in registers as the sums need it: written to memory a row at a time and read back,
// it stalled the loads reading it back (a throw-away timing of 768- and 3072-input rows on one thread, Zen 4 EPYC: about
// 25 ns a row besides its groups' work before, about 8 after; the benchmark's numbers are in gemv_int4.h). Two rows at a
// time, sharing each load of x, timed 1.1-1.3x slower the same way; not kept. Each sum is the same operations in the
// same order whatever M (a row of a batch gives what it gives alone).
template <int M, int64_t Group, bool Prefetch>
void dots(const uint8_t* __restrict codes, const at::BFloat16* __restrict scale, const float* __restrict dx,
          const at::BFloat16* __restrict least, const int8_t* __restrict k, const float* __restrict sums, int64_t in, int64_t ahead,
          float* out) {
  const int64_t groups = in / Group, chunks = in / kChunk;
#if defined(__AVX2__) && defined(__FMA__)
  // acc + the sums of four adjacent products of unsigned codes and signed inputs (one instruction with VNNI)
  auto dot4 = [](__m256i acc, __m256i codes4, const int8_t* x) {
    const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x));
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
    return _mm256_dpbusd_epi32(acc, codes4, xv);
#else
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(codes4, xv), _mm256_set1_epi16(1)));
#endif
  };
  auto dot4_half = [](__m128i acc, __m128i codes4, const int8_t* x) {
    const __m128i xv = _mm_loadu_si128(reinterpret_cast<const __m128i*>(x));
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
    return _mm_dpbusd_epi32(acc, codes4, xv);
#else
    return _mm_add_epi32(acc, _mm_madd_epi16(_mm_maddubs_epi16(codes4, xv), _mm_set1_epi16(1)));
#endif
  };
  const __m256i low = _mm256_set1_epi8(15);
  const __m256i first_second = _mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1);  // lanes 0-3: chunk A's step, 4-7: B's
  __m256 total[M][2];  // even and odd pairs apart: two chains of additions, not one
  float rest[M];  // the least values' part past the last 8 groups
  for (int m = 0; m < M; ++m) {  // the least values' part first: its additions wait on nothing of the codes'
    total[m][0] = total[m][1] = _mm256_setzero_ps();
    auto least8 = [&](int64_t i, __m256 t) {  // t + 8 least values (bf16, widened exactly) times their sums
      const __m128i bits = _mm_loadu_si128(reinterpret_cast<const __m128i*>(least + i));
      const __m256 lo = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(bits), 16));
      return _mm256_fmadd_ps(lo, _mm256_loadu_ps(sums + m * groups + i), t);
    };
    int64_t i = 0;
    for (; i + 16 <= groups; i += 16) {
      total[m][0] = least8(i, total[m][0]);
      total[m][1] = least8(i + 8, total[m][1]);
    }
    if (i + 8 <= groups) {
      total[m][0] = least8(i, total[m][0]);
      i += 8;
    }
    rest[m] = 0.f;
    for (; i < groups; ++i) rest[m] += static_cast<float>(least[i]) * sums[m * groups + i];
  }
  // chunks 2q and 2q + 1: 32 bytes of codes; lanes 0-3 of the sums are chunk 2q's, 4-7 chunk 2q + 1's
  auto pair_sums = [&](int64_t q, int half) {
    const uint8_t* p = codes + kChunk * q;
    if (Prefetch && q % 2 == 0) aiayn_simd::prefetch_l2(p + ahead, 64);
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    const __m256i even = _mm256_and_si256(v, low), odd = _mm256_and_si256(_mm256_srli_epi16(v, 4), low);
    __m128 scales2 = _mm_setzero_ps();  // groups of 32: the pair's two scales in lanes 0 and 1 (bf16, widened exactly)
    if constexpr (Group == kChunk) {
      int32_t bits;
      std::memcpy(&bits, scale + 2 * q, sizeof(bits));
      scales2 = _mm_castsi128_ps(_mm_slli_epi32(_mm_cvtepu16_epi32(_mm_cvtsi32_si128(bits)), 16));
    }
    for (int m = 0; m < M; ++m) {
      const int8_t* x = k + m * in + 2 * kChunk * q;
      const __m256i acc = dot4(dot4(_mm256_setzero_si256(), even, x), odd, x + kChunk);
      __m256 step;
      if constexpr (Group == kChunk) {  // two groups: their steps side by side
        const __m128 both = _mm_mul_ps(scales2, _mm_castsi128_ps(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(dx + m * groups + 2 * q))));
        step = _mm256_permutevar8x32_ps(_mm256_castps128_ps256(both), first_second);
      } else {  // one group
        const int64_t g = 2 * kChunk * q / Group;
        step = _mm256_set1_ps(static_cast<float>(scale[g]) * dx[m * groups + g]);
      }
      total[m][half] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc), step, total[m][half]);
    }
  };
  const int64_t pairs = chunks / 2;
  int64_t q = 0;
  for (; q + 2 <= pairs; q += 2) {
    pair_sums(q, 0);
    pair_sums(q + 1, 1);
  }
  if (q < pairs) pair_sums(q++, 0);
  if (chunks % 2) {  // a last chunk alone (groups of 32 only: larger groups hold an even number of chunks)
    const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(codes + kChunk * q));
    const __m128i low4 = _mm_set1_epi8(15);
    const __m128i even = _mm_and_si128(v, low4), odd = _mm_and_si128(_mm_srli_epi16(v, 4), low4);
    for (int m = 0; m < M; ++m) {
      const int8_t* x = k + m * in + 2 * kChunk * q;
      const __m128i acc = dot4_half(dot4_half(_mm_setzero_si128(), even, x), odd, x + kChunk / 2);
      const __m128 part = _mm_mul_ps(_mm_cvtepi32_ps(acc), _mm_set1_ps(static_cast<float>(scale[chunks - 1]) * dx[m * groups + chunks - 1]));
      total[m][1] = _mm256_add_ps(total[m][1], _mm256_insertf128_ps(_mm256_setzero_ps(), part, 0));
    }
  }
  for (int m = 0; m < M; ++m) {  // the lanes summed
    out[m] = aiayn_simd::sum8(_mm256_add_ps(total[m][0], total[m][1])) + rest[m];
  }
#else
  (void)ahead;
  (void)chunks;
  for (int m = 0; m < M; ++m) {
    float o = 0.f;
    for (int64_t g = 0; g < groups; ++g) {
      int32_t acc = 0;
      for (int64_t i = g * Group; i < (g + 1) * Group; ++i) acc += ((codes[i / 2] >> (4 * (i % 2))) & 15) * k[m * in + position(i, in)];
      o += static_cast<float>(acc) * (static_cast<float>(scale[g]) * dx[m * groups + g]) + static_cast<float>(least[g]) * sums[m * groups + g];
    }
    out[m] = o;
  }
#endif
}

// Inputs dotted with a row at once: 4 where there are 32 vector registers (AVX-512), 2 where 16.
#if defined(__AVX512F__)
constexpr int64_t kInputs = 4;
#else
constexpr int64_t kInputs = 2;
#endif

template <int64_t Group, bool Prefetch>
void rows_of(const uint8_t* codes, const at::BFloat16* scale_least, const Inputs& x, int64_t begin, int64_t end, int64_t ahead, float* d) {
  const int64_t in = x.in, groups = in / Group, row_bytes = in / 2;
  const int64_t rows_ahead = Prefetch ? (ahead + row_bytes - 1) / row_bytes : 0;
  for (int64_t o = begin; o < end; ++o) {
    const uint8_t* row = codes + o * row_bytes;
    const at::BFloat16* sl = scale_least + o * 2 * groups;
    if (Prefetch) aiayn_simd::prefetch_l2(sl + rows_ahead * 2 * groups, 4 * groups);
    for (int64_t m0 = 0; m0 < x.m_rows; m0 += kInputs) {
      const int64_t n = std::min(kInputs, x.m_rows - m0), a = m0 ? 0 : ahead;  // later inputs read the row from L1
      float* out = d + (o - begin) * x.m_rows + m0;
      const int8_t* k = x.k.data() + m0 * in;
      const float* sums = x.sums.data() + m0 * groups;
      const float* dx = x.dx.data() + m0 * groups;
      switch (n) {
#if defined(__AVX512F__)
        case 4: dots<4, Group, Prefetch>(row, sl, dx, sl + groups, k, sums, in, a, out); break;
        case 3: dots<3, Group, Prefetch>(row, sl, dx, sl + groups, k, sums, in, a, out); break;
#endif
        case 2: dots<2, Group, Prefetch>(row, sl, dx, sl + groups, k, sums, in, a, out); break;
        default: dots<1, Group, Prefetch>(row, sl, dx, sl + groups, k, sums, in, a, out); break;
      }
    }
  }
}

template <int64_t Group>
void rows_in(const uint8_t* codes, const at::BFloat16* scale_least, const Inputs& x, int64_t begin, int64_t end, int64_t ahead, float* d) {
  if (ahead) {
    rows_of<Group, true>(codes, scale_least, x, begin, end, ahead, d);
  } else {
    rows_of<Group, false>(codes, scale_least, x, begin, end, 0, d);
  }
}

}  // namespace

void rows(const uint8_t* codes, const at::BFloat16* scale_least, const Inputs& x, int64_t begin, int64_t end, int64_t ahead, float* d) {
  switch (x.group) {
    case 32: return rows_in<32>(codes, scale_least, x, begin, end, ahead, d);
    case 64: return rows_in<64>(codes, scale_least, x, begin, end, ahead, d);
    case 128: return rows_in<128>(codes, scale_least, x, begin, end, ahead, d);
    default: TORCH_CHECK(false, "aiayn_native::gemv: 4-bit codes in groups of 32, 64 or 128 inputs, got ", x.group);
  }
}

}  // namespace aiayn_int4
