// A 2-D tensor's transpose, written contiguous: training's bf16 products where oneDNN is faster with the weight's
// transpose in memory than with a transposed view of it (aiayn/nn/onednn_linear.py; torch's own copy of a transposed
// view, x.t().contiguous(), took 85 ms over GPT-2's 50257 x 768 bf16 embedding on an AMX Xeon, 2026-12-06).

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>

#include "simd.h"

namespace {

constexpr int64_t kTile = 64, kRows = 256;  // a tile: kTile columns by kRows rows, in L1 and L2

// out (cols, rows) = x (rows, cols)^T with x's rows sx elements apart; threads take bands of kTile columns (each a
// band of the output's rows, so no two threads write one cache line), and tiles of kRows rows in turn, each
// transposed by simd.h's transpose_block.
template <typename T>
void transpose_tiles(const T* x, int64_t rows, int64_t cols, int64_t sx, T* out) {
  at::parallel_for(0, (cols + kTile - 1) / kTile, 1, [&](int64_t begin, int64_t end) {
    for (int64_t band = begin; band < end; ++band) {
      const int64_t c0 = band * kTile, c1 = std::min(c0 + kTile, cols);
      for (int64_t r0 = 0; r0 < rows; r0 += kRows) {
        aiayn_simd::transpose_block(x + r0 * sx + c0, std::min(kRows, rows - r0), c1 - c0, sx, out + c0 * rows + r0, rows);
      }
    }
  });
}

// x (rows, cols) -> a new contiguous (cols, rows) tensor equal to x.t(), for 2- and 4-byte elements (others: torch's copy).
at::Tensor transpose(const at::Tensor& x) {
  TORCH_CHECK(x.device().is_cpu() && x.dim() == 2, "aiayn_native::transpose: x must be a 2-D CPU tensor, got ", x.sizes(),
              " on ", x.device());
  const at::Tensor in = x.stride(1) == 1 ? x : x.contiguous();
  const int64_t rows = in.size(0), cols = in.size(1);
  at::Tensor out = at::empty({cols, rows}, in.options());
  if (in.numel() == 0) return out;
  if (in.element_size() == 2) {
    transpose_tiles(static_cast<const uint16_t*>(in.const_data_ptr()), rows, cols, in.stride(0), static_cast<uint16_t*>(out.mutable_data_ptr()));
  } else if (in.element_size() == 4) {
    transpose_tiles(static_cast<const uint32_t*>(in.const_data_ptr()), rows, cols, in.stride(0), static_cast<uint32_t*>(out.mutable_data_ptr()));
  } else {
    out.copy_(in.t());
  }
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(aiayn_native, m) { m.def("transpose(Tensor x) -> Tensor"); }

TORCH_LIBRARY_IMPL(aiayn_native, CPU, m) { m.impl("transpose", &transpose); }
