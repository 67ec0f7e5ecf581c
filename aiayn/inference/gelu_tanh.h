// GPT-2's activation, GELU with tanh's approximation, for one span of elements: shared by the operator (gelu_tanh.cpp)
// and the matrix-vector product's epilogue (gemv.cpp), which applies it to the outputs as they are written, so the
// C++ decoding step's hidden layer has the bits of the operator's (aiayn/inference/decode_step.cpp).
#pragma once

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>

#include "simd.h"

namespace aiayn_gelu {

using namespace aiayn_simd;

// 0.5 x (1 + tanh u) with u = sqrt(2/pi) (x + 0.044715 x^3), written as x * sigmoid(2u) (the same function); its
// derivative sigmoid(2u) + x sigmoid(2u) (1 - sigmoid(2u)) 2 sqrt(2/pi) (1 + 3 * 0.044715 x^2); in fp32 whatever the
// tensors' dtype. torch's CPU kernel for it took 4.4x its exact-erf GELU's time (a (12, 64, 512) fp32 tensor, AMX Xeon,
// 2026-12-05).
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

// Up to 16 elements into a vector (the rest zero) and back: a span's last few take the same vector formula as the
// others, so an element's bits never depend on where a span starts or ends (the lanes are computed apart).
template <typename T>
inline __m512 load_part(const T* p, int64_t n) {
  T part[16] = {};
  std::copy(p, p + n, part);
  return load16(part);
}
template <typename T>
inline void store_part(T* p, __m512 v, int64_t n) {
  T part[16];
  store16(part, v);
  std::copy(part, part + n, p);
}
#endif

// y[i] = gelu(x[i]), or (with g) y[i] = g[i] * gelu'(x[i]), for i < n (y may be x: in place).
template <typename T>
inline void gelu_tanh_span(const T* x, const T* g, T* y, int64_t n) {
  int64_t i = 0;
#if defined(__AVX512F__)
  for (; i < n; i += 16) {
    const int64_t k = std::min<int64_t>(16, n - i);
    const __m512 xv = k == 16 ? load16(x + i) : load_part(x + i, k);
    const __m512 sv = gelu_sigmoid16(xv);
    __m512 yv;
    if (g == nullptr) {
      yv = _mm512_mul_ps(xv, sv);
    } else {
      const __m512 inner = _mm512_mul_ps(_mm512_set1_ps(2.f * kGeluC), _mm512_fmadd_ps(_mm512_set1_ps(3.f * kGeluA), _mm512_mul_ps(xv, xv), _mm512_set1_ps(1.f)));
      const __m512 ds = _mm512_mul_ps(_mm512_mul_ps(sv, _mm512_sub_ps(_mm512_set1_ps(1.f), sv)), inner);
      const __m512 gv = k == 16 ? load16(g + i) : load_part(g + i, k);
      yv = _mm512_mul_ps(gv, _mm512_fmadd_ps(xv, ds, sv));
    }
    if (k == 16) {
      store16(y + i, yv);
    } else {
      store_part(y + i, yv, k);
    }
  }
#endif
  for (; i < n; ++i) {
    const float xf = static_cast<float>(x[i]), sf = gelu_sigmoid(xf);
    if (g == nullptr) {
      y[i] = static_cast<T>(xf * sf);
    } else {
      const float inner = 2.f * kGeluC * (1.f + 3.f * kGeluA * xf * xf);
      y[i] = static_cast<T>(static_cast<float>(g[i]) * (sf + xf * sf * (1.f - sf) * inner));
    }
  }
}

}  // namespace aiayn_gelu
