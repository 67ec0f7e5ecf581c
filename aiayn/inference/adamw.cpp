// Adam and AdamW for fp32 master weights trained through bf16 copies (aiayn/training/master_weights.py): each element's
// update in one pass that reads its gradient as the backward left it (bf16 on the copy, or fp32 where micro-batches
// were accumulated), steps the fp32 master and its two moments, and writes the bf16 copy the next forward computes with.
//
// Through torch's optimizer the same step took four passes over the weights: the bf16 gradients widened into fp32 ones,
// fused AdamW (which needs gradients of its parameters' dtype), and the masters cast into the copies; the fp32 gradients
// also held 4 bytes a parameter. The arithmetic is torch.optim.AdamW's (Loshchilov and Hutter's decoupled decay; Adam's
// L2 term without it), in fp32, elementwise, so each parameter's result does not depend on the threads.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "simd.h"

namespace {

using namespace aiayn_simd;

// The step's numbers, the same for every element of a group (torch.optim.adam's names).
struct Hyper {
  float scale;       // the gradient's factor: gradient clipping's coefficient (1 without)
  float decay;       // 1 - lr * weight_decay (AdamW), or 1
  float l2;          // weight_decay added to the gradient (Adam), or 0
  float beta1_rest;  // 1 - beta1: exp_avg moves this far towards the gradient (a lerp)
  float beta2, beta2_rest;
  float step_size;   // lr / (1 - beta1^step)
  float correction2; // sqrt(1 - beta2^step)
  float eps;
};

// One element: the update of torch.optim.AdamW's single-tensor step, written out.
inline float update(float p, float g, float& m, float& v, const Hyper& h) {
  g = g * h.scale + h.l2 * p;
  p = p * h.decay;
  m = m + h.beta1_rest * (g - m);
  v = v * h.beta2 + (h.beta2_rest * g) * g;
  return p - h.step_size * (m / (std::sqrt(v) / h.correction2 + h.eps));
}

// Elements [begin, end) of one parameter: p, m, v fp32; g fp32 or bf16; copy bf16 or null.
template <typename G>
void update_range(float* p, const G* g, float* m, float* v, at::BFloat16* copy, int64_t begin, int64_t end, const Hyper& h) {
  int64_t i = begin;
#if defined(__AVX512F__)
  const __m512 scale = _mm512_set1_ps(h.scale), decay = _mm512_set1_ps(h.decay), l2 = _mm512_set1_ps(h.l2);
  const __m512 b1 = _mm512_set1_ps(h.beta1_rest), b2 = _mm512_set1_ps(h.beta2), b2r = _mm512_set1_ps(h.beta2_rest);
  const __m512 step = _mm512_set1_ps(h.step_size), c2 = _mm512_set1_ps(h.correction2), eps = _mm512_set1_ps(h.eps);
  for (; i + 16 <= end; i += 16) {  // the scalar update's operations, in its order, sixteen lanes at a time
    __m512 pv = _mm512_loadu_ps(p + i), mv = _mm512_loadu_ps(m + i), vv = _mm512_loadu_ps(v + i);
    const __m512 gv = _mm512_add_ps(_mm512_mul_ps(load16(g + i), scale), _mm512_mul_ps(l2, pv));
    pv = _mm512_mul_ps(pv, decay);
    mv = _mm512_add_ps(mv, _mm512_mul_ps(b1, _mm512_sub_ps(gv, mv)));
    vv = _mm512_add_ps(_mm512_mul_ps(vv, b2), _mm512_mul_ps(_mm512_mul_ps(b2r, gv), gv));
    const __m512 denom = _mm512_add_ps(_mm512_div_ps(_mm512_sqrt_ps(vv), c2), eps);
    pv = _mm512_sub_ps(pv, _mm512_mul_ps(step, _mm512_div_ps(mv, denom)));
    _mm512_storeu_ps(p + i, pv);
    _mm512_storeu_ps(m + i, mv);
    _mm512_storeu_ps(v + i, vv);
    if (copy != nullptr) store16(copy + i, pv);
  }
#elif defined(__AVX2__) && defined(__FMA__)
  const __m256 scale = _mm256_set1_ps(h.scale), decay = _mm256_set1_ps(h.decay), l2 = _mm256_set1_ps(h.l2);
  const __m256 b1 = _mm256_set1_ps(h.beta1_rest), b2 = _mm256_set1_ps(h.beta2), b2r = _mm256_set1_ps(h.beta2_rest);
  const __m256 step = _mm256_set1_ps(h.step_size), c2 = _mm256_set1_ps(h.correction2), eps = _mm256_set1_ps(h.eps);
  for (; i + 8 <= end; i += 8) {  // the same, eight lanes at a time
    __m256 pv = _mm256_loadu_ps(p + i), mv = _mm256_loadu_ps(m + i), vv = _mm256_loadu_ps(v + i);
    const __m256 gv = _mm256_add_ps(_mm256_mul_ps(load8(g + i), scale), _mm256_mul_ps(l2, pv));
    pv = _mm256_mul_ps(pv, decay);
    mv = _mm256_add_ps(mv, _mm256_mul_ps(b1, _mm256_sub_ps(gv, mv)));
    vv = _mm256_add_ps(_mm256_mul_ps(vv, b2), _mm256_mul_ps(_mm256_mul_ps(b2r, gv), gv));
    const __m256 denom = _mm256_add_ps(_mm256_div_ps(_mm256_sqrt_ps(vv), c2), eps);
    pv = _mm256_sub_ps(pv, _mm256_mul_ps(step, _mm256_div_ps(mv, denom)));
    _mm256_storeu_ps(p + i, pv);
    _mm256_storeu_ps(m + i, mv);
    _mm256_storeu_ps(v + i, vv);
    if (copy != nullptr) store8(copy + i, pv);
  }
#endif
  for (; i < end; ++i) {
    p[i] = update(p[i], static_cast<float>(g[i]), m[i], v[i], h);
    if (copy != nullptr) copy[i] = static_cast<at::BFloat16>(p[i]);
  }
}

void check_same(const at::Tensor& t, const at::Tensor& param, at::ScalarType dtype, const char* what, size_t index) {
  TORCH_CHECK(t.device().is_cpu() && t.is_contiguous() && t.scalar_type() == dtype && t.numel() == param.numel(),
              "aiayn_native::adamw_step: ", what, " ", index, " must be a contiguous ", dtype, " CPU tensor of ", param.numel(),
              " elements, got ", t.scalar_type(), " ", t.sizes(), t.is_contiguous() ? "" : " (not contiguous)");
}

// One optimizer step over a parameter group: params (fp32 masters), exp_avgs and exp_avg_sqs (fp32, Adam's moments),
// grads (fp32 or bf16), copies (bf16, or an empty list: none written), all updated in place; `step` is the step's
// number after this update (1 at the first), as torch counts it.
void adamw_step(at::TensorList params, at::TensorList grads, at::TensorList exp_avgs, at::TensorList exp_avg_sqs,
                at::TensorList copies, double lr, double beta1, double beta2, double weight_decay, double eps, double step,
                double grad_scale, bool decoupled) {
  const size_t n = params.size();
  TORCH_CHECK(grads.size() == n && exp_avgs.size() == n && exp_avg_sqs.size() == n && (copies.empty() || copies.size() == n),
              "aiayn_native::adamw_step: ", n, " parameters take as many gradients, exp_avgs and exp_avg_sqs (and copies, or none), "
              "got ", grads.size(), ", ", exp_avgs.size(), ", ", exp_avg_sqs.size(), " and ", copies.size());
  TORCH_CHECK(step >= 1 && lr >= 0 && beta1 >= 0 && beta1 < 1 && beta2 >= 0 && beta2 < 1 && eps >= 0,
              "aiayn_native::adamw_step: step >= 1, lr >= 0, betas in [0, 1) and eps >= 0, got step ", step, ", lr ", lr,
              ", betas (", beta1, ", ", beta2, "), eps ", eps);
  const Hyper h{static_cast<float>(grad_scale),
                static_cast<float>(decoupled ? 1.0 - lr * weight_decay : 1.0),
                static_cast<float>(decoupled ? 0.0 : weight_decay),
                static_cast<float>(1.0 - beta1),
                static_cast<float>(beta2),
                static_cast<float>(1.0 - beta2),
                static_cast<float>(lr / (1.0 - std::pow(beta1, step))),
                static_cast<float>(std::sqrt(1.0 - std::pow(beta2, step))),
                static_cast<float>(eps)};
  for (size_t t = 0; t < n; ++t) {
    const at::Tensor& param = params[t];
    TORCH_CHECK(param.device().is_cpu() && param.is_contiguous() && param.scalar_type() == at::kFloat,
                "aiayn_native::adamw_step: parameter ", t, " must be a contiguous float32 CPU tensor, got ", param.scalar_type());
    const at::ScalarType gtype = grads[t].scalar_type();
    TORCH_CHECK(gtype == at::kFloat || gtype == at::kBFloat16, "aiayn_native::adamw_step: gradient ", t,
                " must be float32 or bfloat16, got ", gtype);
    check_same(grads[t], param, gtype, "gradient", t);
    check_same(exp_avgs[t], param, at::kFloat, "exp_avg", t);
    check_same(exp_avg_sqs[t], param, at::kFloat, "exp_avg_sq", t);
    if (!copies.empty()) check_same(copies[t], param, at::kBFloat16, "copy", t);
    float* p = param.data_ptr<float>();
    float* m = exp_avgs[t].data_ptr<float>();
    float* v = exp_avg_sqs[t].data_ptr<float>();
    at::BFloat16* copy = copies.empty() ? nullptr : copies[t].data_ptr<at::BFloat16>();
    at::parallel_for(0, param.numel(), 1 << 14, [&](int64_t begin, int64_t end) {
      if (gtype == at::kFloat) {
        update_range(p, grads[t].const_data_ptr<float>(), m, v, copy, begin, end, h);
      } else {
        update_range(p, grads[t].const_data_ptr<at::BFloat16>(), m, v, copy, begin, end, h);
      }
    });
  }
}

// Sum of x^2 over [begin, end), in fp32 lanes.
template <typename T>
float squares(const T* x, int64_t begin, int64_t end) {
  float total = 0.f;
  int64_t i = begin;
#if defined(__AVX512F__)
  __m512 acc = _mm512_setzero_ps();
  for (; i + 16 <= end; i += 16) {
    const __m512 xv = load16(x + i);
    acc = _mm512_fmadd_ps(xv, xv, acc);
  }
  total = _mm512_reduce_add_ps(acc);
#elif defined(__AVX2__) && defined(__FMA__)
  __m256 acc = _mm256_setzero_ps();
  for (; i + 8 <= end; i += 8) {
    const __m256 xv = load8(x + i);
    acc = _mm256_fmadd_ps(xv, xv, acc);
  }
  float lanes[8];
  _mm256_storeu_ps(lanes, acc);
  for (const float lane : lanes) total += lane;
#endif
  for (; i < end; ++i) total += static_cast<float>(x[i]) * static_cast<float>(x[i]);
  return total;
}

// The 2-norm of all the tensors' elements together (fp32 or bf16, each contiguous): gradient clipping's norm over bf16
// gradients without widening them (torch's norms over bf16 with an fp32 result took 2.4x the time of its bf16 ones).
// Blocks of 2^16 elements are summed in fp32 and the blocks in fp64, in order: the same bits whatever the threads.
double norm_of_all(at::TensorList tensors) {
  constexpr int64_t kBlock = int64_t{1} << 16;
  double total = 0.0;
  for (size_t t = 0; t < tensors.size(); ++t) {
    const at::Tensor& x = tensors[t];
    TORCH_CHECK(x.device().is_cpu() && x.is_contiguous() && (x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16),
                "aiayn_native::norm_of_all: tensor ", t, " must be a contiguous float32 or bfloat16 CPU tensor, got ", x.scalar_type());
    const int64_t n = x.numel(), blocks = (n + kBlock - 1) / kBlock;
    std::vector<float> partial(blocks);
    at::parallel_for(0, blocks, 1, [&](int64_t begin, int64_t end) {
      for (int64_t b = begin; b < end; ++b) {
        const int64_t lo = b * kBlock, hi = std::min(n, lo + kBlock);
        partial[b] = x.scalar_type() == at::kFloat ? squares(x.const_data_ptr<float>(), lo, hi)
                                                   : squares(x.const_data_ptr<at::BFloat16>(), lo, hi);
      }
    });
    for (const float p : partial) total += p;
  }
  return std::sqrt(total);
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(aiayn_native, m) {
  m.def("norm_of_all(Tensor[] tensors) -> float");
  m.def("adamw_step(Tensor(a!)[] params, Tensor[] grads, Tensor(b!)[] exp_avgs, Tensor(c!)[] exp_avg_sqs, Tensor(d!)[] copies, "
        "float lr, float beta1, float beta2, float weight_decay, float eps, float step, float grad_scale, bool decoupled) -> ()");
}

TORCH_LIBRARY_IMPL(aiayn_native, CPU, m) {
  m.impl("adamw_step", &adamw_step);
  m.impl("norm_of_all", &norm_of_all);
}
