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

// This CPU's vector of floats (AVX-512: 16, AVX2: 8) and the four operations the sum of value rows needs.
#if defined(__AVX512F__)
using Floats = __m512;
constexpr int64_t kFloats = 16;
inline Floats zeros() { return _mm512_setzero_ps(); }
template <typename T>
inline Floats load_floats(const T* p) { return load16(p); }
inline Floats splat(float x) { return _mm512_set1_ps(x); }
inline Floats fma(Floats a, Floats b, Floats c) { return _mm512_fmadd_ps(a, b, c); }
inline void store_floats(float* p, Floats v) { _mm512_storeu_ps(p, v); }
#elif defined(__AVX2__) && defined(__FMA__)
using Floats = __m256;
constexpr int64_t kFloats = 8;
inline Floats zeros() { return _mm256_setzero_ps(); }
template <typename T>
inline Floats load_floats(const T* p) { return load8(p); }
inline Floats splat(float x) { return _mm256_set1_ps(x); }
inline Floats fma(Floats a, Floats b, Floats c) { return _mm256_fmadd_ps(a, b, c); }
inline void store_floats(float* p, Floats v) { _mm256_storeu_ps(p, v); }
#endif

// The attention-weighted sums of value rows for G queries of one (batch row, head): out[i][d] = sum over s < keys[i] of
// p[i][s] * v[s * stride + d], v widened to fp32. Each value vector is loaded once for the G queries (a check's queries
// share their keys); four vectors of columns at a time are summed over the rows in registers, then one; each query's
// column the rows in order, one multiply-add a row, whatever G, so a check's query gets the bits of the one-query step
// at its position. keys[] rises with i (causal queries): a row past keys[i] is not added to query i.
template <int G, typename T>
inline void weighted_rows(const float* const* p, const int64_t* keys, const T* __restrict v, int64_t stride, int64_t n,
                          float* const* out) {
  int64_t d = 0;
#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
  for (; d + 4 * kFloats <= n; d += 4 * kFloats) {
    Floats a[G][4];
    for (int i = 0; i < G; ++i) a[i][0] = a[i][1] = a[i][2] = a[i][3] = zeros();
    for (int64_t s = 0; s < keys[G - 1]; ++s) {
      Floats vs[4];
      for (int j = 0; j < 4; ++j) vs[j] = load_floats(v + s * stride + d + kFloats * j);
      for (int i = 0; i < G; ++i) {
        if (s >= keys[i]) continue;
        const Floats ps = splat(p[i][s]);
        for (int j = 0; j < 4; ++j) a[i][j] = fma(vs[j], ps, a[i][j]);
      }
    }
    for (int i = 0; i < G; ++i) {
      for (int j = 0; j < 4; ++j) store_floats(out[i] + d + kFloats * j, a[i][j]);
    }
  }
  for (; d + kFloats <= n; d += kFloats) {  // a head of 32 or 48 with AVX-512 (scalar, it took 1.8x torch's time at 6 x 32)
    Floats a[G];
    for (int i = 0; i < G; ++i) a[i] = zeros();
    for (int64_t s = 0; s < keys[G - 1]; ++s) {
      const Floats vs = load_floats(v + s * stride + d);
      for (int i = 0; i < G; ++i) {
        if (s < keys[i]) a[i] = fma(vs, splat(p[i][s]), a[i]);
      }
    }
    for (int i = 0; i < G; ++i) store_floats(out[i] + d, a[i]);
  }
#endif
  for (int i = 0; i < G; ++i) {  // the columns past the vectors
    for (int64_t c = d; c < n; ++c) {
      float a = 0.f;
      for (int64_t s = 0; s < keys[i]; ++s) a += p[i][s] * static_cast<float>(v[s * stride + c]);
      out[i][c] = a;
    }
  }
}

// Queries (heads' worth of one row) a value vector is loaded for at once: G partial sums of four vectors each take 16
// of AVX-512's 32 registers at four, of AVX2's 16 at two.
#if defined(__AVX512F__)
constexpr int64_t kQueryGroup = 4;
#else
constexpr int64_t kQueryGroup = 2;
#endif

// out (B, H, T, D) = softmax(q K^T * scale, keys where `mask` is true) V for each query of a (batch row, head): the
// scores are the dot products of the query with each key row (the matrix-vector product's `dots`), the softmax and the
// sum of value rows in fp32. `causal`: query t sees the first S - T + t + 1 keys (the last T are the queries' own
// positions), and only those are read. Head h reads key/value head h / (H / Hkv) (grouped-query attention). A row whose
// keys are all masked gets zeros, as the library's attention gives (aiayn/nn/attention.py). The (batch row, head) pairs
// are split over torch's threads, the next pair's keys and values asked for meanwhile. Several queries (speculative
// decoding's check) are computed together, each value row loaded once for a group of them (weighted_rows()), and
// every query's numbers with the same operations in the same order as the one-query step at its position computes them,
// so the same bits.
// T: the queries' and the output's type; KV: the keys' and values' (bf16 keys and values under fp32 queries: a cache kept
// in bf16, widened exactly as they are read, so the bits of the same values widened beforehand).
template <typename T, typename KV = T>
void attend_rows(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const bool* mask, int64_t mask_row,
                 double scale, bool causal, at::Tensor& out) {
  const int64_t batch = q.size(0), heads = q.size(1), queries = q.size(2), dim = q.size(3), all_keys = k.size(2);
  const int64_t group = heads / k.size(1), k_row = k.stride(2), v_row = v.stride(2);
  const T* qp = q.const_data_ptr<T>();
  const KV* kp = k.const_data_ptr<KV>();
  const KV* vp = v.const_data_ptr<KV>();
  T* op = out.mutable_data_ptr<T>();
  constexpr float none = -std::numeric_limits<float>::infinity();
  at::parallel_for(0, batch * heads, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> query(queries * dim), score(queries * all_keys), sum(queries * dim), total(queries);
    std::vector<int64_t> seen(queries);
    for (int64_t bh = begin; bh < end; ++bh) {
      const int64_t b = bh / heads, h = bh % heads, kv = h / group;
      if (bh + 1 < end) {  // the next pair's keys and values asked for now: they arrive meanwhile
        const int64_t nb = (bh + 1) / heads, nkv = ((bh + 1) % heads) / group;
        prefetch_rows(kp + nb * k.stride(0) + nkv * k.stride(1), all_keys, k_row, dim);
        prefetch_rows(vp + nb * v.stride(0) + nkv * v.stride(1), all_keys, v_row, dim);
      }
      const KV* kb = kp + b * k.stride(0) + kv * k.stride(1);
      const KV* vb = vp + b * v.stride(0) + kv * v.stride(1);
      const bool* allowed = mask ? mask + b * mask_row : nullptr;
      const T* qb = qp + b * q.stride(0) + h * q.stride(1);  // query t's row: qb + t * q.stride(2)
      for (int64_t t = 0; t < queries; ++t) {
        seen[t] = causal ? all_keys - queries + t + 1 : all_keys;
        const T* qr = qb + t * q.stride(2);
        for (int64_t d = 0; d < dim; ++d) query[t * dim + d] = static_cast<float>(qr[d]) * static_cast<float>(scale);
      }
      // The scores: query t's with keys s < seen[t], each sum as dots() makes it (dots16(): sixteen keys at a time).
      for (int64_t t = 0; t < queries; ++t) {
        float* row = score.data() + t * all_keys;
        int64_t s = 0;
#if defined(__AVX512BF16__)
        if constexpr (std::is_same_v<T, at::BFloat16> && std::is_same_v<KV, at::BFloat16>) {
          if (dim % 32 == 0) {  // bf16 keys and query multiplied in pairs, summed in fp32 (AVX512-BF16), then scaled
            for (; s < seen[t]; ++s) {  // the matrix-vector product's bf16 dots, one key row as its weight row
              dots_bf16<1>(kb + s * k_row, qb + t * q.stride(2), dim, 0, row + s);
              row[s] *= static_cast<float>(scale);
            }
          }
        }
#endif
#if defined(__AVX512F__)
        if (dim % 16 == 0) {
          for (; s + 16 <= seen[t]; s += 16) dots16(kb + s * k_row, k_row, query.data() + t * dim, dim, row + s);
        }
#endif
        for (; s < seen[t]; ++s) dots<1>(kb + s * k_row, query.data() + t * dim, dim, 0, row + s);
      }
      // Each query's softmax over its own keys, then the value rows weighted by it, a group of queries at a time.
      for (int64_t t = 0; t < queries; ++t) {
        float* row = score.data() + t * all_keys;
        float top = none;
        int64_t s = 0;
#if defined(__AVX512F__)
        if (allowed == nullptr) {  // the largest score, sixteen at a time (a maximum is the same in any order)
          __m512 m = _mm512_set1_ps(none);
          for (; s + 16 <= seen[t]; s += 16) m = _mm512_max_ps(m, _mm512_loadu_ps(row + s));
          top = _mm512_reduce_max_ps(m);
        }
#endif
        for (; s < seen[t]; ++s) {
          if (allowed && !allowed[s]) row[s] = none;
          top = std::max(top, row[s]);
        }
        total[t] = top == none ? 0.f : exp_shifted(row, seen[t], top);  // 0: every key masked
      }
      for (int64_t t0 = 0; t0 < queries; t0 += kQueryGroup) {
        const int64_t g = std::min(kQueryGroup, queries - t0);
        const float* p[kQueryGroup];
        float* o[kQueryGroup];
        for (int64_t i = 0; i < g; ++i) {
          p[i] = score.data() + (t0 + i) * all_keys;
          o[i] = sum.data() + (t0 + i) * dim;
        }
        switch (g) {
#if defined(__AVX512F__)
          case 4: weighted_rows<4>(p, &seen[t0], vb, v_row, dim, o); break;
          case 3: weighted_rows<3>(p, &seen[t0], vb, v_row, dim, o); break;
#endif
          case 2: weighted_rows<2>(p, &seen[t0], vb, v_row, dim, o); break;
          default: weighted_rows<1>(p, &seen[t0], vb, v_row, dim, o); break;
        }
      }
      for (int64_t t = 0; t < queries; ++t) {
        T* o = op + (bh * queries + t) * dim;
        for (int64_t d = 0; d < dim; ++d) o[d] = static_cast<T>(total[t] == 0.f ? 0.f : sum[t * dim + d] / total[t]);
      }
    }
  });
}

// A decoding step's attention: q (B, H, T, D) (one query, or a few with `causal`), k and v (B, Hkv, S, D) (views of a
// cache: any strides but the last, which must be 1), fp32 or bf16 alike, or fp32 queries over bf16 keys and values (a
// cache kept in bf16); mask None or bool (B or 1, 1, 1, S), true = may attend; out (B, H, T, D) in q's dtype.
at::Tensor attend_one(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const std::optional<at::Tensor>& mask,
                      double scale, bool causal) {
  TORCH_CHECK(q.device().is_cpu() && k.device().is_cpu() && v.device().is_cpu(), "aiayn_native::attend_one: CPU tensors only");
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4 && q.size(2) >= 1, "aiayn_native::attend_one: q (B, H, T, D), k and v ",
              "(B, Hkv, S, D), got q ", q.sizes(), ", k ", k.sizes(), ", v ", v.sizes());
  TORCH_CHECK(!causal || q.size(2) <= k.size(2), "aiayn_native::attend_one: causal attention needs at least as many keys as queries, got T=",
              q.size(2), ", S=", k.size(2));
  TORCH_CHECK(k.sizes() == v.sizes() && k.size(0) == q.size(0) && k.size(3) == q.size(3) && q.size(1) % k.size(1) == 0,
              "aiayn_native::attend_one: shapes do not fit: q ", q.sizes(), ", k ", k.sizes(), ", v ", v.sizes());
  const bool mixed = q.scalar_type() == at::kFloat && k.scalar_type() == at::kBFloat16;  // fp32 queries, a bf16 cache
  TORCH_CHECK((q.scalar_type() == k.scalar_type() || mixed) && k.scalar_type() == v.scalar_type() &&
              (q.scalar_type() == at::kFloat || q.scalar_type() == at::kBFloat16),
              "aiayn_native::attend_one: q, k and v must all be float32 or all bfloat16 (or float32 q with bfloat16 k and v), got q ",
              q.scalar_type(), ", k ", k.scalar_type(), ", v ", v.scalar_type());
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
  if (mixed) {
    attend_rows<float, at::BFloat16>(q, k, v, allowed, mask_row, scale, causal, out);
  } else if (q.scalar_type() == at::kFloat) {
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
