// One row through a Linear layer, y = W x + b: the matrix-vector product of batch-1 decoding (aiayn/inference/gemv.py),
// over fp32, bf16 or int8 weights (int8: times a scale per row).
//
// It reads the whole weight for two flops per weight, so its speed is the rate at which the threads stream the
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

// The dot product of one weight row with x (fp32), in four independent partial sums (so the additions do not wait on
// one another), then summed; `ahead` > 0 prefetches the weights that many bytes ahead.
template <typename W>
inline float dot(const W* __restrict w, const float* __restrict x, int64_t n, int64_t ahead) {
  int64_t k = 0;
  float sum = 0.f;
#if defined(__AVX512F__)
  __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps(), a2 = _mm512_setzero_ps(), a3 = _mm512_setzero_ps();
  for (; k + 64 <= n; k += 64) {
    if (ahead) prefetch_l2(reinterpret_cast<const char*>(w + k) + ahead, 64 * sizeof(W));
    a0 = _mm512_fmadd_ps(load16(w + k), _mm512_loadu_ps(x + k), a0);
    a1 = _mm512_fmadd_ps(load16(w + k + 16), _mm512_loadu_ps(x + k + 16), a1);
    a2 = _mm512_fmadd_ps(load16(w + k + 32), _mm512_loadu_ps(x + k + 32), a2);
    a3 = _mm512_fmadd_ps(load16(w + k + 48), _mm512_loadu_ps(x + k + 48), a3);
  }
  for (; k + 16 <= n; k += 16) a0 = _mm512_fmadd_ps(load16(w + k), _mm512_loadu_ps(x + k), a0);
  sum = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)));
#elif defined(__AVX2__) && defined(__FMA__)
  __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps(), a2 = _mm256_setzero_ps(), a3 = _mm256_setzero_ps();
  for (; k + 32 <= n; k += 32) {
    if (ahead) prefetch_l2(reinterpret_cast<const char*>(w + k) + ahead, 32 * sizeof(W));
    a0 = _mm256_fmadd_ps(load8(w + k), _mm256_loadu_ps(x + k), a0);
    a1 = _mm256_fmadd_ps(load8(w + k + 8), _mm256_loadu_ps(x + k + 8), a1);
    a2 = _mm256_fmadd_ps(load8(w + k + 16), _mm256_loadu_ps(x + k + 16), a2);
    a3 = _mm256_fmadd_ps(load8(w + k + 24), _mm256_loadu_ps(x + k + 24), a3);
  }
  for (; k + 8 <= n; k += 8) a0 = _mm256_fmadd_ps(load8(w + k), _mm256_loadu_ps(x + k), a0);
  __m256 s = _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3));
  __m128 h = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
  h = _mm_add_ps(h, _mm_movehl_ps(h, h));
  h = _mm_add_ss(h, _mm_movehdup_ps(h));
  sum = _mm_cvtss_f32(h);
#endif
  for (; k < n; ++k) sum += static_cast<float>(w[k]) * x[k];
  return sum;
}

// Two rows at once, x read once for both: for each row the same operations in the same order as dot(), so the same
// bits whichever rows a thread's block pairs.
template <typename W>
inline void dot2(const W* __restrict w0, const W* __restrict w1, const float* __restrict x, int64_t n, int64_t ahead, float* out) {
#if defined(__AVX512F__)
  int64_t k = 0;
  __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps(), a2 = _mm512_setzero_ps(), a3 = _mm512_setzero_ps();
  __m512 b0 = _mm512_setzero_ps(), b1 = _mm512_setzero_ps(), b2 = _mm512_setzero_ps(), b3 = _mm512_setzero_ps();
  for (; k + 64 <= n; k += 64) {
    if (ahead) {
      prefetch_l2(reinterpret_cast<const char*>(w0 + k) + ahead, 64 * sizeof(W));
      prefetch_l2(reinterpret_cast<const char*>(w1 + k) + ahead, 64 * sizeof(W));
    }
    const __m512 x0 = _mm512_loadu_ps(x + k), x1 = _mm512_loadu_ps(x + k + 16), x2 = _mm512_loadu_ps(x + k + 32), x3 = _mm512_loadu_ps(x + k + 48);
    a0 = _mm512_fmadd_ps(load16(w0 + k), x0, a0);
    b0 = _mm512_fmadd_ps(load16(w1 + k), x0, b0);
    a1 = _mm512_fmadd_ps(load16(w0 + k + 16), x1, a1);
    b1 = _mm512_fmadd_ps(load16(w1 + k + 16), x1, b1);
    a2 = _mm512_fmadd_ps(load16(w0 + k + 32), x2, a2);
    b2 = _mm512_fmadd_ps(load16(w1 + k + 32), x2, b2);
    a3 = _mm512_fmadd_ps(load16(w0 + k + 48), x3, a3);
    b3 = _mm512_fmadd_ps(load16(w1 + k + 48), x3, b3);
  }
  for (; k + 16 <= n; k += 16) {
    const __m512 x0 = _mm512_loadu_ps(x + k);
    a0 = _mm512_fmadd_ps(load16(w0 + k), x0, a0);
    b0 = _mm512_fmadd_ps(load16(w1 + k), x0, b0);
  }
  float s0 = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)));
  float s1 = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(b0, b1), _mm512_add_ps(b2, b3)));
  for (; k < n; ++k) {
    s0 += static_cast<float>(w0[k]) * x[k];
    s1 += static_cast<float>(w1[k]) * x[k];
  }
  out[0] = s0;
  out[1] = s1;
#else
  out[0] = dot(w0, x, n, ahead);
  out[1] = dot(w1, x, n, ahead);
#endif
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
      // fp32 rows two at a time where prefetching (on an AMX Xeon, 2026-12-05: GPT-2 small's fp32 weights 4-8% faster;
      // its bf16 and int8 ones 0-3% slower, so one at a time); "native" keeps one at a time: each CPU times both.
      for (float d[2]; ahead && o + 2 <= end; o += 2) {
        dot2(w + o * in, w + (o + 1) * in, x, in, ahead, d);
        write(o, d[0]);
        write(o + 1, d[1]);
      }
    }
    for (; o < end; ++o) write(o, dot(w + o * in, x, in, ahead));
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

}  // namespace

TORCH_LIBRARY(aiayn_native, m) {
  m.def("gemv(Tensor x, Tensor weight, Tensor? scale, Tensor? bias, int prefetch=0) -> Tensor");
}

TORCH_LIBRARY_IMPL(aiayn_native, CPU, m) {
  m.impl("gemv", &gemv);
}
