// Every layer of a hybrid model (executor/models/hybrid/: Qwen3.5's Gated DeltaNet and gated
// attention, LFM2's short convolutions and attention, their dense gated MLPs) for a
// decode-only step (one token per sequence) in one call from Python:
//
//   torch.classes.folio.HybridStep(qwen, num_heads, num_kv_heads, head_dim, rotary_dim,
//                                  eps, norm_offset, scale, cos_sin, delta_shape)
//     qwen: Qwen3.5's zero-centred norms and sigmoid-gated attention (else LFM2's);
//     norm_offset: what the zero-centred norms add to their weight (layers.py Norm.offset:
//     1, or 0 where a GGUF file gave the scale 1 + w itself);
//     delta_shape: [k_heads, v_heads, k_dim, v_dim] of the Gated DeltaNet layers ([] LFM2)
//     .add_layer(kind, norms, tensors)   kind 0 attention, 1 gated delta, 2 short conv;
//         norms = [before the mixer, before the MLP]; tensors: attention [q_norm, k_norm],
//         gated delta [conv weight, A_log, dt_bias, gated norm weight], short conv
//         [conv weight, (conv bias)]
//     .add_linear(kind, tensors, config)   step_linear.h's kinds, per layer in this order:
//         attention q, k, v, o; gated delta in_proj_qkv, in_proj_z, in_proj_b, in_proj_a,
//         out_proj; short conv in_proj, out_proj; then the MLP's gate, up, down
//     .run(positions, hidden, key_caches, value_caches, slot_mapping, block_tables,
//          seq_lens, query_start_loc, conv_windows, delta_states, slots, fresh) -> hidden
//         caches one per attention layer, conv_windows one per recurrent layer and
//         delta_states one per Gated DeltaNet layer, in layer order (the StatePool's
//         tensors); the states are read and written in place at `slots`
//
// executor/native_step/hybrid.py reads a HybridCausalLM's modules into one such object at
// load. run() calls the ATen ops and folio:: operators the Python layers (hybrid/layers.py
// with the CPU kernel set and its C++ recurrent decode steps) call, on tensors of the same
// shapes and strides, in the same order, so its hidden states and the states it leaves are
// bit-identical to theirs; what it saves is the Python between them.
#include <torch/custom_class.h>
#include <torch/library.h>
#include <ATen/ATen.h>

#include <cmath>
#include <optional>
#include <vector>

#include "step_linear.h"

namespace {

using at::Tensor;
using folio_step::handle;
using folio_step::Linear;

enum LayerKind : int64_t { kAttention = 0, kGatedDelta = 1, kShortConv = 2 };

// Linears per layer kind: the mixer's, then the MLP's three.
int64_t linears_of(int64_t kind) {
  return (kind == kAttention ? 4 : kind == kGatedDelta ? 5 : 2) + 3;
}

struct Layer {
  int64_t kind = kAttention;
  Tensor before, after;           // the norms before the mixer and before the MLP
  std::vector<Tensor> tensors;    // add_layer's, by kind
  std::vector<Linear> linears;
  int64_t state = 0;              // its KV cache (attention) or conv window (recurrent)
  int64_t delta = 0;              // its delta-rule states (gated delta)
};

using RotarySig = void(Tensor, Tensor, Tensor, Tensor);
using AttentionSig = void(const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                          const Tensor&, const Tensor&, const Tensor&, double, int64_t, double);
using DeltaSig = void(Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor,
                      c10::List<bool>);
using ConvSig = void(Tensor, Tensor, Tensor, Tensor, std::optional<Tensor>, Tensor,
                     c10::List<bool>);

class HybridStep : public torch::CustomClassHolder {
 public:
  HybridStep(bool qwen, int64_t num_heads, int64_t num_kv_heads, int64_t head_dim,
             int64_t rotary_dim, double eps, double norm_offset, double scale,
             Tensor cos_sin, std::vector<int64_t> delta_shape)
      : qwen_(qwen), heads_(num_heads), kv_heads_(num_kv_heads), head_dim_(head_dim),
        rotary_dim_(rotary_dim), eps_(eps), norm_offset_(norm_offset), scale_(scale),
        cos_sin_(std::move(cos_sin)),
        rotary_(handle<RotarySig>("folio::rotary")),
        paged_attention_(handle<AttentionSig>("folio::paged_attention")),
        gated_delta_step_(handle<DeltaSig>("folio::gated_delta_step")),
        causal_conv_step_(handle<ConvSig>("folio::causal_conv_step")) {
    TORCH_CHECK(num_heads > 0 && num_kv_heads > 0 && head_dim > 0, "bad attention shape");
    TORCH_CHECK(rotary_dim > 0 && rotary_dim <= head_dim && rotary_dim % 2 == 0,
                "rotary_dim must be even and at most head_dim, got ", rotary_dim);
    TORCH_CHECK(cos_sin_.dim() == 2 && cos_sin_.size(1) == rotary_dim &&
                    cos_sin_.scalar_type() == at::kFloat,
                "the cos/sin table must be float32 [positions, rotary_dim]");
    TORCH_CHECK(delta_shape.empty() || delta_shape.size() == 4,
                "delta_shape must be [k_heads, v_heads, k_dim, v_dim] or []");
    if (delta_shape.size() == 4) {
      k_heads_ = delta_shape[0];
      v_heads_ = delta_shape[1];
      k_dim_ = delta_shape[2];
      v_dim_ = delta_shape[3];
      TORCH_CHECK(k_heads_ > 0 && v_heads_ % k_heads_ == 0 && k_dim_ > 0 && v_dim_ > 0,
                  "v_heads must be a multiple of k_heads");
    }
  }

  void add_layer(int64_t kind, std::vector<Tensor> norms, std::vector<Tensor> tensors) {
    TORCH_CHECK(kind == kAttention || kind == kGatedDelta || kind == kShortConv,
                "layer kind must be 0 (attention), 1 (gated delta) or 2 (short conv)");
    TORCH_CHECK(complete(), "the previous layer lacks some of its linears");
    TORCH_CHECK(norms.size() == 2, "norms must be [before the mixer, before the MLP]");
    const size_t expected = kind == kAttention ? 2 : kind == kGatedDelta ? 4 : 0;
    TORCH_CHECK(kind == kShortConv ? tensors.size() == 1 || tensors.size() == 2
                                   : tensors.size() == expected,
                "layer kind ", kind, " takes ", kind == kShortConv ? 1 : expected,
                " tensors, got ", tensors.size());
    TORCH_CHECK(kind != kGatedDelta || k_heads_ > 0, "a gated delta layer needs delta_shape");
    Layer layer;
    layer.kind = kind;
    layer.before = norms[0];
    layer.after = norms[1];
    layer.tensors = std::move(tensors);
    layer.state = kind == kAttention ? attention_layers_++ : recurrent_layers_++;
    if (kind == kGatedDelta) layer.delta = delta_layers_++;
    layers_.push_back(std::move(layer));
  }

  void add_linear(int64_t kind, std::vector<Tensor> tensors, std::vector<int64_t> config) {
    TORCH_CHECK(!layers_.empty() && !complete(), "add_linear: add a layer first (",
                "attention takes 7 linears, gated delta 8, short conv 5)");
    layers_.back().linears.push_back(linear_.make(kind, std::move(tensors), std::move(config)));
  }

  int64_t num_layers() const { return static_cast<int64_t>(layers_.size()); }

  Tensor run(Tensor positions, Tensor hidden, std::vector<Tensor> key_caches,
             std::vector<Tensor> value_caches, Tensor slot_mapping, Tensor block_tables,
             Tensor seq_lens, Tensor query_start_loc, std::vector<Tensor> conv_windows,
             std::vector<Tensor> delta_states, Tensor slots, c10::List<bool> fresh) {
    TORCH_CHECK(!layers_.empty() && complete(), "the step's layers are incomplete");
    TORCH_CHECK(static_cast<int64_t>(key_caches.size()) == attention_layers_ &&
                    static_cast<int64_t>(value_caches.size()) == attention_layers_,
                "one key and one value cache per attention layer (", attention_layers_, ")");
    TORCH_CHECK(static_cast<int64_t>(conv_windows.size()) == recurrent_layers_ &&
                    static_cast<int64_t>(delta_states.size()) == delta_layers_,
                "one conv window pool per recurrent layer (", recurrent_layers_,
                ") and one delta-rule pool per gated delta layer (", delta_layers_, ")");
    TORCH_CHECK(hidden.dim() == 2, "hidden must be [tokens, hidden]");
    TORCH_CHECK(slots.size(0) == hidden.size(0),
                "a decode-only step: one token per sequence, one state slot each");
    // Per step, not per layer (the operators would do it at each call, to the same result).
    slot_mapping = slot_mapping.contiguous();
    block_tables = block_tables.to(at::kInt).contiguous();
    seq_lens = seq_lens.to(at::kInt).contiguous();
    query_start_loc = query_start_loc.to(at::kInt).contiguous();
    for (const Layer& layer : layers_) {   // hybrid/model.py HybridLayer.forward
      Tensor mixed = norm(hidden, layer.before);
      if (layer.kind == kAttention) {
        mixed = attention(layer, positions, mixed, key_caches[layer.state],
                          value_caches[layer.state], slot_mapping, block_tables, seq_lens,
                          query_start_loc);
      } else if (layer.kind == kGatedDelta) {
        mixed = gated_delta(layer, mixed, conv_windows[layer.state],
                            delta_states[layer.delta], slots, fresh);
      } else {
        mixed = short_conv(layer, mixed, conv_windows[layer.state], slots, fresh);
      }
      hidden = hidden + mixed;
      hidden = hidden + mlp(layer, norm(hidden, layer.after));
    }
    return hidden;
  }

 private:
  bool complete() const {
    return layers_.empty() ||
           static_cast<int64_t>(layers_.back().linears.size()) == linears_of(layers_.back().kind);
  }

  // layers.py Norm: RMSNorm in float32; Qwen3.5's (offset + w) rounded once at the end, LFM2's
  // w times the normed value rounded to the dtype.
  Tensor norm(const Tensor& x, const Tensor& weight) const {
    Tensor xf = x.to(at::kFloat);
    Tensor normed = xf * at::rsqrt(xf.pow(2).mean({-1}, true) + eps_);
    if (qwen_) return (normed * (weight.to(at::kFloat) + norm_offset_)).to(x.scalar_type());
    return weight * normed.to(x.scalar_type());
  }

  // layers.py GatedNorm: RMSNorm(x) * silu(gate), per value head.
  Tensor gated_norm(const Tensor& x, const Tensor& gate, const Tensor& weight) const {
    Tensor xf = x.to(at::kFloat);
    Tensor normed = xf * at::rsqrt(xf.pow(2).mean({-1}, true) + eps_);
    Tensor out = weight * normed.to(x.scalar_type());
    return (out * at::silu(gate.to(at::kFloat))).to(x.scalar_type());
  }

  // layers.py GatedMlp: down(silu(gate(x)) * up(x)).
  Tensor mlp(const Layer& layer, const Tensor& x) {
    const size_t first = layer.linears.size() - 3;
    Tensor gated = at::silu(linear_(layer.linears[first], x));
    return linear_(layer.linears[first + 2], gated * linear_(layer.linears[first + 1], x));
  }

  // layers.py HybridAttention with executor/ops.py cpu_ops.
  Tensor attention(const Layer& layer, const Tensor& positions, const Tensor& x,
                   const Tensor& key_cache, const Tensor& value_cache, const Tensor& slots,
                   const Tensor& block_tables, const Tensor& seq_lens,
                   const Tensor& query_start_loc) {
    const int64_t tokens = x.size(0);
    Tensor q = linear_(layer.linears[0], x);
    Tensor gate;
    if (qwen_) {   // q_proj yields each head's query, then its gate
      auto halves = q.view({tokens, heads_, 2 * head_dim_}).chunk(2, -1);
      q = halves[0];
      gate = halves[1];
    }
    q = norm(q.reshape({tokens, heads_, head_dim_}), layer.tensors[0]);
    Tensor k = norm(linear_(layer.linears[1], x).view({tokens, kv_heads_, head_dim_}),
                    layer.tensors[1]);
    Tensor v = linear_(layer.linears[2], x).view({tokens, kv_heads_, head_dim_});
    const int64_t rot = rotary_dim_, rest = head_dim_ - rotary_dim_;
    Tensor q_rot = q.narrow(2, 0, rot).contiguous();
    Tensor k_rot = k.narrow(2, 0, rot).contiguous();
    rotary_.call(positions, q_rot, k_rot, cos_sin_);
    q = at::cat({q_rot, q.narrow(2, rot, rest)}, -1);
    k = at::cat({k_rot, k.narrow(2, rot, rest)}, -1);
    write_cache_(k, v, key_cache, value_cache, slots);
    Tensor out = at::empty_like(q);
    paged_attention_.call(out, q, key_cache, value_cache, block_tables, seq_lens,
                          query_start_loc, scale_, 0, 0.0);
    out = out.reshape({tokens, heads_ * head_dim_});
    if (qwen_) out = out * at::sigmoid(gate.reshape({tokens, -1}));
    return linear_(layer.linears[3], out);
  }

  // layers.py GatedDeltaNet (its decode-only path with the C++ recurrent steps).
  Tensor gated_delta(const Layer& layer, const Tensor& x, const Tensor& windows,
                     const Tensor& states, const Tensor& slots, const c10::List<bool>& fresh) {
    const int64_t tokens = x.size(0);
    const int64_t key = k_heads_ * k_dim_, value = v_heads_ * v_dim_;
    const Tensor &conv_weight = layer.tensors[0], &a_log = layer.tensors[1],
                 &dt_bias = layer.tensors[2], &norm_weight = layer.tensors[3];
    Tensor qkv = linear_(layer.linears[0], x);
    Tensor convolved = at::empty(qkv.sizes(), qkv.options());
    causal_conv_step_.call(convolved, qkv, windows, conv_weight, std::nullopt, slots, fresh);
    auto parts = at::silu(convolved).split_with_sizes({key, key, value}, -1);
    const int64_t repeat = v_heads_ / k_heads_;
    Tensor q = parts[0].reshape({tokens, k_heads_, k_dim_}).repeat_interleave(repeat, 1);
    Tensor k = parts[1].reshape({tokens, k_heads_, k_dim_}).repeat_interleave(repeat, 1);
    Tensor v = parts[2].reshape({tokens, v_heads_, v_dim_});
    q = l2_normalize(q.to(at::kFloat));   // gated_delta.prepare_qk
    k = l2_normalize(k.to(at::kFloat));
    q = q * std::pow(static_cast<double>(k_dim_), -0.5);
    Tensor beta = at::sigmoid(linear_(layer.linears[2], x)).to(at::kFloat);
    Tensor g = -a_log.to(at::kFloat).exp() *
               at::softplus(linear_(layer.linears[3], x).to(at::kFloat) + dt_bias, 1, 20);
    Tensor out = at::empty(v.sizes(), v.options().dtype(at::kFloat));
    gated_delta_step_.call(out, q, k, v, g, beta, states, slots, fresh);
    Tensor z = linear_(layer.linears[1], x);
    Tensor normed = gated_norm(out.to(x.scalar_type()).reshape({-1, v_dim_}),
                               z.reshape({-1, v_dim_}), norm_weight);
    return linear_(layer.linears[4], normed.reshape({tokens, -1}));
  }

  static Tensor l2_normalize(const Tensor& x) {   // gated_delta.l2_normalize
    return x * at::rsqrt((x * x).sum({-1}, true) + 1e-6);
  }

  // layers.py ShortConv: out(C * conv(B * x)).
  Tensor short_conv(const Layer& layer, const Tensor& x, const Tensor& windows,
                    const Tensor& slots, const c10::List<bool>& fresh) {
    auto bch = linear_(layer.linears[0], x).chunk(3, -1);
    Tensor bx = bch[0] * bch[2];
    Tensor y = at::empty(bx.sizes(), bx.options());
    std::optional<Tensor> bias;
    if (layer.tensors.size() == 2) bias = layer.tensors[1];
    causal_conv_step_.call(y, bx, windows, layer.tensors[0], bias, slots, fresh);
    return linear_(layer.linears[1], bch[1] * y);
  }

  bool qwen_;
  int64_t heads_, kv_heads_, head_dim_, rotary_dim_;
  int64_t k_heads_ = 0, v_heads_ = 0, k_dim_ = 0, v_dim_ = 0;
  double eps_, norm_offset_, scale_;
  Tensor cos_sin_;
  std::vector<Layer> layers_;
  int64_t attention_layers_ = 0, recurrent_layers_ = 0, delta_layers_ = 0;
  c10::TypedOperatorHandle<RotarySig> rotary_;
  c10::TypedOperatorHandle<AttentionSig> paged_attention_;
  c10::TypedOperatorHandle<DeltaSig> gated_delta_step_;
  c10::TypedOperatorHandle<ConvSig> causal_conv_step_;
  folio_step::Linears linear_;
  folio_step::CacheWriter write_cache_;
};

}  // namespace

TORCH_LIBRARY_FRAGMENT(folio, m) {
  m.class_<HybridStep>("HybridStep")
      .def(torch::init<bool, int64_t, int64_t, int64_t, int64_t, double, double, double,
                       Tensor, std::vector<int64_t>>())
      .def("add_layer", &HybridStep::add_layer)
      .def("add_linear", &HybridStep::add_linear)
      .def("num_layers", &HybridStep::num_layers)
      .def("run", &HybridStep::run);
}
