// GPT-2's activation and its gradient for training and inference on the CPU (aiayn/nn/feedforward.py calls them where
// they were timed faster than torch's, aiayn/inference/kernel_choice.py); the function itself is in gelu_tanh.h.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include "gelu_tanh.h"

namespace {

// y = gelu(x), or (with g) y = g * gelu'(x), for n elements; torch's threads take blocks of them (gelu_tanh.h: each
// element's bits the same whatever the blocks).
template <typename T>
void gelu_tanh_rows(const T* x, const T* g, T* y, int64_t n) {
  at::parallel_for(0, n, 1 << 14, [&](int64_t begin, int64_t end) {
    aiayn_gelu::gelu_tanh_span(x + begin, g ? g + begin : nullptr, y + begin, end - begin);
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

TORCH_LIBRARY_FRAGMENT(aiayn_native, m) {
  m.def("gelu_tanh(Tensor x) -> Tensor");
  m.def("gelu_tanh_backward(Tensor grad, Tensor x) -> Tensor");
}

TORCH_LIBRARY_IMPL(aiayn_native, CPU, m) {
  m.impl("gelu_tanh", &gelu_tanh);
  m.impl("gelu_tanh_backward", &gelu_tanh_backward);
}
