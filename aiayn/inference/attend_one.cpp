// One query's attention over a key/value cache: a decoding step's softmax(q K^T / sqrt(d)) V, per (batch row, head),
// in fp32 (aiayn/inference/gemv.py builds it with the matrix-vector product; aiayn/nn/attention.py calls it where the
// one-query choice picked it, aiayn/inference/kernel_choice.py). A few causal queries (speculative decoding's check)
// are each computed as the one-query step at its position computes it: over its own keys only, so the bits agree.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <limits>
#include <type_traits>
#include <vector>

#include "simd.h"

namespace {

using namespace aiayn_simd;

// out[d] = sum over s < rows of p[s] * v[s * stride + d], for d < n: the attention-weighted sum of value rows, v
// widened to fp32. Four vectors of columns at a time are summed over all rows in registers, then stored; then one.
template <typename T>
inline void weighted_rows(const float* __restrict p, const T* __restrict v, int64_t rows, int64_t stride, int64_t n,
                          float* __restrict out) {
  int64_t d = 0;
#if defined(__AVX512F__)
  for (; d + 64 <= n; d += 64) {
    __m512 a[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
    for (int64_t s = 0; s < rows; ++s) {
      const __m512 ps = _mm512_set1_ps(p[s]);
      for (int j = 0; j < 4; ++j) a[j] = _mm512_fmadd_ps(load16(v + s * stride + d + 16 * j), ps, a[j]);
    }
    for (int j = 0; j < 4; ++j) _mm512_storeu_ps(out + d + 16 * j, a[j]);
  }
  for (; d + 16 <= n; d += 16) {  // a head of 32 or 48: one vector at a time (it was scalar: 1.8x torch's time at 6 x 32)
    __m512 a = _mm512_setzero_ps();
    for (int64_t s = 0; s < rows; ++s) a = _mm512_fmadd_ps(load16(v + s * stride + d), _mm512_set1_ps(p[s]), a);
    _mm512_storeu_ps(out + d, a);
  }
#elif defined(__AVX2__) && defined(__FMA__)
  for (; d + 32 <= n; d += 32) {
    __m256 a[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    for (int64_t s = 0; s < rows; ++s) {
      const __m256 ps = _mm256_set1_ps(p[s]);
      for (int j = 0; j < 4; ++j) a[j] = _mm256_fmadd_ps(load8(v + s * stride + d + 8 * j), ps, a[j]);
    }
    for (int j = 0; j < 4; ++j) _mm256_storeu_ps(out + d + 8 * j, a[j]);
  }
  for (; d + 8 <= n; d += 8) {
    __m256 a = _mm256_setzero_ps();
    for (int64_t s = 0; s < rows; ++s) a = _mm256_fmadd_ps(load8(v + s * stride + d), _mm256_set1_ps(p[s]), a);
    _mm256_storeu_ps(out + d, a);
  }
#endif
  for (; d < n; ++d) {
    float a = 0.f;
    for (int64_t s = 0; s < rows; ++s) a += p[s] * static_cast<float>(v[s * stride + d]);
    out[d] = a;
  }
}

// Ask for `rows` rows of n elements, `stride` apart, into L2. A decoding step's cache comes from memory (a token's
// weights stream through the caches between two reads of it); without this, a pair's keys arrive one miss at a time.
template <typename T>
inline void prefetch_rows(const T* p, int64_t rows, int64_t stride, int64_t n) {
  if (stride == n) {
    prefetch_l2(p, rows * n * static_cast<int64_t>(sizeof(T)));
    return;
  }
  for (int64_t s = 0; s < rows; ++s) prefetch_l2(p + s * stride, n * static_cast<int64_t>(sizeof(T)));
}

// x[i] = exp(x[i] - top) for i < n; returns their sum (arguments clamped at -87, so a masked key's -inf gives about
// 1e-38, nothing beside the largest term's 1).
inline float exp_shifted(float* x, int64_t n, float top) {
  int64_t i = 0;
  float total = 0.f;
#if defined(__AVX512F__)
  __m512 acc = _mm512_setzero_ps();
  for (; i + 16 <= n; i += 16) {
    const __m512 e = exp16(_mm512_sub_ps(_mm512_loadu_ps(x + i), _mm512_set1_ps(top)));
    _mm512_storeu_ps(x + i, e);
    acc = _mm512_add_ps(acc, e);
  }
  total = _mm512_reduce_add_ps(acc);
#endif
  for (; i < n; ++i) {
    x[i] = std::exp(std::max(x[i] - top, -87.f));
    total += x[i];
  }
  return total;
}

// out (B, H, T, D) = softmax(q K^T * scale, keys where `mask` is true) V for each query of a (batch row, head): the
// scores are the dot products of the query with each key row (the matrix-vector product's `dots`, four keys at a time
// where the rows follow one another), the softmax and the sum of value rows in fp32. `causal`: query t sees the first
// S - T + t + 1 keys (the last T are the queries' own positions), and only those are read. Head h reads key/value head
// h / (H / Hkv) (grouped-query attention). A row whose keys are all masked gets zeros, as the library's attention
// gives (aiayn/nn/attention.py). The (batch, head, query) triples are split over torch's threads.
template <typename T>
void attend_rows(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const bool* mask, int64_t mask_row,
                 double scale, bool causal, at::Tensor& out) {
  const int64_t batch = q.size(0), heads = q.size(1), queries = q.size(2), dim = q.size(3), all_keys = k.size(2);
  const int64_t group = heads / k.size(1), k_row = k.stride(2), v_row = v.stride(2);
  const T* qp = q.const_data_ptr<T>();
  const T* kp = k.const_data_ptr<T>();
  const T* vp = v.const_data_ptr<T>();
  T* op = out.mutable_data_ptr<T>();
  constexpr float none = -std::numeric_limits<float>::infinity();
  at::parallel_for(0, batch * heads * queries, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> query(dim), score(all_keys), sum(dim);
    for (int64_t bht = begin; bht < end; ++bht) {
      const int64_t bh = bht / queries, t = bht % queries, b = bh / heads, h = bh % heads, kv = h / group;
      const int64_t keys = causal ? all_keys - queries + t + 1 : all_keys;
      if (t + 1 == queries && bht + 1 < end) {  // the next pair's keys and values asked for now: they arrive meanwhile
        const int64_t nb = (bh + 1) / heads, nkv = ((bh + 1) % heads) / group;
        prefetch_rows(kp + nb * k.stride(0) + nkv * k.stride(1), all_keys, k_row, dim);
        prefetch_rows(vp + nb * v.stride(0) + nkv * v.stride(1), all_keys, v_row, dim);
      }
      const T* qr = qp + b * q.stride(0) + h * q.stride(1) + t * q.stride(2);
      for (int64_t d = 0; d < dim; ++d) query[d] = static_cast<float>(qr[d]) * static_cast<float>(scale);
      const T* kb = kp + b * k.stride(0) + kv * k.stride(1);
      const T* vb = vp + b * v.stride(0) + kv * v.stride(1);
      const bool* allowed = mask ? mask + b * mask_row : nullptr;
      int64_t s = 0;
#if defined(__AVX512BF16__)
      if constexpr (std::is_same_v<T, at::BFloat16>) {
        if (dim % 32 == 0) {  // bf16 keys and query multiplied in pairs, summed in fp32 (AVX512-BF16), then scaled
          for (; s < keys; ++s) score[s] = dot_bf16(kb + s * k_row, qr, dim) * static_cast<float>(scale);
        }
      }
#endif
      if (s == 0 && k_row == dim) {
        for (; s + 4 <= keys; s += 4) dots<4>(kb + s * dim, query.data(), dim, 0, &score[s]);
      }
      for (; s < keys; ++s) dots<1>(kb + s * k_row, query.data(), dim, 0, &score[s]);
      float top = none;
      for (s = 0; s < keys; ++s) {
        if (allowed && !allowed[s]) score[s] = none;
        top = std::max(top, score[s]);
      }
      T* o = op + bht * dim;
      if (top == none) {  // every key masked: zeros
        for (int64_t d = 0; d < dim; ++d) o[d] = static_cast<T>(0.f);
        continue;
      }
      const float total = exp_shifted(score.data(), keys, top);
      weighted_rows(score.data(), vb, keys, v_row, dim, sum.data());
      for (int64_t d = 0; d < dim; ++d) o[d] = static_cast<T>(sum[d] / total);
    }
  });
}

// A decoding step's attention: q (B, H, T, D) (one query, or a few with `causal`), k and v (B, Hkv, S, D) (views of a
// cache: any strides but the last, which must be 1), fp32 or bf16 alike; mask None or bool (B or 1, 1, 1, S), true =
// may attend; out (B, H, T, D) in q's dtype.
at::Tensor attend_one(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const std::optional<at::Tensor>& mask,
                      double scale, bool causal) {
  TORCH_CHECK(q.device().is_cpu() && k.device().is_cpu() && v.device().is_cpu(), "aiayn_native::attend_one: CPU tensors only");
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4 && q.size(2) >= 1, "aiayn_native::attend_one: q (B, H, T, D), k and v ",
              "(B, Hkv, S, D), got q ", q.sizes(), ", k ", k.sizes(), ", v ", v.sizes());
  TORCH_CHECK(!causal || q.size(2) <= k.size(2), "aiayn_native::attend_one: causal attention needs at least as many keys as queries, got T=",
              q.size(2), ", S=", k.size(2));
  TORCH_CHECK(k.sizes() == v.sizes() && k.size(0) == q.size(0) && k.size(3) == q.size(3) && q.size(1) % k.size(1) == 0,
              "aiayn_native::attend_one: shapes do not fit: q ", q.sizes(), ", k ", k.sizes(), ", v ", v.sizes());
  TORCH_CHECK(q.scalar_type() == k.scalar_type() && q.scalar_type() == v.scalar_type() &&
              (q.scalar_type() == at::kFloat || q.scalar_type() == at::kBFloat16),
              "aiayn_native::attend_one: q, k and v must all be float32 or all bfloat16");
  TORCH_CHECK(q.stride(3) == 1 && k.stride(3) == 1 && v.stride(3) == 1, "aiayn_native::attend_one: the last dimension must be contiguous");
  const bool* allowed = nullptr;
  int64_t mask_row = 0;
  at::Tensor m;
  if (mask.has_value() && mask->defined()) {
    m = mask->contiguous();
    TORCH_CHECK(m.scalar_type() == at::kBool && m.dim() == 4 && (m.size(0) == 1 || m.size(0) == q.size(0)) && m.size(1) == 1 &&
                m.size(2) == 1 && m.size(3) == k.size(2), "aiayn_native::attend_one: mask must be bool (B or 1, 1, 1, S), got ",
                m.scalar_type(), " ", m.sizes());
    allowed = m.const_data_ptr<bool>();
    mask_row = m.size(0) == 1 ? 0 : k.size(2);
  }
  at::Tensor out = at::empty({q.size(0), q.size(1), q.size(2), q.size(3)}, q.options());
  if (q.scalar_type() == at::kFloat) {
    attend_rows<float>(q, k, v, allowed, mask_row, scale, causal, out);
  } else {
    attend_rows<at::BFloat16>(q, k, v, allowed, mask_row, scale, causal, out);
  }
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(aiayn_native, m) {
  m.def("attend_one(Tensor q, Tensor k, Tensor v, Tensor? mask, float scale, bool causal=False) -> Tensor");
}

TORCH_LIBRARY_IMPL(aiayn_native, CPU, m) {
  m.impl("attend_one", &attend_one);
}
