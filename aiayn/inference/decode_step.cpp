// One decoding step of a decoder-only stack in C++: the layers of section 3.1 for one new token per row, over a static
// key/value cache (aiayn/decoding/native_step.py builds it and says when it applies).
//
// The eager step runs the same operators through a few dozen Python modules a layer; with GPT-2 small's weights
// streaming through the caches, the Python between them took 3-5 ms of a 20 ms fp32 token on an AMX Xeon, where
// Inductor's compiled step spends 2. Here the loop over layers and the operators' calls are C++: each layer calls the
// kernels the model's own layers chose at load (our matrix-vector product, oneDNN's packed weight, MKL through
// at::linear, torch's int4 kernel), the one-query attention chosen at load, and torch's norms, in the order
// TransformerLayer.forward calls them, so the logits are those of the eager step. Where a call takes our matrix-vector
// product, the residual connection after it and the activation after the feed-forward's first product ride in its
// epilogue (gemv.cpp: gemv_add_, gemv_activation), with the bits of the operators they replace.
//
// The plan is read once from flat lists (tensors, integers, floats) that the Python side writes in the same order as
// Reader reads them below. Weights are held by reference: in-place changes to them are seen; the derived tensors
// (a packed weight, int4's layout) are those of the time the plan was built.

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/custom_class.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace {

using Tensors = std::vector<std::optional<at::Tensor>>;

// How one Linear layer computes one row (aiayn/decoding/native_step.py: LINEAR_KINDS).
enum LinearKind : int64_t { kPlain = 1, kGemv = 2, kPacked = 3, kInt4 = 4, kInt8 = 5, kFew = 6, kInt4Widened = 7 };
enum NormKind : int64_t { kLayerNorm = 0, kRMSNorm = 1, kNativeLayerNorm = 2, kNativeRMSNorm = 3 };  // torch's; ours (norm.cpp)
enum Activation : int64_t { kRelu = 0, kGelu = 1, kGeluTanh = 2, kGeluTanhNative = 3, kSilu = 4, kSwiGLU = 5, kRelu2 = 6 };
enum Attention : int64_t { kNative = 0, kSdpa = 1, kMath = 2 };

struct Reader {
  const Tensors& tensors;
  const std::vector<int64_t>& ints;
  const std::vector<double>& floats;
  size_t t = 0, i = 0, f = 0;

  std::optional<at::Tensor> tensor() {
    TORCH_CHECK(t < tensors.size(), "aiayn_native::DecodeStep: the plan has too few tensors");
    return tensors[t++];
  }
  int64_t integer() {
    TORCH_CHECK(i < ints.size(), "aiayn_native::DecodeStep: the plan has too few integers");
    return ints[i++];
  }
  double real() {
    TORCH_CHECK(f < floats.size(), "aiayn_native::DecodeStep: the plan has too few floats");
    return floats[f++];
  }
  void done() const {
    TORCH_CHECK(t == tensors.size() && i == ints.size() && f == floats.size(), "aiayn_native::DecodeStep: the plan has ",
                tensors.size() - t, " tensors, ", ints.size() - i, " integers and ", floats.size() - f, " floats left over");
  }
};

struct Linear {
  int64_t kind = 0, param = 0, out = 0;  // kind: a LinearKind, 0 before read  // param: the prefetch distance (gemv) or the group size (int4)
  int64_t few = 0;  // kFew: the most rows a call takes through our kernel; more take `beyond`
  std::shared_ptr<const Linear> beyond;
  at::Tensor weight;
  std::optional<at::Tensor> scale, bias;  // scale: int8's per row, int4's scales and zeros

  static Linear read(Reader& r) {
    Linear l;
    l.kind = r.integer();
    l.param = r.integer();
    l.out = r.integer();
    if (l.kind == kFew) l.few = r.integer();
    auto w = r.tensor();
    if (w.has_value()) l.weight = *w;
    l.scale = r.tensor();
    l.bias = r.tensor();
    TORCH_CHECK(l.weight.defined(), "aiayn_native::DecodeStep: a Linear layer without its weight");
    if (l.kind == kFew || l.kind == kInt4Widened) l.beyond = std::make_shared<const Linear>(read(r));  // the record after it
    return l;
  }
};

using NormFn = at::Tensor(const at::Tensor&, const std::optional<at::Tensor>&, const std::optional<at::Tensor>&, double, bool);
const c10::TypedOperatorHandle<NormFn>& norm_op() {
  static const auto op = c10::Dispatcher::singleton().findSchemaOrThrow("aiayn_native::norm", "").typed<NormFn>();
  return op;
}

struct Norm {
  int64_t kind = kLayerNorm;
  double eps = 1e-5;  // < 0: RMSNorm's default (the dtype's machine epsilon)
  std::optional<at::Tensor> weight, bias;

  static Norm read(Reader& r) {
    Norm n;
    n.kind = r.integer();
    n.eps = r.real();
    n.weight = r.tensor();
    n.bias = r.tensor();
    return n;
  }

  at::Tensor operator()(const at::Tensor& x) const {
    const int64_t d = x.size(-1);
    if (kind == kNativeLayerNorm || kind == kNativeRMSNorm) return norm_op().call(x, weight, bias, eps, kind == kNativeRMSNorm);
    if (kind == kRMSNorm) return at::rms_norm(x, {d}, weight, eps < 0 ? std::nullopt : std::optional<double>(eps));
    return std::get<0>(at::native_layer_norm(x, {d}, weight, bias, eps));  // what at::layer_norm calls
  }
};

struct Layer {
  Norm attention_norm, ffn_norm, q_norm, k_norm;  // q_norm, k_norm: each head's RMSNorm with QK norm
  Linear qkv, o, up, down;  // up: w_1, or SwiGLU's w_gate and w_1 fused at load (w_gate_up)
  int64_t activation = kRelu, attention = kSdpa, attention_many = kSdpa;  // one query's backend; a few queries' (a check)
};

using GemvFn = at::Tensor(const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&, const std::optional<at::Tensor>&,
                          int64_t);
using AttendFn = at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&, double, bool);
using GeluFn = at::Tensor(const at::Tensor&);

const c10::TypedOperatorHandle<GemvFn>& gemv_op() {
  static const auto op = c10::Dispatcher::singleton().findSchemaOrThrow("aiayn_native::gemv", "").typed<GemvFn>();
  return op;
}

using GemvActivationFn = at::Tensor(const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&,
                                    const std::optional<at::Tensor>&, int64_t, c10::string_view);
const c10::TypedOperatorHandle<GemvActivationFn>& gemv_activation_op() {
  static const auto op = c10::Dispatcher::singleton().findSchemaOrThrow("aiayn_native::gemv_activation", "").typed<GemvActivationFn>();
  return op;
}

using GemvAddFn = at::Tensor&(at::Tensor&, const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&,
                              const std::optional<at::Tensor>&, int64_t);
const c10::TypedOperatorHandle<GemvAddFn>& gemv_add_op() {
  static const auto op = c10::Dispatcher::singleton().findSchemaOrThrow("aiayn_native::gemv_add_", "").typed<GemvAddFn>();
  return op;
}

const c10::TypedOperatorHandle<AttendFn>& attend_one_op() {
  static const auto op = c10::Dispatcher::singleton().findSchemaOrThrow("aiayn_native::attend_one", "").typed<AttendFn>();
  return op;
}

using ArgmaxFn = at::Tensor(const at::Tensor&);
const c10::TypedOperatorHandle<ArgmaxFn>& argmax_op() {
  static const auto op = c10::Dispatcher::singleton().findSchemaOrThrow("aiayn_native::argmax_last", "").typed<ArgmaxFn>();
  return op;
}

const c10::TypedOperatorHandle<GeluFn>& gelu_tanh_op() {
  static const auto op = c10::Dispatcher::singleton().findSchemaOrThrow("aiayn_native::gelu_tanh", "").typed<GeluFn>();
  return op;
}

// Write the new keys (or values) of each row, heads (B, T, heads * Dh) at `offset` of the fused projection's rows, at
// columns `column` .. `column + T - 1` of the cache buffer (B, heads, max_len, Dh): plain copies, where views and copy_
// took 8 operators a layer; a buffer of the other dtype (a cache kept in bf16 under fp32 activations, or the reverse)
// gets each element converted as torch's copy_ converts it (to bf16: rounded to the nearest, ties to even).
void write_column(const at::Tensor& projected, int64_t offset, at::Tensor& buffer, int64_t column, int64_t head_dim) {
  const at::ScalarType from_type = projected.scalar_type(), to_type = buffer.scalar_type();
  const bool same = from_type == to_type;
  TORCH_CHECK((same || ((from_type == at::kFloat || from_type == at::kBFloat16) && (to_type == at::kFloat || to_type == at::kBFloat16))) &&
              buffer.stride(3) == 1 && projected.is_contiguous(), "aiayn_native::DecodeStep: a cache buffer of ", to_type,
              " with its last dimension contiguous, got ", from_type, " projections");
  const int64_t from_size = projected.element_size(), to_size = buffer.element_size(), row = projected.size(-1), length = projected.size(1);
  const char* from = static_cast<const char*>(projected.const_data_ptr());
  char* to = static_cast<char*>(buffer.mutable_data_ptr());
  for (int64_t b = 0; b < buffer.size(0); ++b) {
    for (int64_t t = 0; t < length; ++t) {
      for (int64_t h = 0; h < buffer.size(1); ++h) {
        char* into = to + (b * buffer.stride(0) + h * buffer.stride(1) + (column + t) * buffer.stride(2)) * to_size;
        const char* head = from + ((b * length + t) * row + offset + h * head_dim) * from_size;
        if (same) {
          std::memcpy(into, head, head_dim * to_size);
        } else if (to_type == at::kBFloat16) {
          const float* x = reinterpret_cast<const float*>(head);
          at::BFloat16* y = reinterpret_cast<at::BFloat16*>(into);
          for (int64_t d = 0; d < head_dim; ++d) y[d] = static_cast<at::BFloat16>(x[d]);
        } else {
          const at::BFloat16* x = reinterpret_cast<const at::BFloat16*>(head);
          float* y = reinterpret_cast<float*>(into);
          for (int64_t d = 0; d < head_dim; ++d) y[d] = static_cast<float>(x[d]);
        }
      }
    }
  }
}

// Rotary positions (RoPE, the two halves of each head paired, as aiayn.nn.positional.RotaryPositions rotates):
// y = x * cos + rotate_half(x) * sin in fp32, rounded to x's dtype, for `heads` heads of `dim` features from `from`
// (contiguous heads) into `to` (heads `to_head` elements apart); cos and sin (dim,) fp32 of this row's position.
template <typename F, typename T>
void rotate_heads(const F* from, T* to, int64_t heads, int64_t dim, int64_t to_head, const float* cos, const float* sin) {
  const int64_t half = dim / 2;
  for (int64_t h = 0; h < heads; ++h) {
    const F* x = from + h * dim;
    T* y = to + h * to_head;
    for (int64_t i = 0; i < half; ++i) {
      const float a = static_cast<float>(x[i]), b = static_cast<float>(x[i + half]);
      // rounded to x's dtype, then (a cache of another dtype) converted to the buffer's, as the eager step's copy_ does
      y[i] = static_cast<T>(static_cast<F>(a * cos[i] + (-b) * sin[i]));
      y[i + half] = static_cast<T>(static_cast<F>(b * cos[i + half] + a * sin[i + half]));
    }
  }
}

// Heads (B, T, heads * Dh) at `offset` of the fused projection's rows, rotated by each position's angles (cos and sin
// (B or 1, 1, T, Dh)), into `to` (B, heads, S, Dh) at columns `column` .. (the queries: a (B, H, T, Dh) tensor; keys:
// the cache).
void rotate_into(const at::Tensor& projected, int64_t offset, at::Tensor& to, int64_t column, int64_t head_dim, const at::Tensor& cos,
                 const at::Tensor& sin) {
  TORCH_CHECK((projected.scalar_type() == at::kFloat || projected.scalar_type() == at::kBFloat16) &&
              (to.scalar_type() == at::kFloat || to.scalar_type() == at::kBFloat16), "aiayn_native::DecodeStep: rotary positions ",
              "in float32 or bfloat16, got ", projected.scalar_type(), " into ", to.scalar_type());
  const int64_t row = projected.size(-1), length = projected.size(1);
  for (int64_t bt = 0; bt < to.size(0) * length; ++bt) {
    const int64_t b = bt / length, t = bt % length;
    const int64_t angle_row = (cos.size(0) == 1 ? 0 : b) * length + t;
    const float* c = cos.const_data_ptr<float>() + angle_row * head_dim;
    const float* s = sin.const_data_ptr<float>() + angle_row * head_dim;
    const int64_t from = bt * row + offset, into = b * to.stride(0) + (column + t) * to.stride(2);
    auto into_typed = [&](const auto* x) {  // the projection's elements x into `to`'s type
      if (to.scalar_type() == at::kFloat) {
        rotate_heads(x + from, to.mutable_data_ptr<float>() + into, to.size(1), head_dim, to.stride(1), c, s);
      } else {
        rotate_heads(x + from, to.mutable_data_ptr<at::BFloat16>() + into, to.size(1), head_dim, to.stride(1), c, s);
      }
    };
    if (projected.scalar_type() == at::kFloat) {
      into_typed(projected.const_data_ptr<float>());
    } else {
      into_typed(projected.const_data_ptr<at::BFloat16>());
    }
  }
}

// A weight-only quantised matmul's epilogue, as Int8Linear and Int4Linear write it: the bias added in its own dtype,
// then back to x's dtype and shape.
at::Tensor finish(at::Tensor out, const Linear& l, const at::Tensor& x) {
  if (out.size(-1) != l.out) out = out.narrow(-1, 0, l.out);
  if (l.bias.has_value()) out = out + *l.bias;
  std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end());
  shape.back() = l.out;
  return out.to(x.scalar_type()).reshape(shape);
}

at::ScalarType compute_dtype(const at::Tensor& x) {
  return x.scalar_type() == at::kBFloat16 || x.scalar_type() == at::kHalf ? x.scalar_type() : at::kBFloat16;
}

at::Tensor linear(const at::Tensor& x, const Linear& l) {
  switch (l.kind) {
    case kGemv:
      return gemv_op().call(x, l.weight, l.scale, l.bias, l.param);
    case kPlain:
      return at::linear(x, l.weight, l.bias);
    case kPacked: {
      static const auto op = c10::Dispatcher::singleton().findSchemaOrThrow("mkldnn::_linear_pointwise", "");
      torch::jit::Stack stack{x, l.weight, l.bias.has_value() ? c10::IValue(*l.bias) : c10::IValue(), std::string("none"),
                              c10::List<std::optional<at::Scalar>>(), c10::IValue(std::string(""))};
      op.callBoxed(&stack);
      return stack.back().toTensor();
    }
    case kInt4: {
      const at::Tensor flat = x.reshape({-1, x.size(-1)}).to(compute_dtype(x)).contiguous();
      return finish(at::_weight_int4pack_mm_for_cpu(flat, l.weight, l.param, l.scale->to(flat.scalar_type())), l, x);
    }
    case kInt4Widened: {  // more rows than `param` (a prompt): the codes widened to the activations' dtype, each group's
                          // scale and least value applied, one matmul (Int4Linear.forward's dequantized_int4_mm: the same
                          // ops); fewer: the call `beyond`
      if (x.numel() <= l.param * x.size(-1) || compute_dtype(x) != at::kBFloat16) return linear(x, *l.beyond);  // as widens()
      const at::Tensor flat = x.reshape({-1, x.size(-1)}).to(compute_dtype(x)).contiguous();
      const int64_t n = l.weight.size(0), groups = l.scale->size(2), k = 2 * l.weight.size(1);
      const at::Tensor scale = l.scale->to(flat.scalar_type());
      const at::Tensor w = at::stack({at::bitwise_and(l.weight, 15), at::bitwise_right_shift(l.weight, 4)}, -1)
                               .view({n, groups, k / groups}).to(flat.scalar_type())
                               .mul_(scale.select(1, 0).unsqueeze(-1)).add_(scale.select(1, 1).unsqueeze(-1)).view({n, k});
      return finish(at::mm(flat, w.t()), l, x);
    }
    case kFew:  // several rows: our kernel (each weight row read once for all) up to `few` rows, more (a prompt) beyond
      if (x.numel() <= l.few * x.size(-1)) return gemv_op().call(x, l.weight, l.scale, l.bias, l.param);
      return linear(x, *l.beyond);
    case kInt8: {  // param > 0: more rows than that (a prompt) take the weight widened to the activations' dtype and one
                   // matmul, where that was timed faster (Int8Linear.forward's dequantized_mm: the same ops)
      const at::Tensor flat = x.reshape({-1, x.size(-1)}).to(compute_dtype(x)).contiguous();
      const at::Tensor scale = l.scale->to(flat.scalar_type());
      if (l.param > 0 && flat.size(0) > l.param && flat.scalar_type() == at::kBFloat16) {  // as quantization.widens() decides
        return finish(at::mm(flat, l.weight.to(flat.scalar_type()).t()).mul_(scale), l, x);
      }
      return finish(at::_weight_int8pack_mm(flat, l.weight, scale), l, x);
    }
    default:
      TORCH_CHECK(false, "aiayn_native::DecodeStep: unknown Linear kind ", l.kind);
  }
}

// Whether linear(in, l) is a call of our matrix-vector product (aiayn_native::gemv), whose epilogues can take the
// operator after it (gemv.cpp).
bool takes_ours(const at::Tensor& in, const Linear& l) {
  return l.kind == kGemv || (l.kind == kFew && in.numel() <= l.few * in.size(-1));
}

// x += linear(in, l), in place (a residual connection): through our kernel's epilogue where this call takes our kernel
// (gemv_add_: no operator, allocation or pass of its own, the same bits), else the product and torch's add_.
void add_linear(at::Tensor& x, const at::Tensor& in, const Linear& l) {
  if (takes_ours(in, l) && x.is_contiguous()) {
    gemv_add_op().call(x, in, l.weight, l.scale, l.bias, l.param);
  } else {
    x.add_(linear(in, l));
  }
}

class DecodeStep : public torch::CustomClassHolder {
 public:
  DecodeStep(Tensors tensors, std::vector<int64_t> ints, std::vector<double> floats) {
    Reader r{tensors, ints, floats};
    n_heads_ = r.integer();
    n_kv_heads_ = r.integer();
    head_dim_ = r.integer();
    pre_norm_ = r.integer() != 0;
    has_final_norm_ = r.integer() != 0;
    rotary_ = r.integer() != 0;
    qk_norm_ = r.integer() != 0;
    const int64_t n_layers = r.integer();
    few_queries_ = r.integer();
    TORCH_CHECK(n_heads_ > 0 && n_kv_heads_ > 0 && n_heads_ % n_kv_heads_ == 0 && head_dim_ > 0 && n_layers >= 0,
                "aiayn_native::DecodeStep: heads ", n_heads_, ", key/value heads ", n_kv_heads_, ", head dim ", head_dim_);
    for (int64_t i = 0; i < n_layers; ++i) {
      Layer layer;
      layer.attention_norm = Norm::read(r);
      layer.ffn_norm = Norm::read(r);
      if (qk_norm_) {
        layer.q_norm = Norm::read(r);
        layer.k_norm = Norm::read(r);
      }
      layer.qkv = Linear::read(r);
      layer.o = Linear::read(r);
      layer.up = Linear::read(r);
      layer.down = Linear::read(r);
      layer.activation = r.integer();
      layer.attention = r.integer();
      layer.attention_many = r.integer();
      layers_.push_back(std::move(layer));
    }
    if (has_final_norm_) final_norm_ = Norm::read(r);
    if (r.integer() != 0) {  // the output projection, where its kind is known here: as the plan's rows call it, and one row
      output_ = Linear::read(r);
      output_one_ = Linear::read(r);
    }
    if (r.integer() != 0) {  // the embeddings: the token table (times its scale) plus a learned position table, or none
      embed_ = r.tensor();
      embed_scale_ = r.real();
      positions_ = r.tensor();
      TORCH_CHECK(embed_.has_value() && embed_->dim() == 2, "aiayn_native::DecodeStep: the embeddings need the token table");
    }
    r.done();
  }

  // input -> (B, T, D) after the last layer (and the final norm), or the logits (B, T, V) where the plan holds the output
  // projection (of the last `keep` positions only where keep > 0: a prompt's last, the one it generates from), and, with the
  // logits of one position a row (fp32 or bf16), each row's largest (argmax.cpp: greedy's pick, made here while the logits
  // are in the cache; else None): T new positions per row (one, decoding; a few, speculative decoding's check; a prompt). input: the token ids (B, T)
  // at positions `offset` ((B,) or (1,) long) where the plan holds the embeddings, else x (B, T, D) after them (offset
  // None). cache: each layer's key and value buffers (B, Hkv, max_len, Dh), layer by layer; columns: each layer's next
  // column (a one-element long tensor, advanced here); key_mask: None or bool (B, W) with W >= the columns filled after
  // this call, True = may attend; cos and sin: rotary positions' angles at each row's positions (B or 1, 1, T, Dh), None
  // without them.
  std::tuple<at::Tensor, std::optional<at::Tensor>> run(at::Tensor input, std::optional<at::Tensor> offset, std::vector<at::Tensor> cache, std::vector<at::Tensor> columns,
                 std::optional<at::Tensor> key_mask, std::optional<at::Tensor> cos, std::optional<at::Tensor> sin, int64_t keep) {
    const int64_t n = static_cast<int64_t>(layers_.size());
    TORCH_CHECK(static_cast<int64_t>(columns.size()) == n, "aiayn_native::DecodeStep: ", n, " layers take ", n, " columns, got ",
                columns.size());
    return output(forward(embed(input, offset), cache, &columns, key_mask, cos, sin), keep);
  }

  // The same over growing caches (LayerCache: keys and values (B, Hkv, S, Dh) of every position so far): each layer's
  // new keys and values are appended (torch.cat, as LayerCache.update does); returns its result and the caches' new
  // tensors, in the order of `cache`, for the caller to hold. key_mask: None or bool (B, S + T).
  std::tuple<at::Tensor, std::optional<at::Tensor>, std::vector<at::Tensor>> run_growing(at::Tensor input, std::optional<at::Tensor> offset,
                                                               std::vector<at::Tensor> cache, std::optional<at::Tensor> key_mask,
                                                               std::optional<at::Tensor> cos, std::optional<at::Tensor> sin, int64_t keep) {
    auto [out, best] = output(forward(embed(input, offset), cache, nullptr, key_mask, cos, sin), keep);
    return {out, best, cache};
  }

  // Whether the plan holds the embeddings (run takes token ids) and the output projection (run gives logits).
  bool embeds() const { return embed_.has_value(); }
  bool projects() const { return output_.has_value(); }

 private:
  // The token ids (B, T) at positions offset .. offset + T - 1 of each row -> x (B, T, D), as DecoderOnly embeds them:
  // the token table's rows times its scale, plus the learned positions' rows (a negative position, left padding, reads
  // row 0). Ids outside the vocabulary and positions past the table are errors, worded as the model words them. x
  // embedded by the caller (offset None) passes through.
  at::Tensor embed(const at::Tensor& input, const std::optional<at::Tensor>& offset) const {
    if (!offset.has_value()) return input;  // x, embedded by the caller (any plan takes it)
    TORCH_CHECK(embed_.has_value(), "aiayn_native::DecodeStep: this plan takes x after the embeddings, not ids and offsets");
    TORCH_CHECK(input.scalar_type() == at::kLong && input.dim() == 2 && input.is_contiguous() &&
                offset->scalar_type() == at::kLong && offset->dim() == 1 && offset->is_contiguous() &&
                (offset->size(0) == 1 || offset->size(0) == input.size(0)), "aiayn_native::DecodeStep: ids (B, T) long and offset ",
                "(B or 1,) long, got ", input.scalar_type(), " ", input.sizes(), " and ", offset->scalar_type(), " ", offset->sizes());
    const int64_t vocab = embed_->size(0), length = input.size(1);
    const int64_t* id = input.const_data_ptr<int64_t>();
    for (int64_t i = 0; i < input.numel(); ++i) {
      TORCH_CHECK_VALUE(id[i] < vocab, "ids holds token id ", id[i], ", outside the vocabulary of vocab_size=", vocab);
      TORCH_CHECK_VALUE(id[i] >= 0, "ids holds negative token id ", id[i], "; ids must be in [0, vocab_size=", vocab, ")");
    }
    at::Tensor x = at::embedding(*embed_, input);
    if (embed_scale_ != 1.0) x = x * embed_scale_;
    if (!positions_.has_value()) return x;
    const int64_t rows = offset->size(0), max_len = positions_->size(0);
    at::Tensor at_positions = at::empty({rows * length}, offset->options());
    int64_t* p = at_positions.mutable_data_ptr<int64_t>();
    for (int64_t b = 0; b < rows; ++b) {
      const int64_t start = offset->const_data_ptr<int64_t>()[b];
      TORCH_CHECK_VALUE(start + length <= max_len, "sequence of length ", start + length, " is longer than the learned positions' ",
                        "max_len=", max_len);
      for (int64_t t = 0; t < length; ++t) p[b * length + t] = std::max<int64_t>(start + t, 0);
    }
    return x + positions_->index_select(0, at_positions).view({rows, length, x.size(2)}).to(x.scalar_type());
  }

  // After the final norm: the logits through the output projection where the plan holds it (of the last `keep`
  // positions where 0 < keep < T: a prompt's other positions would read the whole output weight for logits no one
  // uses), and their argmax where they are one position a row of fp32 or bf16 (greedy's pick; sampling ignores it).
  std::tuple<at::Tensor, std::optional<at::Tensor>> output(const at::Tensor& x, int64_t keep) const {
    TORCH_CHECK(keep >= 0, "aiayn_native::DecodeStep: keep is a number of last positions, 0 (all) or more, got ", keep);
    if (!output_.has_value()) return {x, std::nullopt};
    const at::Tensor kept = keep > 0 && keep < x.size(1) ? x.narrow(1, x.size(1) - keep, keep).contiguous() : x;
    at::Tensor logits = linear(kept, kept.numel() == kept.size(-1) ? *output_one_ : *output_);  // one row: its own kernel
    if (logits.size(1) != 1 || (logits.scalar_type() != at::kFloat && logits.scalar_type() != at::kBFloat16)) return {logits, std::nullopt};
    return {logits, argmax_op().call(logits.view({logits.size(0), logits.size(2)}))};
  }

  // The layers: `columns` each static cache's next column (nullptr: the caches grow, and `cache` gets their new tensors).
  at::Tensor forward(at::Tensor x, std::vector<at::Tensor>& cache, std::vector<at::Tensor>* columns, const std::optional<at::Tensor>& key_mask,
                     const std::optional<at::Tensor>& cos, const std::optional<at::Tensor>& sin) const {
    // Below autograd: the step runs under no_grad and records nothing, so each operator skips the autograd and
    // view-tracking layers of the dispatcher (a few hundred calls a token).
    const at::AutoDispatchBelowADInplaceOrView below_autograd;
    const int64_t n = static_cast<int64_t>(layers_.size());
    TORCH_CHECK(static_cast<int64_t>(cache.size()) == 2 * n, "aiayn_native::DecodeStep: ", n, " layers take ", 2 * n,
                " cache tensors, got ", cache.size());
    TORCH_CHECK(x.dim() == 3 && x.size(1) >= 1, "aiayn_native::DecodeStep: x must be (B, T, D), got ", x.sizes());
    const int64_t batch = x.size(0), length = x.size(1), q_width = n_heads_ * head_dim_, kv_width = n_kv_heads_ * head_dim_;
    const double scale = 1.0 / std::sqrt(static_cast<double>(head_dim_));
    TORCH_CHECK(cos.has_value() == rotary_ && sin.has_value() == rotary_, "aiayn_native::DecodeStep: cos and sin go with rotary ",
                "positions, and only with them");
    if (rotary_) {
      for (const at::Tensor* t : {&*cos, &*sin}) {
        TORCH_CHECK(t->scalar_type() == at::kFloat && t->is_contiguous() && t->dim() == 4 && (t->size(0) == 1 || t->size(0) == batch) &&
                    t->size(1) == 1 && t->size(2) == length && t->size(3) == head_dim_, "aiayn_native::DecodeStep: cos and sin must be ",
                    "contiguous float32 (B or 1, 1, ", length, ", ", head_dim_, "), got ", t->scalar_type(), " ", t->sizes());
      }
    }
    for (int64_t i = 0; i < n; ++i) {
      const Layer& layer = layers_[i];
      at::Tensor& keys = cache[2 * i];
      at::Tensor& values = cache[2 * i + 1];
      TORCH_CHECK(keys.dim() == 4 && values.sizes() == keys.sizes() && keys.size(0) == batch && keys.size(1) == n_kv_heads_ &&
                  keys.size(3) == head_dim_, "aiayn_native::DecodeStep: layer ", i, "'s cache: keys and values (", batch, ", ",
                  n_kv_heads_, ", S, ", head_dim_, "), got ", keys.sizes(), " and ", values.sizes());
      int64_t* next = nullptr;
      int64_t column = keys.size(2);  // growing: the new positions go after the cached ones
      if (columns != nullptr) {
        at::Tensor& held = (*columns)[i];
        TORCH_CHECK(held.scalar_type() == at::kLong && held.numel() == 1 && held.is_cpu(), "aiayn_native::DecodeStep: layer ", i,
                    "'s column must be a one-element long tensor, got ", held.sizes());
        next = held.mutable_data_ptr<int64_t>();
        column = *next;
        TORCH_CHECK_VALUE(column + length <= keys.size(2), "static cache holds max_len=", keys.size(2), " positions, asked for ",
                          column + length);
      }
      const int64_t filled = column + length;
      // Self-attention (section 3.2.2): one fused Q/K/V projection, split into heads; the new keys and values written at
      // the next columns; each query attends over the columns filled up to its own.
      const at::Tensor qkv = linear(pre_norm_ ? layer.attention_norm(x) : x, layer.qkv).contiguous();
      // The queries' and the new keys' heads: in the projection's rows, or RMS-normalised per head first (QK norm)
      at::Tensor q_in = qkv, k_in = qkv;
      int64_t k_at = q_width;
      if (qk_norm_) {
        q_in = layer.q_norm(qkv.narrow(-1, 0, q_width).view({batch, length, n_heads_, head_dim_})).view({batch, length, q_width});
        k_in = layer.k_norm(qkv.narrow(-1, q_width, kv_width).view({batch, length, n_kv_heads_, head_dim_})).view({batch, length, kv_width});
        k_at = 0;
      }
      const int64_t row = q_in.size(-1);
      // Where the new keys and values go: the static buffers at `column`, or tensors of T columns appended below.
      at::Tensor key_into = keys, value_into = values;
      const int64_t into = next != nullptr ? column : 0;
      if (next == nullptr) {
        key_into = at::empty({batch, n_kv_heads_, length, head_dim_}, keys.options());  // the cache's dtype
        value_into = at::empty({batch, n_kv_heads_, length, head_dim_}, values.options());
      }
      at::Tensor q;
      if (rotary_) {  // the queries and the new keys rotated by their positions (the values are not)
        q = at::empty({batch, n_heads_, length, head_dim_}, qkv.options());
        rotate_into(q_in, 0, q, 0, head_dim_, *cos, *sin);
        rotate_into(k_in, k_at, key_into, into, head_dim_, *cos, *sin);
      } else {
        q = q_in.as_strided({batch, n_heads_, length, head_dim_}, {length * row, head_dim_, row, 1}, q_in.storage_offset());
        write_column(k_in, k_at, key_into, into, head_dim_);
      }
      write_column(qkv, q_width + kv_width, value_into, into, head_dim_);
      if (next != nullptr) {
        *next = filled;
      } else {
        keys = at::cat({keys, key_into}, 2);
        values = at::cat({values, value_into}, 2);
      }
      std::optional<at::Tensor> mask;
      if (key_mask.has_value()) mask = key_mask->narrow(1, 0, filled).view({batch, 1, 1, filled});
      // several queries: a check's few as planned; a native plan's more (a prompt) fall back to torch's, as the eager rule does
      const int64_t many = layer.attention_many == kNative && length > few_queries_ ? kSdpa : layer.attention_many;
      const int64_t kind = length == 1 ? layer.attention : many;
      const at::Tensor heads = attend(kind, q, filled_part(keys, filled),
                                      filled_part(values, filled), mask, scale);
      // (B, H, T, Dh) -> (B, T, H * Dh): one view where the result is already in that order (one query, contiguous)
      const at::Tensor merged = length == 1 && heads.is_contiguous() ? heads.view({batch, 1, q_width})
                                                                      : heads.transpose(1, 2).reshape({batch, length, q_width});
      // Residual connections, added in place after the first (x is then this step's own tensor, not the caller's)
      if (i == 0) {
        x = x + linear(merged, layer.o);
      } else {
        add_linear(x, merged, layer.o);
      }
      if (!pre_norm_) x = layer.attention_norm(x);
      // Position-wise feed-forward (section 3.3).
      add_linear(x, hidden_layer(layer, pre_norm_ ? layer.ffn_norm(x) : x), layer.down);
      if (!pre_norm_) x = layer.ffn_norm(x);
    }
    return has_final_norm_ ? final_norm_(x) : x;
  }

  // The first `filled` columns of a cache buffer (B, Hkv, max_len, Dh): one view.
  static at::Tensor filled_part(const at::Tensor& buffer, int64_t filled) {
    return buffer.as_strided({buffer.size(0), buffer.size(1), filled, buffer.size(3)}, buffer.strides(), buffer.storage_offset());
  }

  // T queries (B, H, T, Dh) over the S filled keys, the last T of them the queries' own positions: causal, aligned to the
  // lower right, and the padding mask (B, 1, 1, S) if any; through the backend `kind` (one query: the one timed at load).
  at::Tensor attend(int64_t kind, const at::Tensor& q, at::Tensor k, at::Tensor v, std::optional<at::Tensor> mask, double scale) const {
    const int64_t length = q.size(2), keys = k.size(2);
    // a cache kept in another dtype than the activations': our kernel reads bf16 keys and values under fp32 queries as
    // they are; the other cases, and torch's kernels, take them converted to q's dtype, as the eager step does
    const bool mixed = q.scalar_type() == at::kFloat && k.scalar_type() == at::kBFloat16;
    if (k.scalar_type() != q.scalar_type() && !(kind == kNative && mixed)) {
      k = k.to(q.scalar_type());
      v = v.to(q.scalar_type());
    }
    if (kind == kNative) return attend_one_op().call(q, k, v, mask, scale, true);  // a few queries: each over its own keys
    if (n_kv_heads_ != n_heads_) {  // grouped-query attention: each key/value head serves a group of query heads
      k = k.repeat_interleave(n_heads_ / n_kv_heads_, 1);
      v = v.repeat_interleave(n_heads_ / n_kv_heads_, 1);
    }
    if (length > 1) {  // query t sees keys up to its own position, keys - length + t
      const at::Tensor future = at::ones({length, keys}, q.options().dtype(at::kBool)).tril(keys - length);
      mask = mask.has_value() ? at::logical_and(*mask, future) : future;
    }
    if (kind == kSdpa) return at::scaled_dot_product_attention(q, k, v, mask);
    // the formula, as the "math" backend writes it: the softmax in fp32 for half precision
    at::Tensor scores = at::matmul(q, k.transpose(-2, -1)) / std::sqrt(static_cast<double>(q.size(-1)));
    if (mask.has_value()) scores = scores.masked_fill(mask->logical_not(), -std::numeric_limits<double>::infinity());
    const bool half = q.scalar_type() == at::kBFloat16 || q.scalar_type() == at::kHalf;
    return at::matmul(at::softmax(scores, -1, half ? std::optional<at::ScalarType>(at::kFloat) : std::nullopt).to(q.scalar_type()), v);
  }

  // The feed-forward's hidden layer, its first product through the activation: in our product's epilogue where the call
  // takes our kernel and the activation is one it applies (gemv_activation: the operator's bits, without its call,
  // allocation and pass): GPT-2's GELU by our kernel, ReLU (the paper's), ReLU squared.
  static at::Tensor hidden_layer(const Layer& layer, const at::Tensor& x) {
    const char* in_epilogue = layer.activation == kGeluTanhNative ? "gelu_tanh"
                              : layer.activation == kRelu         ? "relu"
                              : layer.activation == kRelu2        ? "relu2"
                                                                  : nullptr;
    if (in_epilogue != nullptr && takes_ours(x, layer.up)) {
      return gemv_activation_op().call(x, layer.up.weight, layer.up.scale, layer.up.bias, layer.up.param, in_epilogue);
    }
    return activation(layer, linear(x, layer.up));
  }

  // The activation of the feed-forward's first product `hidden` (its own tensor).
  static at::Tensor activation(const Layer& layer, at::Tensor hidden) {
    switch (layer.activation) {
      case kRelu: hidden.relu_(); break;  // in place: the product's own tensor
      case kGelu: hidden = at::gelu(hidden); break;
      case kGeluTanh: hidden = at::gelu(hidden, "tanh"); break;
      case kGeluTanhNative: hidden = gelu_tanh_op().call(hidden); break;
      case kSilu: hidden = at::silu(hidden); break;
      case kSwiGLU: {  // (silu(x W_gate) * x W_1) W_2, the two halves of the fused projection
        const auto halves = hidden.chunk(2, -1);
        hidden = at::silu(halves[0]) * halves[1];
        break;
      }
      case kRelu2: hidden.relu_().mul_(hidden); break;  // relu(x)^2 as square() computes it (x * x), in place
      default: TORCH_CHECK(false, "aiayn_native::DecodeStep: unknown activation ", layer.activation);
    }
    return hidden;
  }

  int64_t n_heads_ = 0, n_kv_heads_ = 0, head_dim_ = 0;
  int64_t few_queries_ = 0;  // the most queries a row our kernel takes (a check); more (a prompt) go to torch's
  bool pre_norm_ = false, has_final_norm_ = false, rotary_ = false, qk_norm_ = false;
  std::vector<Layer> layers_;
  Norm final_norm_;
  std::optional<Linear> output_, output_one_;
  std::optional<at::Tensor> embed_, positions_;
  double embed_scale_ = 1.0;
};

}  // namespace

TORCH_LIBRARY_FRAGMENT(aiayn_native, m) {
  m.class_<DecodeStep>("DecodeStep")
      .def(torch::init<Tensors, std::vector<int64_t>, std::vector<double>>())
      .def("run", &DecodeStep::run)
      .def("run_growing", &DecodeStep::run_growing)
      .def("embeds", &DecodeStep::embeds)
      .def("projects", &DecodeStep::projects);
}
