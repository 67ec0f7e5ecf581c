// Self-attention for training on the CPU with every product in blocks by oneDNN's small-matrix kernel: the same forward
// and backward as attention_train.cpp (each (batch, head) pair on one thread, the weights recomputed in the backward
// from the saved log-sum-exp), but each product a few calls of at::native::cpublas::brgemm (fp32 sums; bf16 operands on
// AMX tiles where the CPU has them, fp32 operands on its vector units) instead of our register-blocked loops. The
// softmax and its gradient stay in fp32; in bf16 the attention weights and their gradient are rounded to bf16 for the
// products that take them, as torch's own flash kernel does. aiayn/nn/attention.py takes it where it was timed faster
// (aiayn/inference/kernel_choice.py); bf16 only where torch can pack bf16 operands for that kernel here.
//
// Each operand is a zero-padded copy of 64 x 64 blocks; each right-hand operand is laid out block by block as the
// kernel reads it (bf16: pairs of rows interleaved), so a product over part of its inner dimension is one call over
// consecutive blocks, and causal attention skips the blocks above the diagonal. The backward computes dQ a block of
// queries at a time, and dK, dV a block of keys at a time from the weights and their gradient transposed block by block.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/native/CPUBlas.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <tuple>
#include <type_traits>
#include <vector>

#include "attention_tiles.h"
#include "simd.h"

namespace {

using at::BFloat16;
namespace cpublas = at::native::cpublas;

constexpr int64_t kBlock = 64;  // positions a block holds: the kernel's widest packed operand
constexpr int64_t kHeadStep = 32;  // the head dimension is padded to a multiple of this: blocks of 64 or 32 across it

int64_t padded(int64_t n, int64_t step = kBlock) { return (n + step - 1) / step * step; }

template <typename E>
constexpr bool kPairs = std::is_same_v<E, BFloat16>;  // bf16 operands: the kernel reads B's rows in interleaved pairs

// dst[i] = src[i] * mul for i < n, in E (bf16 rounded as torch rounds).
template <typename E>
inline void to_elem(const float* src, int64_t n, float mul, E* dst) {
  int64_t i = 0;
#if defined(__AVX512F__)
  const __m512 m = _mm512_set1_ps(mul);
  for (; i + 16 <= n; i += 16) aiayn_simd::store16(dst + i, _mm512_mul_ps(_mm512_loadu_ps(src + i), m));
#endif
  for (; i < n; ++i) dst[i] = static_cast<E>(src[i] * mul);
}

// A head of a (B, H, n, D) tensor (rows `row` elements apart) into dst: padded(rows) x padded(d, kHeadStep), zeros beyond.
template <typename E>
void copy_head(const E* src, int64_t row, int64_t rows, int64_t d, E* dst) {
  const int64_t ld = padded(d, kHeadStep);
  std::fill(dst, dst + padded(rows) * ld, E(0.f));
  for (int64_t r = 0; r < rows; ++r) std::memcpy(dst + r * ld, src + r * row, d * sizeof(E));
}

// A right-hand operand B (rows x cols, multiples of the blocks' rb rows and cb columns: 64 or 32) laid out block by
// block: block (i, j) holds B's rows [i rb, (i + 1) rb) and columns [j cb, (j + 1) cb), row-major (fp32) or as pairs of
// rows interleaved (bf16: element (r, c) at ((r / 2) cb + c) 2 + r % 2, the layout torch's cpublas::pack writes, checked
// once: layout_holds); the blocks of a column follow one another, so any run of them is one operand of rows x cb. B is
// src (row-major, ld) or, `transposed`, src^T: a 32-bit word (a bf16 pair, an fp32 element) then moves whole.
template <typename E>
struct Packed {
  std::vector<E> data;
  int64_t rb = kBlock, cb = kBlock, row_blocks = 0, col_blocks = 0;

  void pack(const E* src, int64_t rows, int64_t cols, int64_t ld, bool transposed, int64_t rb_, int64_t cb_) {
    rb = rb_;
    cb = cb_;
    row_blocks = rows / rb;
    col_blocks = cols / cb;
    data.resize(rows * cols);
    for (int64_t i = 0; i < row_blocks; ++i) {
      for (int64_t j = 0; j < col_blocks; ++j) {
        if (transposed) {
          pack_transposed(src + j * cb * ld + i * rb, ld, block(i, j));
        } else {
          pack_rows(src + i * rb * ld + j * cb, ld, block(i, j));
        }
      }
    }
  }
  // A block of B = src: its rows (fp32), or each pair of rows interleaved, element by element (bf16).
  void pack_rows(const E* src, int64_t ld, E* out) const {
    if constexpr (!kPairs<E>) {
      for (int64_t r = 0; r < rb; ++r) std::memcpy(out + r * cb, src + r * ld, cb * sizeof(E));
      return;
    }
    for (int64_t r = 0; r < rb; r += 2) {
      const E *a = src + r * ld, *b = a + ld;
      E* o = out + r * cb;
      int64_t c = 0;
#if defined(__AVX2__)
      for (; c < cb; c += 16) {  // unpacking interleaves within 128-bit lanes: columns 0-3 and 8-11, then 4-7 and 12-15
        const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a + c));
        const __m256i y = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + c));
        const __m256i lo = _mm256_unpacklo_epi16(x, y), hi = _mm256_unpackhi_epi16(x, y);
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(o + 2 * c), _mm256_permute2x128_si256(lo, hi, 0x20));
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(o + 2 * c + 16), _mm256_permute2x128_si256(lo, hi, 0x31));
      }
#endif
      for (; c < cb; ++c) {
        o[2 * c] = a[c];
        o[2 * c + 1] = b[c];
      }
    }
  }
  // A block of B = src^T: B's word p at column c (row p, or bf16's pair of rows 2p and 2p + 1) is src's row c, word p;
  // so the block is the transpose of src's cb x words 32-bit words.
  void pack_transposed(const E* src, int64_t ld, E* out) const {
    constexpr int64_t per_word = sizeof(uint32_t) / sizeof(E);
    const auto* x = reinterpret_cast<const uint32_t*>(src);
    auto* o = reinterpret_cast<uint32_t*>(out);
    const int64_t sx = ld / per_word, words = rb / per_word;  // ld and rb are multiples of 32: whole words
    aiayn_simd::transpose_block(x, cb, words, sx, o, cb);
  }
  E* block(int64_t i, int64_t j) { return data.data() + (j * row_blocks + i) * rb * cb; }
  const E* block(int64_t i, int64_t j) const { return data.data() + (j * row_blocks + i) * rb * cb; }
};

// Whether Packed's layout is the one torch's packing writes on this CPU (a random block of each width, 64 and 32
// columns, against cpublas::pack).
bool layout_holds() {
  for (const int64_t cb : {kBlock, kHeadStep}) {
    const at::Tensor b = at::randn({kBlock, cb}).to(at::kBFloat16);
    at::Tensor theirs = at::empty({kBlock * cb}, b.options());
    cpublas::pack(kBlock, cb, cb, cb, at::kBFloat16, at::kBFloat16, b.const_data_ptr(), theirs.mutable_data_ptr());
    Packed<BFloat16> ours;
    ours.pack(b.const_data_ptr<BFloat16>(), kBlock, cb, cb, false, kBlock, cb);
    if (std::memcmp(ours.data.data(), theirs.const_data_ptr(), kBlock * cb * sizeof(BFloat16)) != 0) return false;
  }
  return true;
}

// c (m rows, ldc fp32) = a (m x inner, lda) b, over b's inner blocks [i0, i1) and column blocks [j0, j1) (written at
// columns j cb of c): one call a column block.
template <typename E>
void product(int64_t m, const E* a, int64_t lda, const Packed<E>& b, int64_t i0, int64_t i1, int64_t j0, int64_t j1, float* c,
             int64_t ldc) {
  for (int64_t j = j0; j < j1; ++j) {
    cpublas::brgemm(m, b.cb, (i1 - i0) * b.rb, lda, b.cb, ldc, false, a + i0 * b.rb, b.block(i0, j), c + j * b.cb, kPairs<E>);
  }
}

// One query's attention weights from its raw scores (row, keys [0, n)), into p (E) up to `width` (a multiple of 16,
// zeros past n); returns the log-sum-exp of the scaled scores. Whole vectors throughout: the lanes past n are computed
// and then overwritten.
template <typename E>
float softmax_row(float* row, int64_t n, int64_t width, float scale, E* p) {
  float m = -INFINITY, sum = 0.f;
  int64_t j = 0;
#if defined(__AVX512F__)
  const int64_t whole = (n + 15) / 16 * 16;
  __m512 mx = _mm512_set1_ps(-INFINITY);
  for (; j + 16 <= n; j += 16) mx = _mm512_max_ps(mx, _mm512_loadu_ps(row + j));
  m = _mm512_reduce_max_ps(mx);
  for (; j < n; ++j) m = std::max(m, row[j]);
  m *= scale;  // the largest scaled score (scale > 0)
  const __m512 mv = _mm512_set1_ps(m), sv = _mm512_set1_ps(scale);
  __m512 acc = _mm512_setzero_ps();
  for (j = 0; j < whole; j += 16) {
    const __mmask16 in = aiayn_simd::tail_mask(j, n);
    const __m512 e = _mm512_maskz_mov_ps(in, aiayn_simd::exp16(_mm512_fmsub_ps(_mm512_loadu_ps(row + j), sv, mv)));
    _mm512_storeu_ps(row + j, e);
    acc = _mm512_add_ps(acc, e);
  }
  sum = _mm512_reduce_add_ps(acc);
  to_elem(row, whole, 1.f / sum, p);
  std::fill(p + whole, p + width, E(0.f));
#else
  for (; j < n; ++j) m = std::max(m, row[j]);
  m *= scale;
  for (j = 0; j < n; ++j) sum += (row[j] = std::exp(row[j] * scale - m));
  to_elem(row, n, 1.f / sum, p);
  std::fill(p + n, p + width, E(0.f));
#endif
  return m + std::log(sum);
}

// The softmax's gradient over one query's row of raw scores s (keys [0, n)) and dp (the gradient of its weights), zeros
// past n up to `width` (a multiple of 16): with w = exp(scale s - lse) (the weight), ds = w (dp - delta) into ds and w
// into w (E). Whole vectors, the lanes past n overwritten with zeros after.
template <typename E>
void gradient_row(float* s, float* dp, int64_t n, int64_t width, float scale, float lse, float delta, E* ds, E* w) {
  int64_t to = n;
#if defined(__AVX512F__)
  to = (n + 15) / 16 * 16;
  const __m512 sv = _mm512_set1_ps(scale), l = _mm512_set1_ps(lse), dl = _mm512_set1_ps(delta);
  for (int64_t j = 0; j < to; j += 16) {
    const __m512 e = aiayn_simd::exp16(_mm512_fmsub_ps(_mm512_loadu_ps(s + j), sv, l));
    _mm512_storeu_ps(s + j, e);
    _mm512_storeu_ps(dp + j, _mm512_mul_ps(e, _mm512_sub_ps(_mm512_loadu_ps(dp + j), dl)));
  }
#else
  for (int64_t j = 0; j < n; ++j) {
    s[j] = std::exp(s[j] * scale - lse);
    dp[j] = s[j] * (dp[j] - delta);
  }
#endif
  to_elem(dp, to, 1.f, ds);
  to_elem(s, to, 1.f, w);
  std::fill(ds + n, ds + width, E(0.f));
  std::fill(w + n, w + width, E(0.f));
}

template <typename T>
const T* head_in(const at::Tensor& x, int64_t bh) {
  return x.const_data_ptr<T>() + (bh / x.size(1)) * x.stride(0) + (bh % x.size(1)) * x.stride(1);
}

// rows x d of an fp32 buffer (ld), times `scale`, into rows [r0, r0 + rows) of a head of x (B, H, n, D) of E.
template <typename E>
void store(const float* src, int64_t ld, int64_t rows, int64_t d, float scale, at::Tensor& x, int64_t bh, int64_t r0) {
  E* dst = x.mutable_data_ptr<E>() + (bh / x.size(1)) * x.stride(0) + (bh % x.size(1)) * x.stride(1) + r0 * x.stride(2);
  for (int64_t r = 0; r < rows; ++r) to_elem(src + r * ld, d, scale, dst + r * x.stride(2));
}

struct Sizes {
  int64_t t, s, d, tp, sp, dp, hb;  // queries, keys, head dimension; each padded to whole blocks; the head dimension's block
  Sizes(int64_t t_, int64_t s_, int64_t d_)
      : t(t_), s(s_), d(d_), tp(padded(t_)), sp(padded(s_)), dp(padded(d_, kHeadStep)), hb(dp % kBlock == 0 ? kBlock : kHeadStep) {}
};

template <typename E>
void forward_heads(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, bool causal, float scale, at::Tensor& out,
                   at::Tensor& lse) {
  const Sizes z(q.size(2), k.size(2), q.size(3));
  float* lse_p = lse.mutable_data_ptr<float>();
  at::parallel_for(0, q.size(0) * q.size(1), 1, [&](int64_t begin, int64_t end) {
    std::vector<E> qb(z.tp * z.dp), kb(z.sp * z.dp), vb(z.sp * z.dp), weights(kBlock * z.sp);
    std::vector<float> scores(kBlock * z.sp), result(kBlock * z.dp);
    Packed<E> kt, vp;
    for (int64_t bh = begin; bh < end; ++bh) {
      copy_head(head_in<E>(q, bh), q.stride(2), z.t, z.d, qb.data());
      copy_head(head_in<E>(k, bh), k.stride(2), z.s, z.d, kb.data());
      copy_head(head_in<E>(v, bh), v.stride(2), z.s, z.d, vb.data());
      kt.pack(kb.data(), z.dp, z.sp, z.dp, true, z.hb, kBlock);  // K^T
      vp.pack(vb.data(), z.sp, z.dp, z.dp, false, kBlock, z.hb);  // V
      for (int64_t i0 = 0; i0 < z.t; i0 += kBlock) {
        const int64_t rows = std::min(kBlock, z.t - i0), width = causal ? padded(std::min(i0 + kBlock, z.s)) : z.sp;
        product(rows, qb.data() + i0 * z.dp, z.dp, kt, 0, kt.row_blocks, 0, width / kBlock, scores.data(), z.sp);  // Q K^T
        for (int64_t r = 0; r < rows; ++r) {
          const int64_t n = causal ? i0 + r + 1 : z.s;
          lse_p[bh * z.t + i0 + r] = softmax_row(scores.data() + r * z.sp, n, width, scale, weights.data() + r * z.sp);
        }
        product(rows, weights.data(), z.sp, vp, 0, width / kBlock, 0, vp.col_blocks, result.data(), z.dp);  // P V
        store<E>(result.data(), z.dp, rows, z.d, 1.f, out, bh, i0);
      }
    }
    cpublas::brgemm_release(kPairs<E>);
  });
}

template <typename E>
void backward_heads(const at::Tensor& grad, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& out,
                    const at::Tensor& lse, bool causal, float scale, at::Tensor& dq, at::Tensor& dk, at::Tensor& dv) {
  const Sizes z(q.size(2), k.size(2), q.size(3));
  const float* lse_p = lse.const_data_ptr<float>();
  at::parallel_for(0, q.size(0) * q.size(1), 1, [&](int64_t begin, int64_t end) {
    // A block of queries' rows of dS and P (E), and both transposed whole (keys x queries) for dK and dV.
    std::vector<E> qb(z.tp * z.dp), kb(z.sp * z.dp), vb(z.sp * z.dp), gb(z.tp * z.dp), ob(z.tp * z.dp), ds_rows(kBlock * z.sp),
        w_rows(kBlock * z.sp), ds_t(z.sp * z.tp), w_t(z.sp * z.tp);
    std::vector<float> scores(kBlock * z.sp), dp(kBlock * z.sp), delta(z.tp, 0.f), result(kBlock * z.dp);
    Packed<E> kt, vt, kp, qp, gp;
    for (int64_t bh = begin; bh < end; ++bh) {
      copy_head(head_in<E>(q, bh), q.stride(2), z.t, z.d, qb.data());
      copy_head(head_in<E>(k, bh), k.stride(2), z.s, z.d, kb.data());
      copy_head(head_in<E>(v, bh), v.stride(2), z.s, z.d, vb.data());
      copy_head(head_in<E>(grad, bh), grad.stride(2), z.t, z.d, gb.data());
      copy_head(head_in<E>(out, bh), out.stride(2), z.t, z.d, ob.data());
      for (int64_t i = 0; i < z.t; ++i) {  // delta_i = dO_i . O_i, the softmax gradient's term of each query
        const E *g = gb.data() + i * z.dp, *o = ob.data() + i * z.dp;
        float sum = 0.f;
        int64_t c = 0;
#if defined(__AVX512F__)
        __m512 acc = _mm512_setzero_ps();
        for (; c + 16 <= z.dp; c += 16) acc = _mm512_fmadd_ps(aiayn_simd::load16(g + c), aiayn_simd::load16(o + c), acc);
        sum = _mm512_reduce_add_ps(acc);
#endif
        for (; c < z.d; ++c) sum += static_cast<float>(g[c]) * static_cast<float>(o[c]);
        delta[i] = sum;
      }
      const float* l = lse_p + bh * z.t;
      // A block of queries at a time: S = Q K^T, dP = dO V^T, then P and dS = P (dP - delta), dQ = scale dS K
      kt.pack(kb.data(), z.dp, z.sp, z.dp, true, z.hb, kBlock);  // K^T, for the scores
      vt.pack(vb.data(), z.dp, z.sp, z.dp, true, z.hb, kBlock);  // V^T, for dP
      kp.pack(kb.data(), z.sp, z.dp, z.dp, false, kBlock, z.hb);  // K, for dQ
      for (int64_t i0 = 0; i0 < z.t; i0 += kBlock) {
        const int64_t rows = std::min(kBlock, z.t - i0), width = causal ? padded(std::min(i0 + kBlock, z.s)) : z.sp;
        product(rows, qb.data() + i0 * z.dp, z.dp, kt, 0, kt.row_blocks, 0, width / kBlock, scores.data(), z.sp);
        product(rows, gb.data() + i0 * z.dp, z.dp, vt, 0, vt.row_blocks, 0, width / kBlock, dp.data(), z.sp);
        for (int64_t r = 0; r < rows; ++r) {
          const int64_t i = i0 + r;
          gradient_row(scores.data() + r * z.sp, dp.data() + r * z.sp, causal ? i + 1 : z.s, width, scale, l[i], delta[i],
                       ds_rows.data() + r * z.sp, w_rows.data() + r * z.sp);
        }
        product(rows, ds_rows.data(), z.sp, kp, 0, width / kBlock, 0, kp.col_blocks, result.data(), z.dp);
        store<E>(result.data(), z.dp, rows, z.d, scale, dq, bh, i0);
        for (int64_t r = rows; r < kBlock; ++r) {  // past the last query: zeros in the transposes
          std::fill(ds_rows.begin() + r * z.sp, ds_rows.begin() + r * z.sp + width, E(0.f));
          std::fill(w_rows.begin() + r * z.sp, w_rows.begin() + r * z.sp + width, E(0.f));
        }
        for (int64_t j = 0; j < width; j += kBlock) {  // every block of keys these queries see (the others are never read)
          aiayn_simd::transpose_block(ds_rows.data() + j, kBlock, kBlock, z.sp, ds_t.data() + j * z.tp + i0, z.tp);
          aiayn_simd::transpose_block(w_rows.data() + j, kBlock, kBlock, z.sp, w_t.data() + j * z.tp + i0, z.tp);
        }
      }
      // A block of keys at a time, over the queries that see them: dK = scale dS^T Q, dV = P^T dO
      qp.pack(qb.data(), z.tp, z.dp, z.dp, false, kBlock, z.hb);
      gp.pack(gb.data(), z.tp, z.dp, z.dp, false, kBlock, z.hb);
      for (int64_t j0 = 0; j0 < z.s; j0 += kBlock) {
        const int64_t rows = std::min(kBlock, z.s - j0), first = causal ? j0 / kBlock : 0, last = z.tp / kBlock;
        product(rows, ds_t.data() + j0 * z.tp, z.tp, qp, first, last, 0, qp.col_blocks, result.data(), z.dp);
        store<E>(result.data(), z.dp, rows, z.d, scale, dk, bh, j0);
        product(rows, w_t.data() + j0 * z.tp, z.tp, gp, first, last, 0, gp.col_blocks, result.data(), z.dp);
        store<E>(result.data(), z.dp, rows, z.d, 1.f, dv, bh, j0);
      }
    }
    cpublas::brgemm_release(kPairs<E>);
  });
}

}  // namespace

namespace aiayn_tiles {

bool pairs_ready() {
  static const bool ready = cpublas::could_pack(at::kBFloat16) && layout_holds();
  return ready;
}

void forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, bool causal, float scale, at::Tensor& out, at::Tensor& lse) {
  if (q.scalar_type() == at::kFloat) {
    forward_heads<float>(q, k, v, causal, scale, out, lse);
  } else {
    forward_heads<BFloat16>(q, k, v, causal, scale, out, lse);
  }
}

void backward(const at::Tensor& grad, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& out,
              const at::Tensor& lse, bool causal, float scale, at::Tensor& dq, at::Tensor& dk, at::Tensor& dv) {
  if (q.scalar_type() == at::kFloat) {
    backward_heads<float>(grad, q, k, v, out, lse, causal, scale, dq, dk, dv);
  } else {
    backward_heads<BFloat16>(grad, q, k, v, out, lse, causal, scale, dq, dk, dv);
  }
}

}  // namespace aiayn_tiles

TORCH_LIBRARY_FRAGMENT(aiayn_native, m) {
  m.def("attention_tiles_available() -> bool", &aiayn_tiles::pairs_ready);  // bf16's; fp32 runs wherever the library built
}
