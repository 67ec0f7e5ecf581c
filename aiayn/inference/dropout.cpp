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

#include <algorithm>
#include <cstdint>

#include "simd.h"

namespace {

using namespace aiayn_simd;

constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;  // Philox4x32's multipliers
constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;  // and its key increments (the golden ratio, sqrt(3) - 1)
constexpr int64_t kLanes = 16;                         // counters generated at once (the loops vectorise over them)
constexpr int64_t kChunk = 4 * kLanes;                 // elements per chunk: four words per counter

// Counters side by side in this CPU's widest integer vector (one at a time without one), and what a Philox round
// does to them: xor (the vector types' own ^), a key broadcast, and (hi, lo) = M * c as 64-bit products (in vectors,
// from the even lanes and the odd lanes apart).
#if defined(__AVX512F__)
using Lanes = __m512i;
inline Lanes load_lanes(const uint32_t* p) { return _mm512_loadu_si512(p); }
inline void store_lanes(uint32_t* p, Lanes v) { _mm512_storeu_si512(p, v); }
inline Lanes splat(uint32_t k) { return _mm512_set1_epi32(static_cast<int>(k)); }
inline void mulhilo(Lanes c, uint32_t m, Lanes& hi, Lanes& lo) {
  const Lanes even = _mm512_mul_epu32(c, splat(m)), odd = _mm512_mul_epu32(_mm512_srli_epi64(c, 32), splat(m));
  hi = _mm512_mask_blend_epi32(0xAAAA, _mm512_srli_epi64(even, 32), odd);
  lo = _mm512_mullo_epi32(c, splat(m));
}
#elif defined(__AVX2__)
using Lanes = __m256i;
inline Lanes load_lanes(const uint32_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }
inline void store_lanes(uint32_t* p, Lanes v) { _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), v); }
inline Lanes splat(uint32_t k) { return _mm256_set1_epi32(static_cast<int>(k)); }
inline void mulhilo(Lanes c, uint32_t m, Lanes& hi, Lanes& lo) {
  const Lanes even = _mm256_mul_epu32(c, splat(m)), odd = _mm256_mul_epu32(_mm256_srli_epi64(c, 32), splat(m));
  hi = _mm256_blend_epi32(_mm256_srli_epi64(even, 32), odd, 0xAA);
  lo = _mm256_mullo_epi32(c, splat(m));
}
#else
using Lanes = uint32_t;
inline Lanes load_lanes(const uint32_t* p) { return *p; }
inline void store_lanes(uint32_t* p, Lanes v) { *p = v; }
inline Lanes splat(uint32_t k) { return k; }
inline void mulhilo(Lanes c, uint32_t m, Lanes& hi, Lanes& lo) {
  const uint64_t product = static_cast<uint64_t>(m) * c;
  hi = static_cast<uint32_t>(product >> 32);
  lo = static_cast<uint32_t>(product);
}
#endif
constexpr int64_t kWidth = sizeof(Lanes) / sizeof(uint32_t);  // counters a vector holds

// The 4 x 16 random words of chunk `chunk`: counter (chunk * 16 + l, 0, 0, 0) under key (seed low, seed high) gives
// words[k][l], the bits of element chunk * 64 + k * 16 + l (so each of the four words fills 16 adjacent elements).
// Philox4x32's round: (hi0, lo0) = M0 c0, (hi1, lo1) = M1 c2, then c = (hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0) and the
// key advanced by (W0, W1); ten rounds.
inline void philox_chunk(uint64_t chunk, uint64_t seed, uint32_t words[4][kLanes]) {
  uint32_t low[kLanes], high[kLanes];
  for (int64_t l = 0; l < kLanes; ++l) {
    const uint64_t counter = chunk * kLanes + static_cast<uint64_t>(l);
    low[l] = static_cast<uint32_t>(counter);
    high[l] = static_cast<uint32_t>(counter >> 32);
  }
  for (int64_t at = 0; at < kLanes; at += kWidth) {
    Lanes c0 = load_lanes(low + at), c1 = load_lanes(high + at), c2 = splat(0), c3 = splat(0);
    uint32_t k0 = static_cast<uint32_t>(seed), k1 = static_cast<uint32_t>(seed >> 32);
    for (int round = 0; round < 10; ++round, k0 += kW0, k1 += kW1) {
      Lanes hi0, lo0, hi1, lo1;
      mulhilo(c0, kM0, hi0, lo0);
      mulhilo(c2, kM1, hi1, lo1);
      c0 = hi1 ^ c1 ^ splat(k0);
      c2 = hi0 ^ c3 ^ splat(k1);
      c1 = lo1;
      c3 = lo0;
    }
    store_lanes(words[0] + at, c0);
    store_lanes(words[1] + at, c1);
    store_lanes(words[2] + at, c2);
    store_lanes(words[3] + at, c3);
  }
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
      const int64_t base = c * kChunk, stop = std::min(n, base + kChunk);
      int64_t i = base;
#if defined(__AVX512F__)
      for (; stop == base + kChunk && i < stop; i += kLanes) {  // a whole chunk: 16 elements a vector
        const __mmask16 keep = _mm512_cmpge_epu32_mask(_mm512_loadu_si512(words[(i - base) / kLanes]), splat(threshold));
        store16(y + i, _mm512_maskz_mul_ps(keep, load16(x + i), _mm512_set1_ps(scale)));
      }
#elif defined(__AVX2__) && defined(__FMA__)
      for (; stop == base + kChunk && i < stop; i += 8) {  // 8 a vector; word >= threshold, unsigned: max(word, threshold) == word
        const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(&words[(i - base) / kLanes][(i - base) % kLanes]));
        const __m256 keep = _mm256_castsi256_ps(_mm256_cmpeq_epi32(_mm256_max_epu32(w, splat(threshold)), w));
        store8(y + i, _mm256_and_ps(keep, _mm256_mul_ps(load8(x + i), _mm256_set1_ps(scale))));
      }
#endif
      for (; i < stop; ++i) {  // the rest: a chunk's tail, or everything without vectors
        const int64_t e = i - base;
        y[i] = static_cast<T>(words[e / kLanes][e % kLanes] >= threshold ? static_cast<float>(x[i]) * scale : 0.f);
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
