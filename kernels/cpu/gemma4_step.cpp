// Every layer of a dense Gemma 4 text decoder (executor/models/gemma4/: per-layer head sizes
// and KV heads, kv-shared layers, values = keys, per-layer inputs) for a small step in one
// call from Python:
//
//   torch.classes.folio.Gemma4Step(num_heads, eps, scale, per_layer_inputs)
//     per_layer_inputs: the layers end with PLE's gated residual (run() gets the inputs)
//     .add_layer(norms, layer_scalar, kv_heads, head_dim, cache, owns_cache, window, table)
//         norms = [input, post_attention, pre_feedforward, post_feedforward, q_norm,
//                  (k_norm: owns_cache), (post_per_layer_input_norm: per_layer_inputs)];
//         cache: its kv_caches entry (a shared layer: its source's); window 0: full
//         attention; table: which of run()'s rope rows it reads
//     .add_linear(kind, tensors, config)   step_linear.h's kinds, per layer in this order:
//         qkv_proj (q_proj on a kv-shared layer), o_proj, gate_up_proj, down_proj, then
//         per_layer_input_gate, per_layer_projection with per-layer inputs; values = keys
//         where qkv_proj yields no value part
//     .run(rows, hidden, per_layer, key_caches, value_caches, slot_mapping, block_tables,
//          seq_lens, query_start_loc) -> hidden (before the final norm)
//         rows: per table, its cos/sin rows at the step's positions [T, 1, head] in the
//         model dtype; per_layer: [T, layers, width] or None
//
// executor/native_step/gemma4.py reads a Gemma4CausalLM's modules into one such object at
// load. run() calls the ATen ops and folio:: operators gemma4/layers.py and model.py call
// with the CPU kernel set, on tensors of the same shapes and strides, in the same order, so
// its hidden states and the caches it writes are bit-identical to theirs; what it saves is
// the Python between them. The MoE block is not here (its CPU experts are Python).
#include <torch/custom_class.h>
#include <torch/library.h>
#include <ATen/ATen.h>

#include <optional>
#include <vector>

#include "step_linear.h"

namespace {

using at::Tensor;
using folio_step::handle;
using folio_step::Linear;

struct Layer {
  Tensor input, post_attention, pre_feedforward, post_feedforward, q_norm;
  std::optional<Tensor> k_norm, per_layer_norm;
  Tensor scalar;                  // layer_scalar
  int64_t kv_heads = 0, head_dim = 0, cache = 0, window = 0, table = 0;
  bool owns_cache = true;
  std::vector<Linear> linears;
};

using AttentionSig = void(const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                          const Tensor&, const Tensor&, const Tensor&, double, int64_t, double);

class Gemma4Step : public torch::CustomClassHolder {
 public:
  Gemma4Step(int64_t num_heads, double eps, double scale, bool per_layer_inputs)
      : heads_(num_heads), eps_(eps), scale_(scale), per_layer_inputs_(per_layer_inputs),
        paged_attention_(handle<AttentionSig>("folio::paged_attention")) {
    TORCH_CHECK(num_heads > 0, "num_heads must be positive");
  }

  void add_layer(std::vector<Tensor> norms, Tensor layer_scalar, int64_t kv_heads,
                 int64_t head_dim, int64_t cache, bool owns_cache, int64_t window,
                 int64_t table) {
    TORCH_CHECK(complete(), "the previous layer lacks some of its linears");
    const size_t expected = 5 + (owns_cache ? 1 : 0) + (per_layer_inputs_ ? 1 : 0);
    TORCH_CHECK(norms.size() == expected, "this layer takes ", expected, " norms, got ",
                norms.size());
    TORCH_CHECK(kv_heads > 0 && head_dim > 0 && head_dim % 2 == 0 && heads_ % kv_heads == 0,
                "bad attention shape");
    TORCH_CHECK(cache >= 0 && window >= 0 && table >= 0, "cache, window, table must be >= 0");
    Layer layer;
    layer.input = norms[0];
    layer.post_attention = norms[1];
    layer.pre_feedforward = norms[2];
    layer.post_feedforward = norms[3];
    layer.q_norm = norms[4];
    size_t next = 5;
    if (owns_cache) layer.k_norm = norms[next++];
    if (per_layer_inputs_) layer.per_layer_norm = norms[next++];
    layer.scalar = std::move(layer_scalar);
    layer.kv_heads = kv_heads;
    layer.head_dim = head_dim;
    layer.cache = cache;
    layer.owns_cache = owns_cache;
    layer.window = window;
    layer.table = table;
    caches_ = std::max(caches_, cache + 1);
    tables_ = std::max(tables_, table + 1);
    layers_.push_back(std::move(layer));
  }

  void add_linear(int64_t kind, std::vector<Tensor> tensors, std::vector<int64_t> config) {
    TORCH_CHECK(!layers_.empty() && !complete(), "add_linear: add a layer first (",
                linears_per_layer(), " linears a layer)");
    layers_.back().linears.push_back(linear_.make(kind, std::move(tensors), std::move(config)));
  }

  int64_t num_layers() const { return static_cast<int64_t>(layers_.size()); }

  Tensor run(std::vector<Tensor> rows, Tensor hidden, std::optional<Tensor> per_layer,
             std::vector<Tensor> key_caches, std::vector<Tensor> value_caches,
             Tensor slot_mapping, Tensor block_tables, Tensor seq_lens,
             Tensor query_start_loc) {
    TORCH_CHECK(!layers_.empty() && complete(), "the step's layers are incomplete");
    TORCH_CHECK(static_cast<int64_t>(key_caches.size()) == caches_ &&
                    static_cast<int64_t>(value_caches.size()) == caches_,
                "one key and one value cache per layer keeping one (", caches_, ")");
    TORCH_CHECK(static_cast<int64_t>(rows.size()) == tables_, "one rows tensor per table (",
                tables_, ")");
    TORCH_CHECK(hidden.dim() == 2, "hidden must be [tokens, hidden]");
    TORCH_CHECK(per_layer.has_value() == per_layer_inputs_,
                per_layer_inputs_ ? "this model's layers need the per-layer inputs"
                                  : "this model has no per-layer inputs");
    if (per_layer) {
      TORCH_CHECK(per_layer->dim() == 3 && per_layer->size(0) == hidden.size(0) &&
                      per_layer->size(1) == num_layers(),
                  "per_layer must be [tokens, layers, width]");
    }
    // Per step, not per layer (the operator would do it at each call, to the same result).
    slot_mapping = slot_mapping.contiguous();
    block_tables = block_tables.to(at::kInt).contiguous();
    seq_lens = seq_lens.to(at::kInt).contiguous();
    query_start_loc = query_start_loc.to(at::kInt).contiguous();
    for (size_t i = 0; i < layers_.size(); ++i) {   // gemma4/model.py Gemma4Layer.forward
      const Layer& layer = layers_[i];
      Tensor attended = attention(layer, rows[layer.table], norm(hidden, layer.input),
                                  key_caches[layer.cache], value_caches[layer.cache],
                                  slot_mapping, block_tables, seq_lens, query_start_loc);
      hidden = hidden + norm(attended, layer.post_attention);
      Tensor fed = mlp(layer, norm(hidden, layer.pre_feedforward));
      hidden = hidden + norm(fed, layer.post_feedforward);
      if (per_layer) {
        Tensor gate = at::gelu(linear_(layer.linears[4], hidden), "tanh");
        Tensor extra = linear_(layer.linears[5], gate * per_layer->select(1, i));
        hidden = hidden + norm(extra, *layer.per_layer_norm);
      }
      hidden = hidden * layer.scalar;
    }
    return hidden;
  }

 private:
  size_t linears_per_layer() const { return per_layer_inputs_ ? 6 : 4; }

  bool complete() const {
    return layers_.empty() || layers_.back().linears.size() == linears_per_layer();
  }

  // layers.py Gemma4Norm: x * pow(mean(x^2) + eps, -0.5) [* weight] in float32, rounded once.
  Tensor norm(const Tensor& x, const std::optional<Tensor>& weight) const {
    Tensor h = x.to(at::kFloat);
    h = h * at::pow(h.pow(2).mean({-1}, true) + eps_, -0.5);
    if (weight) h = h * weight->to(at::kFloat);
    return h.to(x.scalar_type());
  }

  // layers.py rotate: rotate-half over the whole head, in x's dtype.
  static Tensor rotate(const Tensor& x, const Tensor& rows) {
    const int64_t half = x.size(-1) / 2;
    Tensor cos = rows.narrow(-1, 0, half), sin = rows.narrow(-1, half, half);
    Tensor first = x.narrow(-1, 0, half), second = x.narrow(-1, half, half);
    return at::cat({first * cos - second * sin, second * cos + first * sin}, -1);
  }

  // layers.py Gemma4Mlp: down(gelu_tanh(gate(x)) * up(x)).
  Tensor mlp(const Layer& layer, const Tensor& x) {
    auto halves = linear_(layer.linears[2], x).chunk(2, -1);
    return linear_(layer.linears[3], at::gelu(halves[0], "tanh") * halves[1]);
  }

  // layers.py Gemma4Attention with executor/ops.py cpu_ops.
  Tensor attention(const Layer& layer, const Tensor& rows, const Tensor& x,
                   const Tensor& key_cache, const Tensor& value_cache, const Tensor& slots,
                   const Tensor& block_tables, const Tensor& seq_lens,
                   const Tensor& query_start_loc) {
    const int64_t tokens = x.size(0), dim = layer.head_dim;
    const int64_t q_size = heads_ * dim, kv_size = layer.kv_heads * dim;
    Tensor q, k, v;
    if (layer.owns_cache) {
      Tensor qkv = linear_(layer.linears[0], x);
      q = qkv.narrow(1, 0, q_size);
      k = qkv.narrow(1, q_size, kv_size);
      v = qkv.size(1) == q_size + kv_size ? k
                                          : qkv.narrow(1, q_size + kv_size,
                                                       qkv.size(1) - q_size - kv_size);
    } else {
      q = linear_(layer.linears[0], x);
    }
    q = rotate(norm(q.reshape({tokens, heads_, dim}), layer.q_norm), rows);
    if (layer.owns_cache) {
      k = k.reshape({tokens, layer.kv_heads, dim});
      v = v.reshape({tokens, layer.kv_heads, dim});
      k = rotate(norm(k, layer.k_norm), rows);
      v = norm(v, std::nullopt);
      write_cache_(k.contiguous(), v.contiguous(), key_cache, value_cache, slots);
    }
    q = q.contiguous();
    Tensor out = at::empty_like(q);
    paged_attention_.call(out, q, key_cache, value_cache, block_tables, seq_lens,
                          query_start_loc, scale_, layer.window, 0.0);
    return linear_(layer.linears[1], out.reshape({tokens, q_size}));
  }

  int64_t heads_;
  double eps_, scale_;
  bool per_layer_inputs_;
  std::vector<Layer> layers_;
  int64_t caches_ = 0, tables_ = 0;
  c10::TypedOperatorHandle<AttentionSig> paged_attention_;
  folio_step::Linears linear_;
  folio_step::CacheWriter write_cache_;
};

}  // namespace

TORCH_LIBRARY_FRAGMENT(folio, m) {
  m.class_<Gemma4Step>("Gemma4Step")
      .def(torch::init<int64_t, double, double, bool>())
      .def("add_layer", &Gemma4Step::add_layer)
      .def("add_linear", &Gemma4Step::add_linear)
      .def("num_layers", &Gemma4Step::num_layers)
      .def("run", &Gemma4Step::run);
}
