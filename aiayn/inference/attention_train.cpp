// Self-attention for training on the CPU, forward and backward (aiayn/nn/attention.py takes it where it was timed
// faster than torch's flash kernel, aiayn/inference/kernel_choice.py): each (batch, head) pair on one thread, its
// queries, keys and values widened to fp32 in the thread's buffers, the scores of the whole head kept there (so the
// backward recomputes them once, from the saved log-sum-exp), and every product a register-blocked loop over them.
// Causal attention computes only the scores at or below the diagonal (in blocks of 32 keys).

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <tuple>
#include <vector>

#include "attention_tiles.h"
#include "simd.h"

namespace {

using namespace aiayn_simd;

constexpr int64_t kRows = 8;   // queries (or keys) a register block holds
constexpr int64_t kCols = 32;  // keys a score block holds: two vectors of 16

int64_t round_up(int64_t n, int64_t m) { return (n + m - 1) / m * m; }

// One (batch, head)'s rows of a (B, H, T, D) tensor with the last dimension contiguous.
template <typename T>
struct Head {
  const T* p;
  int64_t row;  // stride between positions
  const T* at(int64_t t) const { return p + t * row; }
};

template <typename T>
Head<T> head_of(const at::Tensor& x, int64_t bh, int64_t heads) {
  return {x.const_data_ptr<T>() + (bh / heads) * x.stride(0) + (bh % heads) * x.stride(1), x.stride(2)};
}

// rows x d of a head widened to fp32, times `scale`, into dst (rows x d; d a multiple of 16).
template <typename T>
void widen(Head<T> src, int64_t rows, int64_t d, float scale, float* dst) {
  for (int64_t t = 0; t < rows; ++t) {
    const T* s = src.at(t);
    int64_t k = 0;
#if defined(__AVX512F__)
    const __m512 sv = _mm512_set1_ps(scale);
    for (; k < d; k += 16) _mm512_storeu_ps(dst + t * d + k, _mm512_mul_ps(load16(s + k), sv));
#endif
    for (; k < d; ++k) dst[t * d + k] = static_cast<float>(s[k]) * scale;
  }
}

// The kCols-row tiles of `rows` x d fp32 rows (src; rows past `rows` to round_up(rows, kCols) must be zero) transposed:
// tile j holds rows [j kCols, (j + 1) kCols) as d x kCols, so that a score block reads one contiguous tile. dst:
// round_up(rows, kCols) x d.
void transpose_tiles(const float* src, int64_t rows, int64_t d, float* dst) {
  for (int64_t t0 = 0; t0 < rows; t0 += kCols) transpose_block(src + t0 * d, kCols, d, d, dst + t0 * d, kCols);
}

// c[i][j] = scale * sum_k a[i][k] bt[k][j] for rows [i0, i0 + kScoreRows) (a: rows x d) and columns [0, cols) (bt: tiles
// of transpose_tiles, cols a multiple of kCols), c with ld columns.
constexpr int64_t kScoreRows = 8;

void scores_block(const float* a, const float* bt, int64_t i0, int64_t rows, int64_t d, int64_t ld, int64_t cols, float scale,
                  float* c) {
  const int64_t nr = std::min(kScoreRows, rows - i0);
  const float* ar[kScoreRows];
  for (int64_t r = 0; r < kScoreRows; ++r) ar[r] = a + std::min(i0 + r, rows - 1) * d;
#if defined(__AVX512F__)
  for (int64_t j = 0; j < cols; j += kCols) {
    const float* tile = bt + (j / kCols) * d * kCols;
    __m512 acc[kScoreRows][2];
    for (int64_t r = 0; r < kScoreRows; ++r) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
    for (int64_t k = 0; k < d; ++k) {
      const __m512 b0 = _mm512_loadu_ps(tile + k * kCols), b1 = _mm512_loadu_ps(tile + k * kCols + 16);
      for (int64_t r = 0; r < kScoreRows; ++r) {
        const __m512 x = _mm512_set1_ps(ar[r][k]);
        acc[r][0] = _mm512_fmadd_ps(x, b0, acc[r][0]);
        acc[r][1] = _mm512_fmadd_ps(x, b1, acc[r][1]);
      }
    }
    const __m512 s = _mm512_set1_ps(scale);
    for (int64_t r = 0; r < nr; ++r) {
      _mm512_storeu_ps(c + (i0 + r) * ld + j, _mm512_mul_ps(acc[r][0], s));
      _mm512_storeu_ps(c + (i0 + r) * ld + j + 16, _mm512_mul_ps(acc[r][1], s));
    }
  }
#else
  for (int64_t r = 0; r < nr; ++r) {
    for (int64_t j = 0; j < cols; ++j) {
      float s = 0.f;
      for (int64_t k = 0; k < d; ++k) s += ar[r][k] * bt[(j / kCols) * d * kCols + k * kCols + j % kCols];
      c[(i0 + r) * ld + j] = s * scale;
    }
  }
#endif
}

// out[r][c, c + 16 NV) = sum_{j in [from, n)} w[(i0 + r) * ld + j] * b[j][c, c + 16 NV) for rows [i0, i0 + kRows) (rows
// past `rows` skipped); b: n x d; out: rows x d (fp32). With `transposed`, w is read as w[j * ld + i0 + r] (the products
// of a matrix's transpose: dV = P^T dO, dK = dS^T Q).
template <bool transposed, int NV>
void weighted_chunk(const float* w, int64_t ld, const float* b, int64_t from, int64_t n, int64_t i0, int64_t rows, int64_t d,
                    int64_t c, float* out) {
  const int64_t nr = std::min(kRows, rows - i0);
#if defined(__AVX512F__)
  __m512 acc[kRows][NV];
  for (int64_t r = 0; r < kRows; ++r) {
    for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_setzero_ps();
  }
  int64_t idx[kRows];
  for (int64_t r = 0; r < kRows; ++r) idx[r] = std::min(i0 + r, rows - 1);
  for (int64_t j = from; j < n; ++j) {
    const float* bj = b + j * d + c;
    __m512 bv[NV];
    for (int v = 0; v < NV; ++v) bv[v] = _mm512_loadu_ps(bj + 16 * v);
    for (int64_t r = 0; r < kRows; ++r) {
      const __m512 x = _mm512_set1_ps(transposed ? w[j * ld + idx[r]] : w[idx[r] * ld + j]);
      for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_fmadd_ps(x, bv[v], acc[r][v]);
    }
  }
  for (int64_t r = 0; r < nr; ++r) {
    for (int v = 0; v < NV; ++v) _mm512_storeu_ps(out + (i0 + r) * d + c + 16 * v, acc[r][v]);
  }
#else
  for (int64_t r = 0; r < nr; ++r) {
    for (int64_t k = c; k < c + 16 * NV; ++k) {
      float s = 0.f;
      for (int64_t j = from; j < n; ++j) s += (transposed ? w[j * ld + i0 + r] : w[(i0 + r) * ld + j]) * b[j * d + k];
      out[(i0 + r) * d + k] = s;
    }
  }
#endif
}

// weighted_chunk over the whole head dimension (a multiple of 16), 32 columns at a time.
template <bool transposed>
void weighted_rows(const float* w, int64_t ld, const float* b, int64_t from, int64_t n, int64_t i0, int64_t rows, int64_t d,
                   float* out) {
  int64_t c = 0;
  for (; c + 32 <= d; c += 32) weighted_chunk<transposed, 2>(w, ld, b, from, n, i0, rows, d, c, out);
  if (c < d) weighted_chunk<transposed, 1>(w, ld, b, from, n, i0, rows, d, c, out);
}

template <typename T>
void store_head(const float* src, int64_t rows, int64_t d, T* dst, int64_t row_stride) {
  for (int64_t t = 0; t < rows; ++t) {
    int64_t k = 0;
#if defined(__AVX512F__)
    for (; k < d; k += 16) store16(dst + t * row_stride + k, _mm512_loadu_ps(src + t * d + k));
#endif
    for (; k < d; ++k) dst[t * row_stride + k] = static_cast<T>(src[t * d + k]);
  }
}

// The keys query i attends to: all of them, or those at or before it.
inline int64_t keys_of(int64_t i, int64_t s, bool causal) { return causal ? i + 1 : s; }
// The score columns a block of queries from i0 computes (a multiple of kCols, within the padded width).
inline int64_t block_cols(int64_t i0, int64_t t, int64_t s, bool causal) {
  return round_up(causal ? std::min(i0 + kScoreRows, t) : s, kCols);
}

// One (batch, head)'s first element of a (B, H, n, D) output, to write.
template <typename T>
T* head_out(at::Tensor& x, int64_t bh, int64_t heads) {
  return x.mutable_data_ptr<T>() + (bh / heads) * x.stride(0) + (bh % heads) * x.stride(1);
}

template <typename T>
void forward_heads(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, bool causal, float scale, at::Tensor& out,
                   at::Tensor& lse) {
  const int64_t heads = q.size(1), t = q.size(2), s = k.size(2), d = q.size(3), sp = round_up(s, kCols);
  float* lse_p = lse.mutable_data_ptr<float>();
  at::parallel_for(0, q.size(0) * heads, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> qf(t * d), kf(sp * d), vf(s * d), kt(d * sp), scores(t * sp), result(t * d);
    for (int64_t bh = begin; bh < end; ++bh) {
      widen(head_of<T>(q, bh, heads), t, d, 1.f, qf.data());
      widen(head_of<T>(k, bh, heads), s, d, 1.f, kf.data());  // rows past s stay zero
      transpose_tiles(kf.data(), s, d, kt.data());
      widen(head_of<T>(v, bh, heads), s, d, 1.f, vf.data());
      float* p = scores.data();
      for (int64_t i0 = 0; i0 < t; i0 += kScoreRows) {
        scores_block(qf.data(), kt.data(), i0, t, d, sp, block_cols(i0, t, s, causal), scale, p);
      }
      for (int64_t i = 0; i < t; ++i) {  // softmax of each row over its keys, zero past them
        float* row = p + i * sp;
        const int64_t n = keys_of(i, s, causal);
        float m = -INFINITY, sum = 0.f;
        int64_t j = 0;
#if defined(__AVX512F__)
        const __m512 lowest = _mm512_set1_ps(-INFINITY);
        __m512 mx = lowest, sv = _mm512_setzero_ps();
        for (; j < n; j += 16) mx = _mm512_max_ps(mx, _mm512_mask_loadu_ps(lowest, tail_mask(j, n), row + j));
        m = _mm512_reduce_max_ps(mx);
        const __m512 mv = _mm512_set1_ps(m);
        for (j = 0; j < n; j += 16) {  // past n: zeros
          const __mmask16 in = tail_mask(j, n);
          const __m512 e = _mm512_maskz_mov_ps(in, exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(in, row + j), mv)));
          _mm512_storeu_ps(row + j, e);
          sv = _mm512_add_ps(sv, e);
        }
        sum = _mm512_reduce_add_ps(sv);
        const __m512 inv = _mm512_set1_ps(1.f / sum);
        for (j = 0; j < n; j += 16) _mm512_storeu_ps(row + j, _mm512_mul_ps(_mm512_loadu_ps(row + j), inv));
#else
        for (; j < n; ++j) m = std::max(m, row[j]);
        for (j = 0; j < n; ++j) sum += (row[j] = std::exp(row[j] - m));
        const float inv = 1.f / sum;
        for (j = 0; j < n; ++j) row[j] *= inv;
#endif
        std::fill(row + n, row + sp, 0.f);
        lse_p[bh * t + i] = m + std::log(sum);
      }
      for (int64_t i0 = 0; i0 < t; i0 += kRows) {
        weighted_rows<false>(p, sp, vf.data(), 0, causal ? std::min(i0 + kRows, t) : s, i0, t, d, result.data());
      }
      store_head(result.data(), t, d, head_out<T>(out, bh, heads), out.stride(2));
    }
  });
}

template <typename T>
void backward_heads(const at::Tensor& grad, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& out,
                    const at::Tensor& lse, bool causal, float scale, at::Tensor& dq, at::Tensor& dk, at::Tensor& dv) {
  const int64_t heads = q.size(1), t = q.size(2), s = k.size(2), d = q.size(3), sp = round_up(s, kCols);
  const float* lse_p = lse.const_data_ptr<float>();
  at::parallel_for(0, q.size(0) * heads, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> qf(t * d), kf(sp * d), vf(sp * d), kt(d * sp), vt(d * sp), dout(t * d), scores(t * sp), ds(t * sp),
        delta(t), result(std::max(t, s) * d);
    for (int64_t bh = begin; bh < end; ++bh) {
      widen(head_of<T>(q, bh, heads), t, d, 1.f, qf.data());
      widen(head_of<T>(k, bh, heads), s, d, 1.f, kf.data());  // rows past s stay zero
      widen(head_of<T>(v, bh, heads), s, d, 1.f, vf.data());
      transpose_tiles(kf.data(), s, d, kt.data());
      transpose_tiles(vf.data(), s, d, vt.data());
      widen(head_of<T>(grad, bh, heads), t, d, 1.f, dout.data());
      const Head<T> o = head_of<T>(out, bh, heads);
      for (int64_t i = 0; i < t; ++i) {  // delta_i = dO_i . O_i
        float acc = 0.f;
        int64_t c = 0;
#if defined(__AVX512F__)
        __m512 sum = _mm512_setzero_ps();
        for (; c < d; c += 16) sum = _mm512_fmadd_ps(_mm512_loadu_ps(dout.data() + i * d + c), load16(o.at(i) + c), sum);
        acc = _mm512_reduce_add_ps(sum);
#endif
        for (; c < d; ++c) acc += dout[i * d + c] * static_cast<float>(o.at(i)[c]);
        delta[i] = acc;
      }
      float* p = scores.data();
      for (int64_t i0 = 0; i0 < t; i0 += kScoreRows) {
        const int64_t cols = block_cols(i0, t, s, causal);
        scores_block(qf.data(), kt.data(), i0, t, d, sp, cols, scale, p);  // S again
        scores_block(dout.data(), vt.data(), i0, t, d, sp, cols, 1.f, ds.data());  // dP = dO V^T
      }
      for (int64_t i = 0; i < t; ++i) {  // P = exp(S - lse), dS = scale P (dP - delta); zero past the row's keys
        float* row = p + i * sp;
        float* drow = ds.data() + i * sp;
        const int64_t n = keys_of(i, s, causal);
        const float l = lse_p[bh * t + i];
#if defined(__AVX512F__)
        const __m512 lv = _mm512_set1_ps(l), dv_ = _mm512_set1_ps(delta[i]), sv = _mm512_set1_ps(scale);
        for (int64_t j = 0; j < n; j += 16) {  // whole vectors, zeros past n
          const __mmask16 in = tail_mask(j, n);
          const __m512 e = _mm512_maskz_mov_ps(in, exp16(_mm512_sub_ps(_mm512_loadu_ps(row + j), lv)));
          _mm512_storeu_ps(row + j, e);
          _mm512_storeu_ps(drow + j, _mm512_mul_ps(_mm512_mul_ps(e, _mm512_sub_ps(_mm512_loadu_ps(drow + j), dv_)), sv));
        }
#else
        for (int64_t j = 0; j < n; ++j) {
          row[j] = std::exp(row[j] - l);
          drow[j] = scale * row[j] * (drow[j] - delta[i]);
        }
#endif
        std::fill(row + n, row + sp, 0.f);
        std::fill(drow + n, drow + sp, 0.f);
      }
      for (int64_t i0 = 0; i0 < t; i0 += kRows) {  // dQ = dS K
        weighted_rows<false>(ds.data(), sp, kf.data(), 0, causal ? std::min(i0 + kRows, t) : s, i0, t, d, result.data());
      }
      store_head(result.data(), t, d, head_out<T>(dq, bh, heads), dq.stride(2));
      for (int64_t j0 = 0; j0 < s; j0 += kRows) {  // dK = dS^T Q, over the queries that see these keys
        weighted_rows<true>(ds.data(), sp, qf.data(), causal ? j0 : 0, t, j0, s, d, result.data());
      }
      store_head(result.data(), s, d, head_out<T>(dk, bh, heads), dk.stride(2));
      for (int64_t j0 = 0; j0 < s; j0 += kRows) {  // dV = P^T dO
        weighted_rows<true>(p, sp, dout.data(), causal ? j0 : 0, t, j0, s, d, result.data());
      }
      store_head(result.data(), s, d, head_out<T>(dv, bh, heads), dv.stride(2));
    }
  });
}

void check(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, bool causal, bool tiles, const char* name) {
  TORCH_CHECK(q.device().is_cpu() && (q.scalar_type() == at::kFloat || q.scalar_type() == at::kBFloat16), name,
              ": q must be a float32 or bfloat16 CPU tensor, got ", q.scalar_type(), " on ", q.device());
  TORCH_CHECK(q.dim() == 4 && k.sizes() == v.sizes() && k.dim() == 4 && k.size(0) == q.size(0) && k.size(1) == q.size(1) &&
                  k.size(3) == q.size(3) && k.scalar_type() == q.scalar_type() && v.scalar_type() == q.scalar_type(),
              name, ": q (B, H, T, D), k and v (B, H, S, D) of q's dtype, got ", q.sizes(), ", ", k.sizes(), ", ", v.sizes());
  TORCH_CHECK(tiles || q.size(3) % 16 == 0, name, ": the head dimension must be a multiple of 16, got ", q.size(3));
  TORCH_CHECK(!causal || q.size(2) == k.size(2), name, ": causal attention needs as many keys as queries");
  TORCH_CHECK(q.stride(3) == 1 && k.stride(3) == 1 && v.stride(3) == 1, name, ": the head dimension must be contiguous");
  TORCH_CHECK(!tiles || q.scalar_type() == at::kFloat || aiayn_tiles::pairs_ready(), name,
              ": torch's small-matrix kernel takes no packed bf16 operands of our layout on this CPU (tiles=False runs here)");
}

// (B, H, n, D) laid out as (B, n, H, D), as the model's heads are: merging them back is a view, not a copy.
at::Tensor heads_like(const at::Tensor& x) { return at::empty({x.size(0), x.size(2), x.size(1), x.size(3)}, x.options()).transpose(1, 2); }

// (out (B, H, T, D) in q's dtype, laid out as (B, T, H, D); lse (B, H, T) fp32), by our loops or (tiles) by oneDNN's
// small-matrix kernel (attention_tiles.cpp)
std::tuple<at::Tensor, at::Tensor> attention_forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, bool causal,
                                                     double scale, bool tiles) {
  check(q, k, v, causal, tiles, "aiayn_native::attention_forward");
  at::Tensor out = heads_like(q);
  at::Tensor lse = at::empty({q.size(0), q.size(1), q.size(2)}, q.options().dtype(at::kFloat));
  if (tiles) {
    aiayn_tiles::forward(q, k, v, causal, static_cast<float>(scale), out, lse);
  } else if (q.scalar_type() == at::kFloat) {
    forward_heads<float>(q, k, v, causal, static_cast<float>(scale), out, lse);
  } else {
    forward_heads<at::BFloat16>(q, k, v, causal, static_cast<float>(scale), out, lse);
  }
  return {out, lse};
}

// (dq, dk, dv), each of its input's shape, laid out as heads_like
std::tuple<at::Tensor, at::Tensor, at::Tensor> attention_backward(const at::Tensor& grad, const at::Tensor& q, const at::Tensor& k,
                                                                  const at::Tensor& v, const at::Tensor& out, const at::Tensor& lse,
                                                                  bool causal, double scale, bool tiles) {
  check(q, k, v, causal, tiles, "aiayn_native::attention_backward");
  const at::Tensor g = grad.stride(3) == 1 ? grad : grad.contiguous();
  const at::Tensor o = out.stride(3) == 1 ? out : out.contiguous();
  at::Tensor dq = heads_like(q), dk = heads_like(k), dv = heads_like(v);
  const at::Tensor l = lse.contiguous();
  if (tiles) {
    aiayn_tiles::backward(g, q, k, v, o, l, causal, static_cast<float>(scale), dq, dk, dv);
  } else if (q.scalar_type() == at::kFloat) {
    backward_heads<float>(g, q, k, v, o, l, causal, static_cast<float>(scale), dq, dk, dv);
  } else {
    backward_heads<at::BFloat16>(g, q, k, v, o, l, causal, static_cast<float>(scale), dq, dk, dv);
  }
  return {dq, dk, dv};
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(aiayn_native, m) {
  m.def("attention_forward(Tensor q, Tensor k, Tensor v, bool causal, float scale, bool tiles=False) -> (Tensor, Tensor)");
  m.def("attention_backward(Tensor grad, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, bool causal, float scale, "
        "bool tiles=False) -> (Tensor, Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(aiayn_native, CPU, m) {
  m.impl("attention_forward", &attention_forward);
  m.impl("attention_backward", &attention_backward);
}
