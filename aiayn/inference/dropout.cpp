// Dropout for training on the CPU (aiayn/nn/dropout.py): y = x * keep / (1 - p), each element kept with probability
// 1 - p by the random bits of a counter-based generator, Philox4x32-10 (Salmon et al. 2011, "Parallel random numbers:
// as easy as 1, 2, 3"; the generator of cuRAND and of torch's CUDA dropout). An element's bits depend only on the seed
// and its index, so the mask needs no storing: the backward pass (grad * keep / (1 - p)) regenerates it from the seed,
// and the result is the same on any number of threads. torch's CPU dropout draws a Bernoulli tensor from its
// Mersenne twister, one thread, then multiplies and divides in two more passes: 6 ms a million elements on a Zen 4
// EPYC, 15% of the Multi30k speedrun's training step (2026-12-07, docs/benchmarks.md).

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <cstdint>

#include "simd.h"

namespace {

using namespace aiayn_simd;

constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;  // Philox4x32's multipliers
constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;  // and its key increments (the golden ratio, sqrt(3) - 1)
constexpr int64_t kLanes = 16;                         // counters generated at once (the loops vectorise over them)
constexpr int64_t kChunk = 4 * kLanes;                 // elements per chunk: four words per counter

#if defined(__AVX512F__)
// One Philox round over 16 counters: (hi, lo) = M * c as 64-bit products, from the even lanes and the odd lanes apart.
inline void mulhilo16(__m512i c, uint32_t m, __m512i& hi, __m512i& lo) {
  const __m512i mv = _mm512_set1_epi32(static_cast<int>(m));
  const __m512i even = _mm512_mul_epu32(c, mv), odd = _mm512_mul_epu32(_mm512_srli_epi64(c, 32), mv);
  hi = _mm512_mask_blend_epi32(0xAAAA, _mm512_srli_epi64(even, 32), odd);
  lo = _mm512_mullo_epi32(c, mv);
}
#elif defined(__AVX2__)
inline void mulhilo8(__m256i c, uint32_t m, __m256i& hi, __m256i& lo) {
  const __m256i mv = _mm256_set1_epi32(static_cast<int>(m));
  const __m256i even = _mm256_mul_epu32(c, mv), odd = _mm256_mul_epu32(_mm256_srli_epi64(c, 32), mv);
  hi = _mm256_blend_epi32(_mm256_srli_epi64(even, 32), odd, 0xAA);
  lo = _mm256_mullo_epi32(c, mv);
}
#endif

// The 4 x 16 random words of chunk `chunk`: counter (chunk * 16 + l, 0, 0, 0) under key (seed low, seed high) gives
// words[k][l], the bits of element chunk * 64 + k * 16 + l (so each of the four words fills 16 adjacent elements).
// Philox4x32's round: (hi0, lo0) = M0 c0, (hi1, lo1) = M1 c2, then c = (hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0) and the
// key advanced by (W0, W1); ten rounds.
inline void philox_chunk(uint64_t chunk, uint64_t seed, uint32_t words[4][kLanes]) {
  uint32_t c0[kLanes], c1[kLanes];
  for (int64_t l = 0; l < kLanes; ++l) {
    const uint64_t counter = chunk * kLanes + static_cast<uint64_t>(l);
    c0[l] = static_cast<uint32_t>(counter);
    c1[l] = static_cast<uint32_t>(counter >> 32);
  }
  uint32_t k0 = static_cast<uint32_t>(seed), k1 = static_cast<uint32_t>(seed >> 32);
#if defined(__AVX512F__)
  __m512i a = _mm512_loadu_si512(c0), b = _mm512_loadu_si512(c1), c = _mm512_setzero_si512(), d = _mm512_setzero_si512();
  for (int round = 0; round < 10; ++round, k0 += kW0, k1 += kW1) {
    __m512i hi0, lo0, hi1, lo1;
    mulhilo16(a, kM0, hi0, lo0);
    mulhilo16(c, kM1, hi1, lo1);
    a = _mm512_xor_si512(_mm512_xor_si512(hi1, b), _mm512_set1_epi32(static_cast<int>(k0)));
    c = _mm512_xor_si512(_mm512_xor_si512(hi0, d), _mm512_set1_epi32(static_cast<int>(k1)));
    b = lo1;
    d = lo0;
  }
  _mm512_storeu_si512(words[0], a);
  _mm512_storeu_si512(words[1], b);
  _mm512_storeu_si512(words[2], c);
  _mm512_storeu_si512(words[3], d);
#elif defined(__AVX2__)
  for (int64_t half = 0; half < kLanes; half += 8) {
    uint32_t key0 = k0, key1 = k1;
    __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(c0 + half));
    __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(c1 + half)), c = _mm256_setzero_si256(), d = c;
    for (int round = 0; round < 10; ++round, key0 += kW0, key1 += kW1) {
      __m256i hi0, lo0, hi1, lo1;
      mulhilo8(a, kM0, hi0, lo0);
      mulhilo8(c, kM1, hi1, lo1);
      a = _mm256_xor_si256(_mm256_xor_si256(hi1, b), _mm256_set1_epi32(static_cast<int>(key0)));
      c = _mm256_xor_si256(_mm256_xor_si256(hi0, d), _mm256_set1_epi32(static_cast<int>(key1)));
      b = lo1;
      d = lo0;
    }
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(words[0] + half), a);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(words[1] + half), b);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(words[2] + half), c);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(words[3] + half), d);
  }
#else
  uint32_t c2[kLanes] = {}, c3[kLanes] = {};
  for (int round = 0; round < 10; ++round, k0 += kW0, k1 += kW1) {
    for (int64_t l = 0; l < kLanes; ++l) {
      const uint64_t p0 = static_cast<uint64_t>(kM0) * c0[l], p1 = static_cast<uint64_t>(kM1) * c2[l];
      const uint32_t n0 = static_cast<uint32_t>(p1 >> 32) ^ c1[l] ^ k0, n2 = static_cast<uint32_t>(p0 >> 32) ^ c3[l] ^ k1;
      c1[l] = static_cast<uint32_t>(p1);
      c3[l] = static_cast<uint32_t>(p0);
      c0[l] = n0;
      c2[l] = n2;
    }
  }
  for (int64_t l = 0; l < kLanes; ++l) {
    words[0][l] = c0[l];
    words[1][l] = c1[l];
    words[2][l] = c2[l];
    words[3][l] = c3[l];
  }
#endif
}

// y[i] = x[i] * scale where element i's word is at least `threshold` (kept with probability 1 - threshold / 2^32), else
// 0; in fp32, y rounded once to its dtype. Chunks of 64 elements over torch's threads.
template <typename T>
void apply(const T* x, T* y, int64_t n, uint32_t threshold, float scale, uint64_t seed) {
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  at::parallel_for(0, chunks, 256, [&](int64_t begin, int64_t end) {
    uint32_t words[4][kLanes];
    for (int64_t c = begin; c < end; ++c) {
      philox_chunk(static_cast<uint64_t>(c), seed, words);
      const int64_t base = c * kChunk;
      if (base + kChunk <= n) {
        for (int64_t k = 0; k < 4; ++k) {
          const int64_t i = base + k * kLanes;
#if defined(__AVX512F__)
          const __mmask16 keep = _mm512_cmpge_epu32_mask(_mm512_loadu_si512(words[k]), _mm512_set1_epi32(static_cast<int>(threshold)));
          store16(y + i, _mm512_maskz_mul_ps(keep, load16(x + i), _mm512_set1_ps(scale)));
#elif defined(__AVX2__) && defined(__FMA__)
          for (int64_t h = 0; h < kLanes; h += 8) {  // word >= threshold, unsigned: max(word, threshold) == word
            const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(words[k] + h));
            const __m256 keep = _mm256_castsi256_ps(_mm256_cmpeq_epi32(_mm256_max_epu32(w, _mm256_set1_epi32(static_cast<int>(threshold))), w));
            store8(y + i + h, _mm256_and_ps(keep, _mm256_mul_ps(load8(x + i + h), _mm256_set1_ps(scale))));
          }
#else
          for (int64_t l = 0; l < kLanes; ++l) {
            y[i + l] = static_cast<T>(words[k][l] >= threshold ? static_cast<float>(x[i + l]) * scale : 0.f);
          }
#endif
        }
      } else {
        for (int64_t i = base; i < n; ++i) {
          const int64_t e = i - base;
          y[i] = static_cast<T>(words[e / kLanes][e % kLanes] >= threshold ? static_cast<float>(x[i]) * scale : 0.f);
        }
      }
    }
  });
}

uint32_t threshold_of(double p) {  // words below it are dropped: p * 2^32, rounded, within [0, 2^32 - 1]
  const double t = p * 4294967296.0 + 0.5;
  return t >= 4294967295.0 ? 0xFFFFFFFFu : static_cast<uint32_t>(t);
}

// dropout(x, p, seed): x an fp32 or bf16 CPU tensor, 0 <= p < 1; the same seed gives the same mask over x's elements in
// their logical order (the gradient's call passes the forward's seed).
at::Tensor dropout(const at::Tensor& x, double p, int64_t seed) {
  TORCH_CHECK(x.device().is_cpu() && (x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16),
              "aiayn_native::dropout: x must be a float32 or bfloat16 CPU tensor, got ", x.scalar_type(), " on ", x.device());
  TORCH_CHECK(p >= 0.0 && p < 1.0, "aiayn_native::dropout: p must be in [0, 1), got ", p);
  const at::Tensor xc = x.contiguous();
  at::Tensor y = at::empty_like(xc);
  const uint32_t threshold = threshold_of(p);
  const float scale = static_cast<float>(1.0 / (1.0 - p));
  if (x.scalar_type() == at::kFloat) {
    apply(xc.const_data_ptr<float>(), y.mutable_data_ptr<float>(), xc.numel(), threshold, scale, static_cast<uint64_t>(seed));
  } else {
    apply(xc.const_data_ptr<at::BFloat16>(), y.mutable_data_ptr<at::BFloat16>(), xc.numel(), threshold, scale,
          static_cast<uint64_t>(seed));
  }
  return y;
}

// The generator's words for elements 0 .. n - 1 under `seed`, as int32 (their bits): for tests against Philox's
// published answers.
at::Tensor dropout_bits(int64_t n, int64_t seed) {
  TORCH_CHECK(n >= 0, "aiayn_native::dropout_bits: n must be >= 0, got ", n);
  at::Tensor bits = at::empty({n}, at::kInt);
  auto* out = reinterpret_cast<uint32_t*>(bits.mutable_data_ptr<int32_t>());
  uint32_t words[4][kLanes];
  for (int64_t i = 0; i < n; ++i) {
    if (i % kChunk == 0) philox_chunk(static_cast<uint64_t>(i / kChunk), static_cast<uint64_t>(seed), words);
    out[i] = words[(i % kChunk) / kLanes][i % kLanes];
  }
  return bits;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(aiayn_native, m) {
  m.def("dropout(Tensor x, float p, int seed) -> Tensor");
  m.def("dropout_bits(int n, int seed) -> Tensor", &dropout_bits);  // no tensor in: a catch-all kernel
}

TORCH_LIBRARY_IMPL(aiayn_native, CPU, m) { m.impl("dropout", &dropout); }
