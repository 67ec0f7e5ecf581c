// Rows of 4-bit weight codes dotted with a few inputs: the int4 case of the matrix-vector product in gemv.cpp
// (the interface here, the loops in gemv_int4.cpp).
//
// A row's codes are Int4Linear's checkpoint buffer as it is (two to a byte, the even input in the low nibble), cut in
// groups of `group` inputs, each with its scale s and its least value lo (bf16; aiayn/inference/int4.py): a weight is
// q s + lo, so a row's dot product with x is sum_g s_g (sum_i q_i x_i) + sum_g lo_g (sum_i x_i).
//
// The inner sums are integer, as llama.cpp's Q4_0 dot product with its Q8 inputs: each group of x is quantised once a
// call to 8 bits (x_i ~ dx_g k_i, dx_g = max |x_i| / 127, an error of at most half a step), and sum_i q_i k_i is exact in
// int32 (unsigned codes times signed inputs, four products a 32-bit lane, one instruction with VNNI), so two chunks of
// 32 weights cost one load, two masks and a shift, two multiply-adds, a conversion and one fused multiply-add by the
// chunks' steps s_g dx_g. One thread with the codes in cache (`/tmp` harness, 2026-12-06, Zen 4 EPYC; 3072 rows, groups
// of 32): 0.72 ns a group for rows of 3072 inputs, 1.16 ns for rows of 768 (a row's fixed costs); 16-bit inputs (sums of
// 16-bit pairs) took 1.0 and 1.37 ns, the codes widened to fp32 and multiplied by fp32 inputs 1.4 ns, and torch's int4
// kernel (bf16 inputs) about 1.8 ns (768 -> 3072, one thread). 256-bit vectors: on a Zen 4 a 512-bit operation costs two.
// The steps s_g dx_g are made in registers as the sums need them (since 2026-12-07; before, written to memory a row at
// a time and read back, which stalled the loads reading them): `python benchmarks/generation.py --linears --threads 1,2`,
// 768 -> 3072, our kernel with prefetching, one row, 0.095 -> 0.078 ms on one thread, 0.054 -> 0.046 on two; 8 rows
// 0.461 -> 0.370 and 0.243 -> 0.196 (Zen 4 EPYC, the two commits alternated, 23:03-23:05 UTC; torch's int4 kernel
// 0.153-0.156 ms in each run).

#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <vector>

namespace aiayn_int4 {

constexpr int64_t kChunk = 32;  // the inputs of 16 bytes of codes: the unit of the loops (a group is 1, 2 or 4 of them)
constexpr int64_t kGroups[] = {32, 64, 128};  // the group sizes the loops are built for

// A few rows of x prepared once a call: k, each row's 8-bit quantisation, its bytes in the order the codes' nibbles meet
// them; dx, each group's step; sums, each group's sum of inputs (for the least values).
struct Inputs {
  int64_t m_rows, in, group;
  std::vector<int8_t> k;
  std::vector<float> dx, sums;
};

Inputs prepare(const float* x, int64_t m_rows, int64_t in, int64_t group);

// The dot products of code rows [begin, end) (in / 2 bytes each; `scale_least`: each row's bf16 scales, then its
// least values) with every prepared row of x: d[(o - begin) * m_rows + m]; the codes prefetched `ahead` bytes ahead
// (0: not). Each row of codes is read from memory once for all the rows of x.
void rows(const uint8_t* codes, const at::BFloat16* scale_least, const Inputs& x, int64_t begin, int64_t end, int64_t ahead, float* d);

}  // namespace aiayn_int4
