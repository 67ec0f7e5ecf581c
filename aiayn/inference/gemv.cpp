// The native kernels of decoding one token (aiayn/inference/gemv.py builds them on the machine that runs them):
// one row through a Linear layer, y = W x + b, the matrix-vector product of batch-1 decoding, over fp32, bf16 or int8
// weights (int8: times a scale per row); and one query's attention over a key/value cache (attend_one, below).
//
// The product reads the whole weight for two flops per weight, so its speed is the rate at which the threads stream the
// weight from memory. Each output feature is the dot product of one contiguous weight row with x (x stays in the
// L1 cache); torch's threads take contiguous blocks of rows, so each streams its own part of the weight front to
// back, the pattern the hardware prefetchers follow best. Built on the machine that runs it (-march=native), so the
// vector width is this CPU's: AVX-512, AVX2 with FMA, or what the compiler vectorises by itself.
//
// Where the hardware prefetchers alone keep too few lines in flight, asking for each line `prefetch` bytes ahead
// into L2 streams faster (on an AMX Xeon, 16 KiB ahead, one GPT-2-small token's weight reads: bf16 1.3x, int8 1.6-1.8x,
// fp32 with two rows at a time 1.1x; docs/benchmarks.md). Whether it pays is timed per machine and shape with the
// other kernels (aiayn/inference/kernel_choice.py); 0 for none.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif

namespace {

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

// Ask for the cache lines of `bytes` bytes at p into L2 (a hint: no fault past the end of the weight).
inline void prefetch_l2(const void* p, int64_t bytes) {
  for (int64_t off = 0; off < bytes; off += 64) __builtin_prefetch(static_cast<const char*>(p) + off, 0, 2);
}

// The dot products of R weight rows (`n` apart from one another) with x (fp32), each in four independent partial
// sums (so the additions do not wait on one another), then summed into out[r]; `ahead` > 0 prefetches the weights
// that many bytes ahead. With R = 2 each x vector is read once for both rows; each row's sums are the same operations
// in the same order whatever R, so the same bits whichever rows a thread's block pairs.
template <int R, typename W>
inline void dots(const W* __restrict w, const float* __restrict x, int64_t n, int64_t ahead, float* out) {
  int64_t k = 0;
#if defined(__AVX512F__)
  __m512 a[R][4];
  for (int r = 0; r < R; ++r) a[r][0] = a[r][1] = a[r][2] = a[r][3] = _mm512_setzero_ps();
  for (; k + 64 <= n; k += 64) {
    for (int r = 0; r < R && ahead; ++r) prefetch_l2(reinterpret_cast<const char*>(w + r * n + k) + ahead, 64 * sizeof(W));
    for (int j = 0; j < 4; ++j) {
      const __m512 xj = _mm512_loadu_ps(x + k + 16 * j);
      for (int r = 0; r < R; ++r) a[r][j] = _mm512_fmadd_ps(load16(w + r * n + k + 16 * j), xj, a[r][j]);
    }
  }
  for (; k + 16 <= n; k += 16) {
    const __m512 xk = _mm512_loadu_ps(x + k);
    for (int r = 0; r < R; ++r) a[r][0] = _mm512_fmadd_ps(load16(w + r * n + k), xk, a[r][0]);
  }
  for (int r = 0; r < R; ++r) out[r] = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a[r][0], a[r][1]), _mm512_add_ps(a[r][2], a[r][3])));
#elif defined(__AVX2__) && defined(__FMA__)
  __m256 a[R][4];
  for (int r = 0; r < R; ++r) a[r][0] = a[r][1] = a[r][2] = a[r][3] = _mm256_setzero_ps();
  for (; k + 32 <= n; k += 32) {
    for (int r = 0; r < R && ahead; ++r) prefetch_l2(reinterpret_cast<const char*>(w + r * n + k) + ahead, 32 * sizeof(W));
    for (int j = 0; j < 4; ++j) {
      const __m256 xj = _mm256_loadu_ps(x + k + 8 * j);
      for (int r = 0; r < R; ++r) a[r][j] = _mm256_fmadd_ps(load8(w + r * n + k + 8 * j), xj, a[r][j]);
    }
  }
  for (; k + 8 <= n; k += 8) {
    const __m256 xk = _mm256_loadu_ps(x + k);
    for (int r = 0; r < R; ++r) a[r][0] = _mm256_fmadd_ps(load8(w + r * n + k), xk, a[r][0]);
  }
  for (int r = 0; r < R; ++r) {
    const __m256 s = _mm256_add_ps(_mm256_add_ps(a[r][0], a[r][1]), _mm256_add_ps(a[r][2], a[r][3]));
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    h = _mm_add_ss(h, _mm_movehdup_ps(h));
    out[r] = _mm_cvtss_f32(h);
  }
#else
  for (int r = 0; r < R; ++r) out[r] = 0.f;
#endif
  for (int r = 0; r < R; ++r) {
    for (int64_t i = k; i < n; ++i) out[r] += static_cast<float>(w[r * n + i]) * x[i];
  }
}

template <typename W, typename B, typename Y>
void rows(const W* w, const float* x, const float* scale, const B* bias, Y* y, int64_t out, int64_t in, int64_t ahead) {
  // At least 32 Ki weights a block: a small layer runs on one thread rather than pay for waking the others.
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 15) / std::max<int64_t>(in, 1));
  at::parallel_for(0, out, grain, [&](int64_t begin, int64_t end) {
    auto write = [&](int64_t o, float d) {  // bf16: rounded to nearest even
      y[o] = static_cast<Y>((scale ? scale[o] * d : d) + (bias ? static_cast<float>(bias[o]) : 0.f));
    };
    int64_t o = begin;
    if constexpr (std::is_same_v<W, float>) {
      // fp32 rows two at a time where prefetching (in throw-away sweeps on an AMX Xeon, 2026-12-05, faster for GPT-2
      // small's fp32 weights, slower for its bf16 and int8 ones, so one at a time); "native" keeps one at a time: each
      // CPU times both.
      for (float d[2]; ahead && o + 2 <= end; o += 2) {
        dots<2>(w + o * in, x, in, ahead, d);
        write(o, d[0]);
        write(o + 1, d[1]);
      }
    }
    for (float d; o < end; ++o) {
      dots<1>(w + o * in, x, in, ahead, &d);
      write(o, d);
    }
  });
}

// The typed pointers of one call: weight fp32, bf16 or int8; bias none, fp32 or bf16; y fp32 or bf16.
template <typename Y>
void typed(const at::Tensor& weight, const float* x, const float* scale, const at::Tensor& bias, Y* y, int64_t out, int64_t in,
           int64_t ahead) {
  auto with_bias = [&](const auto* w) {
    if (!bias.defined()) {
      rows(w, x, scale, static_cast<const float*>(nullptr), y, out, in, ahead);
    } else if (bias.scalar_type() == at::kBFloat16) {
      rows(w, x, scale, bias.const_data_ptr<at::BFloat16>(), y, out, in, ahead);
    } else {
      rows(w, x, scale, bias.const_data_ptr<float>(), y, out, in, ahead);
    }
  };
  if (weight.scalar_type() == at::kFloat) {
    with_bias(weight.const_data_ptr<float>());
  } else if (weight.scalar_type() == at::kBFloat16) {
    with_bias(weight.const_data_ptr<at::BFloat16>());
  } else {
    with_bias(weight.const_data_ptr<int8_t>());
  }
}

// A vector as fp32 or bf16, contiguous: itself when it is one already, else converted (a dispatched copy).
at::Tensor float_or_bf16(const at::Tensor& t) {
  const bool typed = t.scalar_type() == at::kFloat || t.scalar_type() == at::kBFloat16;
  return typed ? t.contiguous() : t.to(at::kFloat).contiguous();
}

// y (out,) = scale * (weight x) + bias for one row x of in elements (any shape), weight (out, in) row-major:
// fp32 or bf16 weights (no scale), or int8 with an fp32 scale per row; x fp32 or bf16, y in x's dtype; the weights
// prefetched `prefetch` bytes ahead (0: none).
// One allocation (y) and no other torch operator a call: a bf16 x is widened here, and y written in its dtype
// (through torch's conversions, three more operators a call took 0.48 ms of a 4.9 ms bf16 GPT-2 token).
at::Tensor gemv(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& scale,
                const std::optional<at::Tensor>& bias, int64_t prefetch) {
  TORCH_CHECK(x.device().is_cpu() && weight.device().is_cpu(), "aiayn_native::gemv: CPU tensors only");
  TORCH_CHECK(x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16, "aiayn_native::gemv: x must be float32 or bfloat16, got ",
              x.scalar_type());
  TORCH_CHECK(weight.dim() == 2 && weight.is_contiguous(), "aiayn_native::gemv: weight must be a contiguous (out, in) matrix");
  const at::ScalarType wtype = weight.scalar_type();
  const bool scaled = scale.has_value() && scale->defined();
  TORCH_CHECK(wtype == at::kFloat || wtype == at::kBFloat16 || wtype == at::kChar, "aiayn_native::gemv: weight must be float32, ",
              "bfloat16 or int8, got ", wtype);
  TORCH_CHECK(scaled == (wtype == at::kChar), "aiayn_native::gemv: a scale goes with int8 weights, and only with them");
  const int64_t out = weight.size(0), in = weight.size(1);
  TORCH_CHECK(x.numel() == in, "aiayn_native::gemv: x has ", x.numel(), " elements, the weight takes ", in);
  TORCH_CHECK(prefetch >= 0, "aiayn_native::gemv: prefetch is a distance in bytes, 0 or more, got ", prefetch);
  at::Tensor s, b;
  if (scaled) {
    s = scale->scalar_type() == at::kFloat ? scale->contiguous() : scale->to(at::kFloat).contiguous();
    TORCH_CHECK(s.numel() == out, "aiayn_native::gemv: scale must have ", out, " elements, got ", s.numel());
  }
  if (bias.has_value() && bias->defined()) {
    b = float_or_bf16(*bias);
    TORCH_CHECK(b.numel() == out, "aiayn_native::gemv: bias must have ", out, " elements, got ", b.numel());
  }
  const at::Tensor row = x.contiguous();
  std::vector<float> widened;  // a bf16 row in fp32 (exact): the dot products read fp32
  const float* xp = nullptr;
  if (row.scalar_type() == at::kFloat) {
    xp = row.const_data_ptr<float>();
  } else {
    const at::BFloat16* xb = row.const_data_ptr<at::BFloat16>();
    widened.assign(xb, xb + in);
    xp = widened.data();
  }
  const float* sp = scaled ? s.const_data_ptr<float>() : nullptr;
  at::Tensor y = at::empty({out}, x.options());
  if (x.scalar_type() == at::kFloat) {
    typed(weight, xp, sp, b, y.mutable_data_ptr<float>(), out, in, prefetch);
  } else {
    typed(weight, xp, sp, b, y.mutable_data_ptr<at::BFloat16>(), out, in, prefetch);
  }
  return y;
}

// out[d] = sum over s < rows of p[s] * v[s * stride + d], for d < n: the attention-weighted sum of value rows, v
// widened to fp32. Four vectors of columns at a time are summed over all rows in registers, then stored.
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
#elif defined(__AVX2__) && defined(__FMA__)
  for (; d + 32 <= n; d += 32) {
    __m256 a[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    for (int64_t s = 0; s < rows; ++s) {
      const __m256 ps = _mm256_set1_ps(p[s]);
      for (int j = 0; j < 4; ++j) a[j] = _mm256_fmadd_ps(load8(v + s * stride + d + 8 * j), ps, a[j]);
    }
    for (int j = 0; j < 4; ++j) _mm256_storeu_ps(out + d + 8 * j, a[j]);
  }
#endif
  for (; d < n; ++d) {
    float a = 0.f;
    for (int64_t s = 0; s < rows; ++s) a += p[s] * static_cast<float>(v[s * stride + d]);
    out[d] = a;
  }
}

#if defined(__AVX512BF16__)
// The dot product of two bf16 rows of n elements (n a multiple of 32), the products of pairs summed in fp32.
inline float dot_bf16(const at::BFloat16* a, const at::BFloat16* b, int64_t n) {
  __m512 acc = _mm512_setzero_ps();
  for (int64_t i = 0; i < n; i += 32) {
    acc = _mm512_dpbf16_ps(acc, (__m512bh)_mm512_loadu_si512(a + i), (__m512bh)_mm512_loadu_si512(b + i));
  }
  return _mm512_reduce_add_ps(acc);
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
#endif

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

// out (B, H, 1, D) = softmax(q K^T * scale, keys where `mask` is true) V for one query a (batch row, head): the scores
// are the dot products of the query with each key row (the matrix-vector product's `dots`, four keys at a time where
// the rows follow one another), the softmax and the sum of value rows in fp32. Head h reads key/value head
// h / (H / Hkv) (grouped-query attention). A row whose keys are all masked gets zeros, as the library's attention
// gives (aiayn/nn/attention.py). The (batch, head) pairs are split over torch's threads.
template <typename T>
void attend_rows(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const bool* mask, int64_t mask_row,
                 double scale, at::Tensor& out) {
  const int64_t batch = q.size(0), heads = q.size(1), dim = q.size(3), keys = k.size(2), group = heads / k.size(1);
  const int64_t k_row = k.stride(2), v_row = v.stride(2);
  const T* qp = q.const_data_ptr<T>();
  const T* kp = k.const_data_ptr<T>();
  const T* vp = v.const_data_ptr<T>();
  T* op = out.mutable_data_ptr<T>();
  constexpr float none = -std::numeric_limits<float>::infinity();
  at::parallel_for(0, batch * heads, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> query(dim), score(keys), sum(dim);
    for (int64_t bh = begin; bh < end; ++bh) {
      const int64_t b = bh / heads, h = bh % heads, kv = h / group;
      const T* qr = qp + b * q.stride(0) + h * q.stride(1);
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
      T* o = op + (b * heads + h) * dim;
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

// One query's attention at a decoding step: q (B, H, 1, D), k and v (B, Hkv, S, D) (views of a cache: any strides but
// the last, which must be 1), fp32 or bf16 alike; mask None or bool (B or 1, 1, 1, S), true = may attend; out
// (B, H, 1, D) in q's dtype.
at::Tensor attend_one(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const std::optional<at::Tensor>& mask,
                      double scale) {
  TORCH_CHECK(q.device().is_cpu() && k.device().is_cpu() && v.device().is_cpu(), "aiayn_native::attend_one: CPU tensors only");
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4 && q.size(2) == 1, "aiayn_native::attend_one: q (B, H, 1, D), k and v ",
              "(B, Hkv, S, D), got q ", q.sizes(), ", k ", k.sizes(), ", v ", v.sizes());
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
  at::Tensor out = at::empty({q.size(0), q.size(1), 1, q.size(3)}, q.options());
  if (q.scalar_type() == at::kFloat) {
    attend_rows<float>(q, k, v, allowed, mask_row, scale, out);
  } else {
    attend_rows<at::BFloat16>(q, k, v, allowed, mask_row, scale, out);
  }
  return out;
}

// GELU with tanh's approximation (GPT-2's activation), 0.5 x (1 + tanh u) with u = sqrt(2/pi) (x + 0.044715 x^3),
// written as x * sigmoid(2u) (the same function), and its derivative
// sigmoid(2u) + x sigmoid(2u) (1 - sigmoid(2u)) 2 sqrt(2/pi) (1 + 3 * 0.044715 x^2), in fp32 whatever the tensors' dtype.
// torch's CPU kernel for it took 4.4x its exact-erf GELU's time (a (12, 64, 512) fp32 tensor, AMX Xeon, 2026-12-05).
constexpr float kGeluC = 0.7978845608028654f, kGeluA = 0.044715f;

inline float gelu_sigmoid(float x) {  // sigmoid(2u)
  const float z = 2.f * kGeluC * (x + kGeluA * x * x * x);
  return 1.f / (1.f + std::exp(std::min(-z, 88.f)));
}

#if defined(__AVX512F__)
inline __m512 gelu_sigmoid16(__m512 x) {
  const __m512 x2 = _mm512_mul_ps(x, x);
  const __m512 z = _mm512_mul_ps(_mm512_mul_ps(_mm512_set1_ps(2.f * kGeluC), x), _mm512_fmadd_ps(_mm512_set1_ps(kGeluA), x2, _mm512_set1_ps(1.f)));
  return _mm512_div_ps(_mm512_set1_ps(1.f), _mm512_add_ps(_mm512_set1_ps(1.f), exp16(_mm512_sub_ps(_mm512_setzero_ps(), z))));
}
#endif

// y = gelu(x), or (with g) y = g * gelu'(x), for n elements; torch's threads take blocks of them.
template <typename T>
void gelu_tanh_rows(const T* x, const T* g, T* y, int64_t n) {
  at::parallel_for(0, n, 1 << 14, [&](int64_t begin, int64_t end) {
    int64_t i = begin;
#if defined(__AVX512F__)
    for (; i + 16 <= end; i += 16) {
      const __m512 xv = load16(x + i);
      const __m512 sv = gelu_sigmoid16(xv);
      if (g == nullptr) {
        store16(y + i, _mm512_mul_ps(xv, sv));
      } else {
        const __m512 inner = _mm512_mul_ps(_mm512_set1_ps(2.f * kGeluC), _mm512_fmadd_ps(_mm512_set1_ps(3.f * kGeluA), _mm512_mul_ps(xv, xv), _mm512_set1_ps(1.f)));
        const __m512 ds = _mm512_mul_ps(_mm512_mul_ps(sv, _mm512_sub_ps(_mm512_set1_ps(1.f), sv)), inner);
        store16(y + i, _mm512_mul_ps(load16(g + i), _mm512_fmadd_ps(xv, ds, sv)));
      }
    }
#endif
    for (; i < end; ++i) {
      const float xf = static_cast<float>(x[i]), sf = gelu_sigmoid(xf);
      if (g == nullptr) {
        y[i] = static_cast<T>(xf * sf);
      } else {
        const float inner = 2.f * kGeluC * (1.f + 3.f * kGeluA * xf * xf);
        y[i] = static_cast<T>(static_cast<float>(g[i]) * (sf + xf * sf * (1.f - sf) * inner));
      }
    }
  });
}

// gelu_tanh(x) and gelu_tanh_backward(grad, x): contiguous fp32 or bf16 CPU tensors of one shape and dtype.
at::Tensor gelu_tanh_call(const at::Tensor& x, const at::Tensor* grad) {
  TORCH_CHECK(x.device().is_cpu() && (x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16),
              "aiayn_native::gelu_tanh: x must be a float32 or bfloat16 CPU tensor, got ", x.scalar_type(), " on ", x.device());
  TORCH_CHECK(grad == nullptr || (grad->sizes() == x.sizes() && grad->scalar_type() == x.scalar_type() && grad->device().is_cpu()),
              "aiayn_native::gelu_tanh_backward: grad must have x's shape and dtype");
  const at::Tensor xc = x.contiguous();
  const at::Tensor gc = grad ? grad->contiguous() : at::Tensor();
  at::Tensor y = at::empty_like(xc);
  if (x.scalar_type() == at::kFloat) {
    gelu_tanh_rows(xc.const_data_ptr<float>(), grad ? gc.const_data_ptr<float>() : nullptr, y.mutable_data_ptr<float>(), xc.numel());
  } else {
    gelu_tanh_rows(xc.const_data_ptr<at::BFloat16>(), grad ? gc.const_data_ptr<at::BFloat16>() : nullptr,
                   y.mutable_data_ptr<at::BFloat16>(), xc.numel());
  }
  return y;
}

at::Tensor gelu_tanh(const at::Tensor& x) { return gelu_tanh_call(x, nullptr); }
at::Tensor gelu_tanh_backward(const at::Tensor& grad, const at::Tensor& x) { return gelu_tanh_call(x, &grad); }

}  // namespace

TORCH_LIBRARY(aiayn_native, m) {
  m.def("gemv(Tensor x, Tensor weight, Tensor? scale, Tensor? bias, int prefetch=0) -> Tensor");
  m.def("attend_one(Tensor q, Tensor k, Tensor v, Tensor? mask, float scale) -> Tensor");
  m.def("gelu_tanh(Tensor x) -> Tensor");
  m.def("gelu_tanh_backward(Tensor grad, Tensor x) -> Tensor");
}

TORCH_LIBRARY_IMPL(aiayn_native, CPU, m) {
  m.impl("gemv", &gemv);
  m.impl("attend_one", &attend_one);
  m.impl("gelu_tanh", &gelu_tanh);
  m.impl("gelu_tanh_backward", &gelu_tanh_backward);
}
