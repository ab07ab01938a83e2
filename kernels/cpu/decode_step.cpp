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
// A linear is one of four kinds, chosen per layer in Python once:
//   0 torch:   at::linear(x, weight, bias)                              tensors [weight, (bias)]
//   1 oneDNN:  mkldnn::_linear_pointwise(x, packed, bias, "none", [], None)  [packed, (bias)]
//   2 int8/4:  folio::weight_only_linear(x as float32, operands, config), back to x's dtype
//              tensors, config = WeightOnlyLinear.native_operands()
//   3 bf16:    folio::bf16_linear(x, packed, bias, n)       [packed, (bias float32)], config [n]
//
// The operators are reached through typed dispatcher handles looked up once, at construction
// (findSchemaOrThrow returns its handle by value: each is kept here, in this object).
#include <torch/custom_class.h>
#include <torch/library.h>
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include <optional>
#include <string_view>
#include <tuple>
#include <vector>

namespace {

using at::Tensor;

enum LinearKind : int64_t { kTorch = 0, kOneDnn = 1, kWeightOnly = 2, kBf16Tiles = 3 };

struct Linear {
  int64_t kind = kTorch;
  Tensor weight;                  // torch: [N, K]; oneDNN / bf16: the packed weight
  std::optional<Tensor> bias;     // torch, oneDNN, bf16 (float32)
  int64_t n = 0;                  // bf16: output features
  std::vector<Tensor> operands;   // weight-only: data, scales, (mins), (bias)
  std::vector<int64_t> config;    // weight-only: WeightOnlyLinear.native_operands()
};

struct Layer {
  Tensor input_norm, post_norm;
  std::optional<Tensor> q_norm, k_norm;
  int64_t window = 0;       // 0: full attention
  double softcap = 0.0;     // 0: none
  int64_t table = 0;        // which cos/sin table
  std::vector<Linear> linears;   // qkv, o, gate_up, down
};

template <typename Sig>
c10::TypedOperatorHandle<Sig> handle(const char* name) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, "").typed<Sig>();
}

using NormSig = void(Tensor, Tensor, Tensor, double);
using RotarySig = void(Tensor, Tensor, Tensor, Tensor);
using SiluSig = void(Tensor, Tensor);
using CacheSig = void(Tensor, Tensor, Tensor, Tensor, Tensor);
using AttentionSig = void(const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                          const Tensor&, const Tensor&, const Tensor&, double, int64_t, double);
using WeightOnlySig = Tensor(const Tensor&, std::vector<Tensor>, at::IntArrayRef);
using OneDnnSig = Tensor(const Tensor&, const Tensor&, const std::optional<Tensor>&,
                         std::string_view, c10::List<std::optional<at::Scalar>>,
                         std::optional<std::string_view>);
using Bf16Sig = Tensor(const Tensor&, const Tensor&, const std::optional<Tensor>&, int64_t);

bool heads_packed(const Tensor& rows) {   // kernels/cpu_fused.py _heads_packed
  return rows.dim() == 3 && rows.stride(2) == 1 && rows.stride(1) == rows.size(2);
}

bool stored_cache_type(at::ScalarType t) {   // kernels/cpu_fused.py _STORED
  return t == at::kChar || t == at::kFloat8_e4m3fn || t == at::kFloat8_e5m2 ||
         t == at::kBFloat16;
}

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
        reshape_and_cache_(handle<CacheSig>("folio::reshape_and_cache")),
        quantize_and_cache_(handle<CacheSig>("folio::quantize_and_cache")),
        paged_attention_(handle<AttentionSig>("folio::paged_attention")),
        weight_only_linear_(handle<WeightOnlySig>("folio::weight_only_linear")) {
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
    Linear linear;
    linear.kind = kind;
    if (kind == kWeightOnly) {
      linear.operands = std::move(tensors);
      linear.config = std::move(config);
    } else {
      TORCH_CHECK(kind == kTorch || kind == kOneDnn || kind == kBf16Tiles,
                  "linear kind must be 0, 1, 2 or 3, got ", kind);
      TORCH_CHECK(kind != kBf16Tiles || config.size() == 1, "a bf16 linear's config is [n]");
      TORCH_CHECK(tensors.size() == 1 || tensors.size() == 2,
                  "a float linear's tensors are [weight, (bias)]");
      linear.weight = tensors[0];
      if (tensors.size() == 2) linear.bias = tensors[1];
      if (kind == kBf16Tiles) {
        linear.n = config[0];
        if (!bf16_linear_) bf16_linear_ = handle<Bf16Sig>("folio::bf16_linear");
      }
      if (kind == kOneDnn && !linear_pointwise_) {   // only models that use it look it up
        linear_pointwise_ = handle<OneDnnSig>("mkldnn::_linear_pointwise");
      }
    }
    layers_.back().linears.push_back(std::move(linear));
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
    write_cache(k, v, key_cache, value_cache, slots);
    Tensor out = at::empty_like(q);
    paged_attention_.call(out, q, key_cache, value_cache, block_tables, seq_lens,
                          query_start_loc, scale_, layer.window, layer.softcap);
    return out.reshape({tokens, q_size});
  }

  // kernels/cpu_fused.py reshape_and_cache_cpu's choice; its torch-reference case (layouts
  // the step never makes) is an error here.
  void write_cache(const Tensor& k, const Tensor& v, const Tensor& key_cache,
                   const Tensor& value_cache, const Tensor& slots) {
    const auto dtype = k.scalar_type(), cache_dtype = key_cache.scalar_type();
    const bool layouts = heads_packed(k) && heads_packed(v) && key_cache.is_contiguous() &&
                         value_cache.is_contiguous();
    if (stored_cache_type(cache_dtype) && (dtype == at::kFloat || dtype == at::kBFloat16) &&
        v.scalar_type() == dtype && dtype != cache_dtype &&
        value_cache.scalar_type() == cache_dtype && layouts) {
      quantize_and_cache_.call(k, v, key_cache, value_cache, slots);
      return;
    }
    TORCH_CHECK(dtype == cache_dtype && v.scalar_type() == dtype &&
                    value_cache.scalar_type() == cache_dtype && layouts,
                "the native decode step writes ", dtype, " keys into a contiguous cache of "
                "that dtype or of bfloat16, int8 or float8, not ", cache_dtype);
    reshape_and_cache_.call(k, v, key_cache, value_cache, slots);
  }

  Tensor linear(const Linear& l, const Tensor& x) {
    // One float32 row goes in twice, as executor/linear.py's PackedLinear does: oneDNN's
    // one-row kernel sums in another order than its batch kernel.
    if (l.kind == kOneDnn && x.size(0) == 1 && x.scalar_type() == at::kFloat)
      return float_linear(l, x.expand({2, x.size(1)})).narrow(0, 0, 1);
    if (l.kind != kWeightOnly) return float_linear(l, x);
    // As WeightOnlyLinear.forward: float32 in, the model's dtype out.
    Tensor flat = x.reshape({-1, x.size(-1)}).to(at::kFloat).contiguous();
    return weight_only_linear_.call(flat, l.operands, l.config).to(x.scalar_type());
  }

  Tensor float_linear(const Linear& l, const Tensor& x) {
    switch (l.kind) {
      case kTorch:
        return at::linear(x, l.weight, l.bias);
      case kOneDnn:
        return linear_pointwise_->call(x, l.weight, l.bias, "none", no_scalars_, std::nullopt);
      case kBf16Tiles:
        return bf16_linear_->call(x.contiguous(), l.weight, l.bias, l.n);
      default:
        TORCH_CHECK(false, "not a float linear");
    }
  }

  int64_t heads_, kv_heads_, head_dim_, rotary_dim_;
  double eps_, scale_;
  std::vector<Tensor> tables_;
  std::vector<Layer> layers_;
  c10::TypedOperatorHandle<NormSig> rms_norm_, fused_add_rms_norm_;
  c10::TypedOperatorHandle<RotarySig> rotary_;
  c10::TypedOperatorHandle<SiluSig> silu_and_mul_;
  c10::TypedOperatorHandle<CacheSig> reshape_and_cache_, quantize_and_cache_;
  c10::TypedOperatorHandle<AttentionSig> paged_attention_;
  c10::TypedOperatorHandle<WeightOnlySig> weight_only_linear_;
  std::optional<c10::TypedOperatorHandle<OneDnnSig>> linear_pointwise_;
  std::optional<c10::TypedOperatorHandle<Bf16Sig>> bf16_linear_;
  c10::List<std::optional<at::Scalar>> no_scalars_;
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
