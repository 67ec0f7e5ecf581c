// Training attention by oneDNN's small-matrix kernel (attention_tiles.cpp), called by attention_train.cpp's operators
// when asked for (their `tiles` argument): the same shapes and layouts as its own kernel.
#pragma once

#include <ATen/ATen.h>

namespace aiayn_tiles {

// Whether bf16 runs here: torch packs bf16 operands for its small-matrix kernel in the layout ours writes (fp32 runs
// wherever the library built).
bool pairs_ready();

// out (B, H, T, D) and lse (B, H, T), allocated by the caller, from q (B, H, T, D), k and v (B, H, S, D), fp32 or bf16.
void forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, bool causal, float scale, at::Tensor& out, at::Tensor& lse);

// dq, dk and dv, allocated by the caller, from the output's gradient and the forward's inputs, out and lse.
void backward(const at::Tensor& grad, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& out,
              const at::Tensor& lse, bool causal, float scale, at::Tensor& dq, at::Tensor& dk, at::Tensor& dv);

}  // namespace aiayn_tiles
