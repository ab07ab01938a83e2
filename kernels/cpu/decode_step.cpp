// The transformer layers of a small step (decodes: a few rows) in one call from Python:
//
//   torch.classes.folio.DecodeStep(num_heads, num_kv_heads, head_dim, rotary_dim, eps,
//                                  scale, cos_sin_tables)
//     .add_layer(norms, window, softcap, table)   norms = [input, post_attention, (q, k)]
//     .add_linear(kind, tensors, config)          four per layer: qkv, o, gate_up, down
//     .run(positions, hidden, key_caches, value_caches, slot_mapping, block_tables,
//          seq_lens, query_start_loc) -> (hidden, residual)
//
// executor/native_step/layers.py reads a model's modules into one such object at load.
// run() calls the operators the Python layers (executor/models/layers.py with the CPU
// kernel set, executor/ops.py cpu_ops) call, on the same tensors in the same order, so its
// results are bit-identical to theirs; what it saves is the Python between them (module
// calls, views, the kernel set's dispatch: ~3.5 ms of a SmolLM2-135M step).
//
// The linear kinds, the dispatcher handles and the KV cache write are step_linear.h's,
// shared with hybrid_step.cpp.
#include <torch/custom_class.h>
#include <torch/library.h>
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include "step_linear.h"

#include <optional>
#include <tuple>
#include <vector>

namespace {

using at::Tensor;
using folio_step::handle;
using folio_step::Linear;

struct Layer {
  Tensor input_norm, post_norm;
  std::optional<Tensor> q_norm, k_norm;
  int64_t window = 0;       // 0: full attention
  double softcap = 0.0;     // 0: none
  int64_t table = 0;        // which cos/sin table
  std::vector<Linear> linears;   // qkv, o, gate_up, down
};

using NormSig = void(Tensor, Tensor, Tensor, double);
using RotarySig = void(Tensor, Tensor, Tensor, Tensor);
using SiluSig = void(Tensor, Tensor);
using AttentionSig = void(const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                          const Tensor&, const Tensor&, const Tensor&, double, int64_t, double);

class DecodeStep : public torch::CustomClassHolder {
 public:
  DecodeStep(int64_t num_heads, int64_t num_kv_heads, int64_t head_dim, int64_t rotary_dim,
             double eps, double scale, std::vector<Tensor> tables)
      : heads_(num_heads), kv_heads_(num_kv_heads), head_dim_(head_dim),
        rotary_dim_(rotary_dim), eps_(eps), scale_(scale), tables_(std::move(tables)),
        rms_norm_(handle<NormSig>("folio::rms_norm")),
        fused_add_rms_norm_(handle<NormSig>("folio::fused_add_rms_norm")),
        rotary_(handle<RotarySig>("folio::rotary")),
        silu_and_mul_(handle<SiluSig>("folio::silu_and_mul")),
        paged_attention_(handle<AttentionSig>("folio::paged_attention")) {
    TORCH_CHECK(num_heads > 0 && num_kv_heads > 0 && head_dim > 0, "bad attention shape");
    TORCH_CHECK(rotary_dim > 0 && rotary_dim <= head_dim && rotary_dim % 2 == 0,
                "rotary_dim must be even and at most head_dim, got ", rotary_dim);
    for (const Tensor& t : tables_)
      TORCH_CHECK(t.dim() == 2 && t.size(1) == rotary_dim && t.scalar_type() == at::kFloat,
                  "each cos/sin table must be float32 [positions, rotary_dim]");
  }

  void add_layer(std::vector<Tensor> norms, int64_t window, double softcap, int64_t table) {
    TORCH_CHECK(norms.size() == 2 || norms.size() == 4,
                "norms must be [input, post_attention] or those and [q_norm, k_norm]");
    TORCH_CHECK(table >= 0 && table < static_cast<int64_t>(tables_.size()),
                "table ", table, " outside the ", tables_.size(), " cos/sin tables");
    TORCH_CHECK(window >= 0 && softcap >= 0.0, "window and softcap must be >= 0 (0: none)");
    TORCH_CHECK(layers_.empty() || layers_.back().linears.size() == 4,
                "the previous layer has ", layers_.empty() ? 0 : layers_.back().linears.size(),
                " of its 4 linears");
    Layer layer;
    layer.input_norm = norms[0];
    layer.post_norm = norms[1];
    if (norms.size() == 4) {
      layer.q_norm = norms[2];
      layer.k_norm = norms[3];
    }
    layer.window = window;
    layer.softcap = softcap;
    layer.table = table;
    layers_.push_back(std::move(layer));
  }

  void add_linear(int64_t kind, std::vector<Tensor> tensors, std::vector<int64_t> config) {
    TORCH_CHECK(!layers_.empty() && layers_.back().linears.size() < 4,
                "add_linear: add a layer first; each takes four (qkv, o, gate_up, down)");
    layers_.back().linears.push_back(linear_.make(kind, std::move(tensors), std::move(config)));
  }

  int64_t num_layers() const { return static_cast<int64_t>(layers_.size()); }

  std::tuple<Tensor, Tensor> run(Tensor positions, Tensor hidden,
                                 std::vector<Tensor> key_caches,
                                 std::vector<Tensor> value_caches, Tensor slot_mapping,
                                 Tensor block_tables, Tensor seq_lens,
                                 Tensor query_start_loc) {
    const int64_t n = num_layers();
    TORCH_CHECK(n > 0 && layers_.back().linears.size() == 4, "the step's layers are incomplete");
    TORCH_CHECK(static_cast<int64_t>(key_caches.size()) == n &&
                    static_cast<int64_t>(value_caches.size()) == n,
                "one key and one value cache per layer (", n, ")");
    TORCH_CHECK(hidden.dim() == 2, "hidden must be [tokens, hidden]");
    // Per step, not per layer (the operators would do it at each call, to the same result).
    slot_mapping = slot_mapping.contiguous();
    block_tables = block_tables.to(at::kInt).contiguous();
    seq_lens = seq_lens.to(at::kInt).contiguous();
    query_start_loc = query_start_loc.to(at::kInt).contiguous();
    Tensor residual;   // the first layer's is its input
    for (int64_t i = 0; i < n; ++i) {
      const Layer& layer = layers_[i];
      if (!residual.defined()) {
        residual = hidden;
        Tensor normed = at::empty_like(hidden);
        rms_norm_.call(normed, hidden, layer.input_norm, eps_);
        hidden = normed;
      } else {
        fused_add_rms_norm_.call(hidden, residual, layer.input_norm, eps_);
      }
      Tensor attended = attention(layer, positions, hidden, key_caches[i], value_caches[i],
                                  slot_mapping, block_tables, seq_lens, query_start_loc);
      hidden = linear(layer.linears[1], attended);
      fused_add_rms_norm_.call(hidden, residual, layer.post_norm, eps_);
      Tensor gate_up = linear(layer.linears[2], hidden);
      Tensor activated = at::empty({gate_up.size(0), gate_up.size(1) / 2}, gate_up.options());
      silu_and_mul_.call(activated, gate_up);
      hidden = linear(layer.linears[3], activated);
    }
    return {hidden, residual};
  }

 private:
  // Attention of executor/models/layers.py: qkv, (q/k norm), rotary, the cache write, paged
  // attention; returns [tokens, heads * head_dim] for o_proj.
  Tensor attention(const Layer& layer, const Tensor& positions, const Tensor& x,
                   const Tensor& key_cache, const Tensor& value_cache, const Tensor& slots,
                   const Tensor& block_tables, const Tensor& seq_lens,
                   const Tensor& query_start_loc) {
    const int64_t tokens = x.size(0);
    const int64_t q_size = heads_ * head_dim_, kv_size = kv_heads_ * head_dim_;
    Tensor qkv = linear(layer.linears[0], x);
    Tensor q = qkv.narrow(1, 0, q_size);
    Tensor k = qkv.narrow(1, q_size, kv_size);
    Tensor v = qkv.narrow(1, q_size + kv_size, kv_size);
    if (layer.q_norm) {   // per head, before rotary
      Tensor rows = q.reshape({-1, head_dim_});
      q = at::empty_like(rows);
      rms_norm_.call(q, rows, *layer.q_norm, eps_);
      rows = k.reshape({-1, head_dim_});
      k = at::empty_like(rows);
      rms_norm_.call(k, rows, *layer.k_norm, eps_);
    }
    q = q.view({tokens, heads_, head_dim_});
    k = k.view({tokens, kv_heads_, head_dim_});
    v = v.view({tokens, kv_heads_, head_dim_});
    const Tensor& table = tables_[layer.table];
    if (rotary_dim_ == head_dim_) {
      rotary_.call(positions, q, k, table);
    } else {   // partial rotary: only the first rotary_dim of each head turns
      Tensor q_rot = q.narrow(2, 0, rotary_dim_).contiguous();
      Tensor k_rot = k.narrow(2, 0, rotary_dim_).contiguous();
      rotary_.call(positions, q_rot, k_rot, table);
      const int64_t rest = head_dim_ - rotary_dim_;
      q = at::cat({q_rot, q.narrow(2, rotary_dim_, rest)}, -1);
      k = at::cat({k_rot, k.narrow(2, rotary_dim_, rest)}, -1);
    }
    write_cache_(k, v, key_cache, value_cache, slots);
    Tensor out = at::empty_like(q);
    paged_attention_.call(out, q, key_cache, value_cache, block_tables, seq_lens,
                          query_start_loc, scale_, layer.window, layer.softcap);
    return out.reshape({tokens, q_size});
  }

  Tensor linear(const Linear& l, const Tensor& x) { return linear_(l, x); }

  int64_t heads_, kv_heads_, head_dim_, rotary_dim_;
  double eps_, scale_;
  std::vector<Tensor> tables_;
  std::vector<Layer> layers_;
  c10::TypedOperatorHandle<NormSig> rms_norm_, fused_add_rms_norm_;
  c10::TypedOperatorHandle<RotarySig> rotary_;
  c10::TypedOperatorHandle<SiluSig> silu_and_mul_;
  c10::TypedOperatorHandle<AttentionSig> paged_attention_;
  folio_step::Linears linear_;
  folio_step::CacheWriter write_cache_;
};

}  // namespace

TORCH_LIBRARY_FRAGMENT(folio, m) {
  m.class_<DecodeStep>("DecodeStep")
      .def(torch::init<int64_t, int64_t, int64_t, int64_t, double, double,
                       std::vector<Tensor>>())
      .def("add_layer", &DecodeStep::add_layer)
      .def("add_linear", &DecodeStep::add_linear)
      .def("num_layers", &DecodeStep::num_layers)
      .def("run", &DecodeStep::run);
}
