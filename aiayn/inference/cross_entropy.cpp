// The training loss over the vocabulary, row by row (aiayn/training/losses.py calls it where it was timed faster than
// torch's operators over chunks of rows, aiayn/inference/kernel_choice.py): each row of logits is read twice for its
// log-sum-exp and never widened into a tensor, and its gradient is written in one pass, in the logits' dtype.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <tuple>

#include "simd.h"

namespace {

using namespace aiayn_simd;

constexpr int64_t kGrainElements = 1 << 15;  // logits a thread takes at least (rows are never split)

// The rows' threads: whole rows, at least kGrainElements logits each.
int64_t row_grain(int64_t vocab) { return std::max<int64_t>(1, kGrainElements / std::max<int64_t>(vocab, 1)); }

// max_j x_j and sum_j x_j of one row, widened to fp32.
template <typename T>
void row_max_sum(const T* x, int64_t v, float& max_out, float& sum_out) {
  int64_t j = 0;
  float m = -INFINITY, s = 0.f;
#if defined(__AVX512F__)
  __m512 mv = _mm512_set1_ps(-INFINITY), sv = _mm512_setzero_ps();
  for (; j + 16 <= v; j += 16) {
    const __m512 xv = load16(x + j);
    mv = _mm512_max_ps(mv, xv);
    sv = _mm512_add_ps(sv, xv);
  }
  m = _mm512_reduce_max_ps(mv);
  s = _mm512_reduce_add_ps(sv);
#endif
  for (; j < v; ++j) {
    const float xf = static_cast<float>(x[j]);
    m = std::max(m, xf);
    s += xf;
  }
  max_out = m;
  sum_out = s;
}

// sum_j exp(x_j - m) of one row.
template <typename T>
float row_sum_exp(const T* x, int64_t v, float m) {
  int64_t j = 0;
  float s = 0.f;
#if defined(__AVX512F__)
  const __m512 mv = _mm512_set1_ps(m);
  __m512 sv = _mm512_setzero_ps();
  for (; j + 16 <= v; j += 16) sv = _mm512_add_ps(sv, exp16(_mm512_sub_ps(load16(x + j), mv)));
  s = _mm512_reduce_add_ps(sv);
#endif
  for (; j < v; ++j) s += std::exp(static_cast<float>(x[j]) - m);
  return s;
}

// Each row's loss (1 - eps) (lse - x_y) + eps (lse - mean_j x_j), 0 where the target is ignore_index, and its lse.
template <typename T>
void forward_rows(const T* logits, const int64_t* targets, int64_t n, int64_t v, int64_t ignore_index, float eps,
                  float* loss, float* lse) {
  at::parallel_for(0, n, row_grain(v), [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const T* x = logits + i * v;
      float m, total;
      row_max_sum(x, v, m, total);
      const float l = m + std::log(row_sum_exp(x, v, m));
      lse[i] = l;
      const int64_t y = targets[i];
      loss[i] = y == ignore_index ? 0.f : l - (1.f - eps) * static_cast<float>(x[y]) - (eps != 0.f ? eps * (total / v) : 0.f);
    }
  });
}

// grad_i = scale_i (softmax(x_i) - eps / V - (1 - eps) onehot(y_i)), scale_i = grad, or 0 where y_i is ignore_index.
template <typename T>
void backward_rows(const T* logits, const int64_t* targets, const float* lse, int64_t n, int64_t v, int64_t ignore_index,
                   float eps, float grad, T* out) {
  const float spread = eps / v;
  at::parallel_for(0, n, row_grain(v), [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const T* x = logits + i * v;
      T* g = out + i * v;
      const int64_t y = targets[i];
      const float scale = y == ignore_index ? 0.f : grad;
      int64_t j = 0;
#if defined(__AVX512F__)
      const __m512 lv = _mm512_set1_ps(lse[i]), sp = _mm512_set1_ps(spread), sc = _mm512_set1_ps(scale);
      for (; j + 16 <= v; j += 16) {
        const __m512 p = _mm512_sub_ps(exp16(_mm512_sub_ps(load16(x + j), lv)), sp);
        store16(g + j, _mm512_mul_ps(p, sc));
      }
#endif
      for (; j < v; ++j) g[j] = static_cast<T>((std::exp(static_cast<float>(x[j]) - lse[i]) - spread) * scale);
      if (scale != 0.f) {  // the target's class, again from its logit (the same value as above, less 1 - eps)
        const float p = std::exp(static_cast<float>(x[y]) - lse[i]);
        g[y] = static_cast<T>((p - spread - (1.f - eps)) * scale);
      }
    }
  });
}

void check_inputs(const at::Tensor& logits, const at::Tensor& targets, int64_t ignore_index, const char* name) {
  TORCH_CHECK(logits.device().is_cpu() && logits.dim() == 2 && (logits.scalar_type() == at::kFloat || logits.scalar_type() == at::kBFloat16),
              name, ": logits must be a 2-D float32 or bfloat16 CPU tensor, got ", logits.scalar_type(), " of ", logits.sizes());
  TORCH_CHECK(targets.scalar_type() == at::kLong && targets.dim() == 1 && targets.size(0) == logits.size(0),
              name, ": targets must be int64 of shape (", logits.size(0), "), got ", targets.scalar_type(), " of ", targets.sizes());
  const int64_t v = logits.size(1);
  const at::Tensor t = targets.contiguous();
  const int64_t* y = t.const_data_ptr<int64_t>();
  for (int64_t i = 0; i < t.numel(); ++i) {
    TORCH_CHECK(y[i] == ignore_index || (y[i] >= 0 && y[i] < v), name, ": target ", y[i], " is out of bounds for ", v, " classes");
  }
}

// (per-row loss, per-row log-sum-exp), both fp32 of shape (N,).
std::tuple<at::Tensor, at::Tensor> cross_entropy_rows(const at::Tensor& logits, const at::Tensor& targets, int64_t ignore_index,
                                                      double smoothing) {
  check_inputs(logits, targets, ignore_index, "aiayn_native::cross_entropy_rows");
  const at::Tensor x = logits.contiguous(), t = targets.contiguous();
  const int64_t n = x.size(0), v = x.size(1);
  at::Tensor loss = at::empty({n}, x.options().dtype(at::kFloat)), lse = at::empty({n}, x.options().dtype(at::kFloat));
  if (x.scalar_type() == at::kFloat) {
    forward_rows(x.const_data_ptr<float>(), t.const_data_ptr<int64_t>(), n, v, ignore_index, static_cast<float>(smoothing),
                 loss.mutable_data_ptr<float>(), lse.mutable_data_ptr<float>());
  } else {
    forward_rows(x.const_data_ptr<at::BFloat16>(), t.const_data_ptr<int64_t>(), n, v, ignore_index, static_cast<float>(smoothing),
                 loss.mutable_data_ptr<float>(), lse.mutable_data_ptr<float>());
  }
  return {loss, lse};
}

// The gradient of grad * sum_i loss_i with respect to the logits, in their dtype.
at::Tensor cross_entropy_backward(const at::Tensor& grad, const at::Tensor& logits, const at::Tensor& targets, const at::Tensor& lse,
                                  int64_t ignore_index, double smoothing) {
  check_inputs(logits, targets, ignore_index, "aiayn_native::cross_entropy_backward");
  TORCH_CHECK(grad.numel() == 1, "aiayn_native::cross_entropy_backward: grad must hold one value, got ", grad.sizes());
  TORCH_CHECK(lse.scalar_type() == at::kFloat && lse.numel() == logits.size(0),
              "aiayn_native::cross_entropy_backward: lse must be float32 of one value a row");
  const at::Tensor x = logits.contiguous(), t = targets.contiguous(), l = lse.contiguous();
  const int64_t n = x.size(0), v = x.size(1);
  const float g = grad.item<float>();
  at::Tensor out = at::empty_like(x);
  if (x.scalar_type() == at::kFloat) {
    backward_rows(x.const_data_ptr<float>(), t.const_data_ptr<int64_t>(), l.const_data_ptr<float>(), n, v, ignore_index,
                  static_cast<float>(smoothing), g, out.mutable_data_ptr<float>());
  } else {
    backward_rows(x.const_data_ptr<at::BFloat16>(), t.const_data_ptr<int64_t>(), l.const_data_ptr<float>(), n, v, ignore_index,
                  static_cast<float>(smoothing), g, out.mutable_data_ptr<at::BFloat16>());
  }
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(aiayn_native, m) {
  m.def("cross_entropy_rows(Tensor logits, Tensor targets, int ignore_index, float smoothing) -> (Tensor, Tensor)");
  m.def("cross_entropy_backward(Tensor grad, Tensor logits, Tensor targets, Tensor lse, int ignore_index, float smoothing) -> Tensor");
}

TORCH_LIBRARY_IMPL(aiayn_native, CPU, m) {
  m.impl("cross_entropy_rows", &cross_entropy_rows);
  m.impl("cross_entropy_backward", &cross_entropy_backward);
}
