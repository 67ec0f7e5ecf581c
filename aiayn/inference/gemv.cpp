// One row through a Linear layer, y = W x + b: the matrix-vector product of batch-1 decoding (aiayn/inference/gemv.py),
// over fp32, bf16 or int8 weights (int8: times a scale per row) or 4-bit codes in groups (gemv_int4.h); also a few rows
// (a small batch), each weight row read once for all of them.
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
#include <ATen/MemoryOverlap.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <type_traits>
#include <vector>

#include "gelu_tanh.h"
#include "gemv_int4.h"
#include "simd.h"

namespace {

using namespace aiayn_simd;

// Inputs a weight row is dotted with at once (the rest of a call's inputs in further groups, the row then read from
// L1): four partial sums each take 16 of AVX-512's 32 vector registers at four, 8 of AVX2's 16 at two.
#if defined(__AVX512F__)
constexpr int64_t kGroup = 4;
#else
constexpr int64_t kGroup = 2;
#endif

// One weight row's dot products with M inputs: fp32 inputs through dots(); bf16 weights with bf16 inputs through
// AVX512-BF16's products of pairs where the CPU has them (gemv() takes that path for widths that are multiples of 32).
template <int M, typename W>
inline void row_dots(const W* w, const float* x, int64_t n, int64_t ahead, float* d) {
  dots<1, M>(w, x, n, ahead, d);
}
#if defined(__AVX512BF16__)
template <int M>
inline void row_dots(const at::BFloat16* w, const at::BFloat16* x, int64_t n, int64_t ahead, float* d) {
  dots_bf16<M>(w, x, n, ahead, d);
}
#endif

// What a call does with its outputs as it writes them: nothing more (gemv), add them into y (gemv_add_: a residual
// connection), or pass them through an activation (gemv_activation: a feed-forward's hidden layer).
enum class Epilogue { kNone, kAdd, kGeluTanh, kRelu, kRelu2 };

// One output: the product's value rounded to y's dtype (bf16: to nearest even), or, adding, that rounded value added to
// what y holds, as `y.add_(product)` adds it (in fp32, then rounded).
template <typename Y>
inline void put(Y* y, float value, Epilogue epilogue) {
  const Y v = static_cast<Y>(value);
  *y = epilogue == Epilogue::kAdd ? static_cast<Y>(static_cast<float>(*y) + static_cast<float>(v)) : v;
}

// The outputs [begin, end) of each of m rows, written: through the epilogue's activation, after rounding, as the
// operator after the product reads them, with its bits: GPT-2's GELU by gelu_tanh.h (the operator's code, the same bits
// whatever the span), ReLU as `relu_` (NaN kept), ReLU squared as `relu_().mul_()` (the square of the rounded ReLU,
// rounded).
template <typename Y>
inline void finish_block(Y* y, int64_t m_rows, int64_t out, int64_t begin, int64_t end, Epilogue epilogue) {
  if (epilogue == Epilogue::kNone || epilogue == Epilogue::kAdd) return;
  for (int64_t m = 0; m < m_rows; ++m) {
    Y* row = y + m * out + begin;
    if (epilogue == Epilogue::kGeluTanh) {
      aiayn_gelu::gelu_tanh_span<Y>(row, nullptr, row, end - begin);
      continue;
    }
    for (int64_t i = 0; i < end - begin; ++i) {
      const float v = static_cast<float>(row[i]), r = v < 0.f ? 0.f : v;
      row[i] = static_cast<Y>(epilogue == Epilogue::kRelu ? r : r * r);
    }
  }
}

// y (m_rows, out) = x (m_rows, in) W^T (or y += it), each output feature's weight row read from memory once for all the
// inputs.
template <typename W, typename X, typename B, typename Y>
void rows(const W* w, const X* x, int64_t m_rows, const float* scale, const B* bias, Y* y, int64_t out, int64_t in,
          int64_t ahead, Epilogue epilogue) {
  // At least 32 Ki multiply-adds a block: a small layer runs on one thread rather than pay for waking the others.
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 15) / std::max<int64_t>(in * m_rows, 1));
  at::parallel_for(0, out, grain, [&](int64_t begin, int64_t end) {
    auto write = [&](int64_t m, int64_t o, float d) {
      put(y + m * out + o, (scale ? scale[o] * d : d) + (bias ? static_cast<float>(bias[o]) : 0.f), epilogue);
    };
    int64_t o = begin;
    if (m_rows > 1) {  // a few inputs (a small batch, speculative checks): each row once for a group of them
      for (float d[kGroup]; o < end; ++o) {
        const W* row = w + o * in;
        for (int64_t m0 = 0; m0 < m_rows; m0 += kGroup) {
          const int64_t g = std::min(kGroup, m_rows - m0), a = m0 ? 0 : ahead;  // later groups read the row from L1
          const X* xg = x + m0 * in;
          switch (g) {
#if defined(__AVX512F__)
            case 4: row_dots<4>(row, xg, in, a, d); break;
            case 3: row_dots<3>(row, xg, in, a, d); break;
#endif
            case 2: row_dots<2>(row, xg, in, a, d); break;
            default: row_dots<1>(row, xg, in, a, d); break;
          }
          for (int64_t i = 0; i < g; ++i) write(m0 + i, o, d[i]);
        }
      }
      finish_block(y, m_rows, out, begin, end, epilogue);
      return;
    }
    if constexpr (std::is_same_v<W, float>) {
      // fp32 rows two at a time where prefetching (in throw-away sweeps on an AMX Xeon, 2026-12-05, faster for GPT-2
      // small's fp32 weights, slower for its bf16 and int8 ones, so one at a time); "native" keeps one at a time: each
      // CPU times both.
      for (float d[2]; ahead && o + 2 <= end; o += 2) {
        dots<2>(w + o * in, x, in, ahead, d);
        write(0, o, d[0]);
        write(0, o + 1, d[1]);
      }
    }
    for (float d; o < end; ++o) {
      row_dots<1>(w + o * in, x, in, ahead, &d);
      write(0, o, d);
    }
    finish_block(y, 1, out, begin, end, epilogue);
  });
}

// rows() for 4-bit codes (out, in / 2) with their bf16 scales and least values (out, 2, in / group) (gemv_int4.h): x
// prepared once, then each thread's block of rows computed in fp32 and written with the bias.
template <typename B, typename Y>
void int4_rows(const uint8_t* codes, const at::BFloat16* scale_least, const float* x, int64_t m_rows, const B* bias, Y* y,
               int64_t out, int64_t in, int64_t group, int64_t ahead, Epilogue epilogue) {
  const aiayn_int4::Inputs prepared = aiayn_int4::prepare(x, m_rows, in, group);
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 15) / std::max<int64_t>(in * m_rows, 1));
  at::parallel_for(0, out, grain, [&](int64_t begin, int64_t end) {
    std::vector<float> d((end - begin) * m_rows);
    aiayn_int4::rows(codes, scale_least, prepared, begin, end, ahead, d.data());
    for (int64_t o = begin; o < end; ++o) {
      for (int64_t m = 0; m < m_rows; ++m) {
        put(y + m * out + o, d[(o - begin) * m_rows + m] + (bias ? static_cast<float>(bias[o]) : 0.f), epilogue);
      }
    }
    finish_block(y, m_rows, out, begin, end, epilogue);
  });
}

// The typed pointers of one call: weight fp32, bf16, int8 or 4-bit codes (uint8, with `scale_least`) with fp32 rows x,
// or bf16 weights with bf16 rows (X); bias none, fp32 or bf16; y fp32 or bf16.
template <typename X, typename Y>
void typed(const at::Tensor& weight, const X* x, int64_t m_rows, const float* scale, const at::Tensor& scale_least,
           const at::Tensor& bias, Y* y, int64_t out, int64_t in, int64_t ahead, Epilogue epilogue) {
  auto with_bias = [&](auto run) {
    if (!bias.defined()) {
      run(static_cast<const float*>(nullptr));
    } else if (bias.scalar_type() == at::kBFloat16) {
      run(bias.const_data_ptr<at::BFloat16>());
    } else {
      run(bias.const_data_ptr<float>());
    }
  };
  if constexpr (std::is_same_v<X, at::BFloat16>) {  // bf16 rows as they are: bf16 weights only
    with_bias([&](const auto* b) { rows(weight.const_data_ptr<at::BFloat16>(), x, m_rows, scale, b, y, out, in, ahead, epilogue); });
  } else if (weight.scalar_type() == at::kByte) {
    const int64_t group = in / scale_least.size(-1);
    with_bias([&](const auto* b) {
      int4_rows(weight.const_data_ptr<uint8_t>(), scale_least.const_data_ptr<at::BFloat16>(), x, m_rows, b, y, out, in, group, ahead,
                epilogue);
    });
  } else {
    auto dense = [&](const auto* w) { with_bias([&](const auto* b) { rows(w, x, m_rows, scale, b, y, out, in, ahead, epilogue); }); };
    if (weight.scalar_type() == at::kFloat) {
      dense(weight.const_data_ptr<float>());
    } else if (weight.scalar_type() == at::kBFloat16) {
      dense(weight.const_data_ptr<at::BFloat16>());
    } else {
      dense(weight.const_data_ptr<int8_t>());
    }
  }
}

// A vector as fp32 or bf16, contiguous: itself when it is one already, else converted (a dispatched copy).
at::Tensor float_or_bf16(const at::Tensor& t) {
  const bool typed = t.scalar_type() == at::kFloat || t.scalar_type() == at::kBFloat16;
  return typed ? t.contiguous() : t.to(at::kFloat).contiguous();
}

// y (..., out) = scale * (weight x) + bias for one row x (..., in) of in elements, or a few rows x (..., in), weight (out, in)
// row-major: fp32 or bf16 weights (no scale), int8 with an fp32 scale per row, or 4-bit codes (out, in / 2) with their
// groups' bf16 scales and least values (out, 2, groups) as `scale`; x fp32 or bf16, y in x's dtype; the
// weights prefetched `prefetch` bytes ahead (0: none). Each weight row is read once for all the rows of x, so a few rows
// cost little more than one where the weights' streaming is the limit (which rows count as few is timed: kernel_choice.py).
// One allocation (y) and no other torch operator a call: a bf16 x is widened here (with bf16 weights on a CPU with
// AVX512-BF16, read as it is), and y written in its dtype (through torch's conversions, three more operators a call took
// 0.48 ms of a 4.9 ms bf16 GPT-2 token).
// The product into a new y, its outputs through the epilogue as they are written; kAdd adds them into `residual` instead.
at::Tensor product(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& scale,
                   const std::optional<at::Tensor>& bias, int64_t prefetch, Epilogue epilogue, at::Tensor* residual = nullptr) {
  TORCH_CHECK(x.device().is_cpu() && weight.device().is_cpu(), "aiayn_native::gemv: CPU tensors only");
  TORCH_CHECK(x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16, "aiayn_native::gemv: x must be float32 or bfloat16, got ",
              x.scalar_type());
  TORCH_CHECK(weight.dim() == 2 && weight.is_contiguous(), "aiayn_native::gemv: weight must be a contiguous (out, in) matrix");
  const at::ScalarType wtype = weight.scalar_type();
  const bool scaled = scale.has_value() && scale->defined();
  TORCH_CHECK(wtype == at::kFloat || wtype == at::kBFloat16 || wtype == at::kChar || wtype == at::kByte, "aiayn_native::gemv: ",
              "weight must be float32, bfloat16, int8 or uint8 (4-bit codes, two to a byte), got ", wtype);
  const bool int4 = wtype == at::kByte;
  TORCH_CHECK(scaled == (wtype == at::kChar || int4), "aiayn_native::gemv: a scale goes with int8 weights and 4-bit codes, and only with them");
  const int64_t out = weight.size(0), in = int4 ? 2 * weight.size(1) : weight.size(1);
  at::Tensor scale_least;  // 4-bit codes: the groups' scales and least values, bf16 (out, 2, groups)
  if (int4) {
    scale_least = scale->contiguous();
    const int64_t groups = scale_least.dim() == 3 ? scale_least.size(2) : 0;
    TORCH_CHECK(scale_least.scalar_type() == at::kBFloat16 && scale_least.dim() == 3 && scale_least.size(0) == out &&
                    scale_least.size(1) == 2 && groups > 0 && in % groups == 0 && std::count(std::begin(aiayn_int4::kGroups), std::end(aiayn_int4::kGroups), in / groups),
                "aiayn_native::gemv: 4-bit codes (", out, ", ", in / 2, ") take bfloat16 scales and least values (", out,
                ", 2, groups), groups of 32, 64 or 128 inputs; got ", scale_least.scalar_type(), " ", scale_least.sizes());
  }
  const bool one = x.dim() >= 1 && x.numel() == in;  // one row, whatever its shape ((in,), (1, 1, in), ...)
  TORCH_CHECK(one || (x.dim() >= 2 && x.size(-1) == in), "aiayn_native::gemv: x has shape ", x.sizes(),
              ", the weight takes ", in, " features: one row of ", in, " elements or rows (..., ", in, ")");
  const int64_t m_rows = one ? 1 : x.numel() / in;
  TORCH_CHECK(prefetch >= 0, "aiayn_native::gemv: prefetch is a distance in bytes, 0 or more, got ", prefetch);
  at::Tensor s, b;
  if (scaled && !int4) {
    s = scale->scalar_type() == at::kFloat ? scale->contiguous() : scale->to(at::kFloat).contiguous();
    TORCH_CHECK(s.numel() == out, "aiayn_native::gemv: scale must have ", out, " elements, got ", s.numel());
  }
  if (bias.has_value() && bias->defined()) {
    b = float_or_bf16(*bias);
    TORCH_CHECK(b.numel() == out, "aiayn_native::gemv: bias must have ", out, " elements, got ", b.numel());
  }
  const at::Tensor row = x.contiguous();
  std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end());  // x's shape, its last dimension `out`: no view after
  shape.back() = out;  // (one row of shape (in,) or (1, ..., in): the same shape with `out` last)
  const bool accumulate = epilogue == Epilogue::kAdd;
  TORCH_CHECK(accumulate == (residual != nullptr), "aiayn_native::gemv: a residual goes with the adding epilogue");
  if (accumulate) {
    const at::MemOverlapStatus overlap = at::get_overlap_status(*residual, x);  // outputs are written while x is read
    TORCH_CHECK(overlap != at::MemOverlapStatus::Full && overlap != at::MemOverlapStatus::Partial,
                "aiayn_native::gemv_add_: the residual and x share memory; give x in a tensor of its own");
    TORCH_CHECK(residual->sizes() == at::IntArrayRef(shape) && residual->scalar_type() == x.scalar_type() && residual->is_contiguous(),
                "aiayn_native::gemv_add_: the residual must be contiguous, of x's dtype (", x.scalar_type(), ") and the product's ",
                "shape ", at::IntArrayRef(shape), ", got ", residual->scalar_type(), " ", residual->sizes());
  }
  at::Tensor y = accumulate ? *residual : at::empty(shape, x.options());
  if (m_rows == 0) return y;  // no rows: nothing to write
#if defined(__AVX512BF16__)
  if (wtype == at::kBFloat16 && row.scalar_type() == at::kBFloat16 && in % 32 == 0) {  // bf16 by bf16: products of pairs
    typed(weight, row.const_data_ptr<at::BFloat16>(), m_rows, nullptr, scale_least, b, y.mutable_data_ptr<at::BFloat16>(), out, in,
          prefetch, epilogue);
    return y;
  }
#endif
  std::vector<float> widened;  // bf16 rows in fp32 (exact): the dot products read fp32
  const float* xp = nullptr;
  if (row.scalar_type() == at::kFloat) {
    xp = row.const_data_ptr<float>();
  } else {
    const at::BFloat16* xb = row.const_data_ptr<at::BFloat16>();
    widened.assign(xb, xb + m_rows * in);
    xp = widened.data();
  }
  const float* sp = scaled && !int4 ? s.const_data_ptr<float>() : nullptr;
  if (x.scalar_type() == at::kFloat) {
    typed(weight, xp, m_rows, sp, scale_least, b, y.mutable_data_ptr<float>(), out, in, prefetch, epilogue);
  } else {
    typed(weight, xp, m_rows, sp, scale_least, b, y.mutable_data_ptr<at::BFloat16>(), out, in, prefetch, epilogue);
  }
  return y;
}

at::Tensor gemv(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& scale,
                const std::optional<at::Tensor>& bias, int64_t prefetch) {
  return product(x, weight, scale, bias, prefetch, Epilogue::kNone);
}

// activation(gemv(x, ...)), each output through the activation as its thread writes it: a feed-forward's hidden layer
// with no operator, allocation or pass of its own (the C++ decoding step), the bits of the operator after gemv:
// "gelu_tanh" (aiayn_native::gelu_tanh), "relu" (relu_), "relu2" (relu_().mul_() of itself: ReLU squared).
at::Tensor gemv_activation(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& scale,
                           const std::optional<at::Tensor>& bias, int64_t prefetch, c10::string_view activation) {
  const Epilogue epilogue = activation == "gelu_tanh" ? Epilogue::kGeluTanh
                            : activation == "relu"    ? Epilogue::kRelu
                            : activation == "relu2"   ? Epilogue::kRelu2
                                                      : Epilogue::kNone;
  TORCH_CHECK(epilogue != Epilogue::kNone, "aiayn_native::gemv_activation: activation must be 'gelu_tanh', 'relu' or 'relu2', got '",
              activation, "'");
  return product(x, weight, scale, bias, prefetch, epilogue);
}

// residual += gemv(x, ...), in place, each output added as it is written: a residual connection (section 3.1) with no
// operator, allocation or pass over the stream of its own (the C++ decoding step's attention output and feed-forward
// projections). The sum is the bits of `residual.add_(gemv(x, ...))`.
at::Tensor& gemv_add_(at::Tensor& residual, const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& scale,
                      const std::optional<at::Tensor>& bias, int64_t prefetch) {
  product(x, weight, scale, bias, prefetch, Epilogue::kAdd, &residual);
  return residual;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(aiayn_native, m) {
  m.def("gemv(Tensor x, Tensor weight, Tensor? scale, Tensor? bias, int prefetch=0) -> Tensor");
  m.def("gemv_add_(Tensor(a!) residual, Tensor x, Tensor weight, Tensor? scale, Tensor? bias, int prefetch=0) -> Tensor(a!)");
  m.def("gemv_activation(Tensor x, Tensor weight, Tensor? scale, Tensor? bias, int prefetch, str activation) -> Tensor");
}

TORCH_LIBRARY_IMPL(aiayn_native, CPU, m) {
  m.impl("gemv", &gemv);
  m.impl("gemv_add_", &gemv_add_);
  m.impl("gemv_activation", &gemv_activation);
}
