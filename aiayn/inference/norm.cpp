// LayerNorm and RMSNorm over the last dimension, for inference: the norm modules a model is given at load
// (aiayn/nn/norm.py's NativeLayerNorm and NativeRMSNorm) and the C++ decoding step (decode_step.cpp) call this one
// kernel, so the step's logits stay the eager ones bit for bit. torch's composite rms_norm made 5 calls a norm and took
// 38 us a call in decoding a small model, 45% of its step (a Zen 4 EPYC, 2026-12-07; docs/benchmarks.md).

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <cmath>
#include <optional>

namespace {

constexpr int64_t kLanes = 16;  // independent partial sums: the loops vectorise (each lane its own order) at any width

// Sum of f(x[i]) over a row in fp32, lane by lane, then the lanes in order: the same bits for a row wherever it is.
template <typename T, typename F>
float lane_sum(const T* x, int64_t d, F f) {
  float acc[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= d; i += kLanes)
    for (int64_t j = 0; j < kLanes; ++j) acc[j] += f(static_cast<float>(x[i + j]));
  for (int64_t j = 0; i < d; ++i, ++j) acc[j] += f(static_cast<float>(x[i]));
  float total = 0.f;
  for (int64_t j = 0; j < kLanes; ++j) total += acc[j];
  return total;
}

// y = (x - mean) * rstd * weight + bias (LayerNorm; rms: mean 0, the mean of squares, no bias), each row of d in fp32;
// rows split over torch's threads in blocks of at least 16 Ki elements (a decoding step's row stays on one thread).
template <typename T>
void norm_rows(const T* x, const T* weight, const T* bias, T* y, int64_t rows, int64_t d, float eps, bool rms) {
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 14) / std::max<int64_t>(d, 1));
  at::parallel_for(0, rows, grain, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const T* xr = x + r * d;
      T* yr = y + r * d;
      const float mean = rms ? 0.f : lane_sum(xr, d, [](float v) { return v; }) / static_cast<float>(d);
      const float var = lane_sum(xr, d, [mean](float v) { return (v - mean) * (v - mean); }) / static_cast<float>(d);
      const float rstd = 1.f / std::sqrt(var + eps);
      for (int64_t i = 0; i < d; ++i) {
        float v = (static_cast<float>(xr[i]) - mean) * rstd;
        if (weight) v = v * static_cast<float>(weight[i]);
        if (bias) v = v + static_cast<float>(bias[i]);
        yr[i] = static_cast<T>(v);  // bf16: rounded to nearest even, as torch rounds
      }
    }
  });
}

// norm(x, weight, bias, eps, rms): x an fp32 or bf16 CPU tensor normalised over its last dimension; weight and bias
// (d,) of x's dtype, or None.
at::Tensor norm(const at::Tensor& x, const std::optional<at::Tensor>& weight, const std::optional<at::Tensor>& bias, double eps,
                bool rms) {
  TORCH_CHECK(x.device().is_cpu() && (x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16),
              "aiayn_native::norm: x must be a float32 or bfloat16 CPU tensor, got ", x.scalar_type(), " on ", x.device());
  TORCH_CHECK(x.dim() >= 1, "aiayn_native::norm: x must have a last dimension");
  const int64_t d = x.size(-1);
  for (const auto* p : {&weight, &bias}) {
    TORCH_CHECK(!p->has_value() || ((*p)->dim() == 1 && (*p)->size(0) == d && (*p)->scalar_type() == x.scalar_type() && (*p)->device().is_cpu()),
                "aiayn_native::norm: weight and bias must be (", d, ",) CPU tensors of x's dtype ", x.scalar_type());
  }
  TORCH_CHECK(!(rms && bias.has_value()), "aiayn_native::norm: RMSNorm has no bias");
  const at::Tensor xc = x.contiguous();
  const at::Tensor wc = weight ? weight->contiguous() : at::Tensor(), bc = bias ? bias->contiguous() : at::Tensor();
  at::Tensor y = at::empty_like(xc);
  const int64_t rows = d ? xc.numel() / d : 0;
  if (rows == 0) return y;
  auto run = [&](auto tag) {
    using T = decltype(tag);
    norm_rows(xc.const_data_ptr<T>(), weight ? wc.const_data_ptr<T>() : nullptr, bias ? bc.const_data_ptr<T>() : nullptr,
              y.mutable_data_ptr<T>(), rows, d, static_cast<float>(eps), rms);
  };
  if (x.scalar_type() == at::kFloat) run(float{});
  else run(at::BFloat16{});
  return y;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(aiayn_native, m) {
  m.def("norm(Tensor x, Tensor? weight, Tensor? bias, float eps, bool rms) -> Tensor");
}

TORCH_LIBRARY_IMPL(aiayn_native, CPU, m) { m.impl("norm", &norm); }
