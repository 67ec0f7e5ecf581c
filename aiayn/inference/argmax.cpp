// Greedy decoding's pick: the index of the largest score in each row, as torch's argmax gives it (the first on ties, a
// NaN counting as the largest), over fp32 or bf16 rows (aiayn/decoding/sampling.py calls it where the library is loaded).
//
// Why: after a token's weights have streamed through the caches, torch's reduction (its dispatch and TensorIterator
// code, evicted) took 106-182 us for one row of 50257 logits on a Zen 4 EPYC (47-78 us hot), where these two passes over
// the row (its largest value, then where it first is) take 5 us hot and 14 us in decoding (docs/benchmarks.md). The C++
// decoding step calls it on the logits it returns (aiayn/inference/decode_step.cpp), each thread on the part its core wrote.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "simd.h"

namespace {

using namespace aiayn_simd;

constexpr int64_t kBlock = 4096;  // the fewest scores worth a thread of their own

// The largest of x[0..n) widened to fp32, or NaN where the row holds one.
template <typename T>
float row_max(const T* x, int64_t n) {
  int64_t i = 0;
  float top = -INFINITY;
  bool nan = false;
#if defined(__AVX512F__)
  __m512 m = _mm512_set1_ps(-INFINITY);
  __mmask16 unordered = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 y = load16(x + i);
    unordered |= _mm512_cmp_ps_mask(y, y, _CMP_UNORD_Q);
    m = _mm512_max_ps(m, y);
  }
  top = _mm512_reduce_max_ps(m);
  nan = unordered != 0;
#elif defined(__AVX2__) && defined(__FMA__)
  __m256 m = _mm256_set1_ps(-INFINITY), unordered = _mm256_setzero_ps();
  for (; i + 8 <= n; i += 8) {
    const __m256 y = load8(x + i);
    unordered = _mm256_or_ps(unordered, _mm256_cmp_ps(y, y, _CMP_UNORD_Q));
    m = _mm256_max_ps(m, y);
  }
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, m);
  for (const float lane : lanes) top = std::max(top, lane);
  nan = _mm256_movemask_ps(unordered) != 0;
#endif
  for (; i < n; ++i) {
    const float y = static_cast<float>(x[i]);
    nan = nan || std::isnan(y);
    top = std::max(top, y);
  }
  return nan ? NAN : top;
}

// The first i with x[i] == value, or with x[i] a NaN where value is one.
template <typename T>
int64_t first_index(const T* x, int64_t n, float value) {
  const bool nan = std::isnan(value);
  int64_t i = 0;
#if defined(__AVX512F__)
  const __m512 v = _mm512_set1_ps(value);
  for (; i + 16 <= n; i += 16) {
    const __m512 y = load16(x + i);
    const __mmask16 hit = nan ? _mm512_cmp_ps_mask(y, y, _CMP_UNORD_Q) : _mm512_cmp_ps_mask(y, v, _CMP_EQ_OQ);
    if (hit) return i + __builtin_ctz(hit);
  }
#elif defined(__AVX2__) && defined(__FMA__)
  const __m256 v = _mm256_set1_ps(value);
  for (; i + 8 <= n; i += 8) {
    const __m256 y = load8(x + i);
    const int hit = _mm256_movemask_ps(nan ? _mm256_cmp_ps(y, y, _CMP_UNORD_Q) : _mm256_cmp_ps(y, v, _CMP_EQ_OQ));
    if (hit) return i + __builtin_ctz(hit);
  }
#endif
  for (; i < n; ++i) {
    const float y = static_cast<float>(x[i]);
    if (nan ? std::isnan(y) : y == value) return i;
  }
  return n;  // not reached: value was taken from the row
}

// Each row's pick, the row split into blocks over torch's threads (each block's largest value and where it first is,
// then the first block holding the largest): the output projection wrote each thread's part of the logits into its own
// core's cache, where that thread reads it again.
template <typename T>
void argmax_rows(const at::Tensor& scores, int64_t* out) {
  const int64_t rows = scores.size(0), n = scores.size(1), blocks = std::min<int64_t>(at::get_num_threads(), (n + kBlock - 1) / kBlock);
  std::vector<float> top(blocks);
  std::vector<int64_t> where(blocks);
  for (int64_t r = 0; r < rows; ++r) {
    const T* x = scores.const_data_ptr<T>() + r * n;
    at::parallel_for(0, blocks, 1, [&](int64_t begin, int64_t end) {
      for (int64_t k = begin; k < end; ++k) {
        const int64_t from = n * k / blocks, to = n * (k + 1) / blocks;
        top[k] = row_max(x + from, to - from);
        where[k] = from + first_index(x + from, to - from, top[k]);
      }
    });
    int64_t best = 0;  // the first block whose value is NaN, else the first holding the largest
    for (int64_t k = 1; k < blocks; ++k) {
      if (!std::isnan(top[best]) && (std::isnan(top[k]) || top[k] > top[best])) best = k;
    }
    out[r] = where[best];
  }
}

// scores (B, V), float32 or bfloat16, V > 0 -> (B,) long.
at::Tensor argmax_last(const at::Tensor& scores) {
  TORCH_CHECK(scores.device().is_cpu() && scores.dim() == 2 && scores.size(1) > 0 &&
              (scores.scalar_type() == at::kFloat || scores.scalar_type() == at::kBFloat16),
              "aiayn_native::argmax_last: scores (B, V) float32 or bfloat16 on the CPU with V > 0, got ", scores.scalar_type(), " ",
              scores.sizes());
  const at::Tensor rows = scores.contiguous();
  at::Tensor out = at::empty({rows.size(0)}, rows.options().dtype(at::kLong));
  if (rows.scalar_type() == at::kFloat) {
    argmax_rows<float>(rows, out.mutable_data_ptr<int64_t>());
  } else {
    argmax_rows<at::BFloat16>(rows, out.mutable_data_ptr<int64_t>());
  }
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(aiayn_native, m) {
  m.def("argmax_last(Tensor scores) -> Tensor");
}

TORCH_LIBRARY_IMPL(aiayn_native, CPU, m) {
  m.impl("argmax_last", &argmax_last);
}
