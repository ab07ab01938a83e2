// What the native steps (decode_step.cpp for attention-only decoders, hybrid_step.cpp for
// the hybrids) share: typed dispatcher handles, the linear layers as the Python modules
// call them, and the KV cache write as kernels/cpu_fused.py chooses it.
//
// A linear is one of four kinds, chosen per module in Python once
// (executor/native_step/layers.py linear_operands):
//   0 torch:   at::linear(x, weight, bias)                              tensors [weight, (bias)]
//   1 oneDNN:  mkldnn::_linear_pointwise(x, packed, bias, "none", [], None)  [packed, (bias)]
//   2 int8/4:  folio::weight_only_linear(x as float32, operands, config), back to x's dtype
//              tensors, config = WeightOnlyLinear.native_operands()
//   3 bf16:    folio::bf16_linear(x, packed, bias, n)       [packed, (bias float32)], config [n]
//
// The operators are reached through typed dispatcher handles looked up once, at construction
// (findSchemaOrThrow returns its handle by value: each is kept in the object using it).
#pragma once

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include <optional>
#include <string_view>
#include <vector>

namespace folio_step {

using at::Tensor;

template <typename Sig>
c10::TypedOperatorHandle<Sig> handle(const char* name) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, "").typed<Sig>();
}

enum LinearKind : int64_t { kTorch = 0, kOneDnn = 1, kWeightOnly = 2, kBf16Tiles = 3 };

struct Linear {
  int64_t kind = kTorch;
  Tensor weight;                  // torch: [N, K]; oneDNN / bf16: the packed weight
  std::optional<Tensor> bias;     // torch, oneDNN, bf16 (float32)
  int64_t n = 0;                  // bf16: output features
  std::vector<Tensor> operands;   // weight-only: data, scales, (mins), (bias)
  std::vector<int64_t> config;    // weight-only: WeightOnlyLinear.native_operands()
};

// Builds Linears and runs them as executor/linear.py's modules do.
class Linears {
 public:
  using WeightOnlySig = Tensor(const Tensor&, std::vector<Tensor>, at::IntArrayRef);
  using OneDnnSig = Tensor(const Tensor&, const Tensor&, const std::optional<Tensor>&,
                           std::string_view, c10::List<std::optional<at::Scalar>>,
                           std::optional<std::string_view>);
  using Bf16Sig = Tensor(const Tensor&, const Tensor&, const std::optional<Tensor>&, int64_t);

  Linears() : weight_only_linear_(handle<WeightOnlySig>("folio::weight_only_linear")) {}

  Linear make(int64_t kind, std::vector<Tensor> tensors, std::vector<int64_t> config) {
    Linear linear;
    linear.kind = kind;
    if (kind == kWeightOnly) {
      linear.operands = std::move(tensors);
      linear.config = std::move(config);
      return linear;
    }
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
    return linear;
  }

  Tensor operator()(const Linear& l, const Tensor& x) {
    // One float32 row goes in twice, as executor/linear.py's PackedLinear does: oneDNN's
    // one-row kernel sums in another order than its batch kernel.
    if (l.kind == kOneDnn && x.size(0) == 1 && x.scalar_type() == at::kFloat)
      return float_linear(l, x.expand({2, x.size(1)})).narrow(0, 0, 1);
    if (l.kind != kWeightOnly) return float_linear(l, x);
    // As WeightOnlyLinear.forward: float32 in, the model's dtype out.
    Tensor flat = x.reshape({-1, x.size(-1)}).to(at::kFloat).contiguous();
    return weight_only_linear_.call(flat, l.operands, l.config).to(x.scalar_type());
  }

 private:
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

  c10::TypedOperatorHandle<WeightOnlySig> weight_only_linear_;
  std::optional<c10::TypedOperatorHandle<OneDnnSig>> linear_pointwise_;
  std::optional<c10::TypedOperatorHandle<Bf16Sig>> bf16_linear_;
  c10::List<std::optional<at::Scalar>> no_scalars_;
};

// The KV cache write: kernels/cpu_fused.py reshape_and_cache_cpu's choice; its
// torch-reference case (layouts the steps never make) is an error here.
class CacheWriter {
 public:
  using CacheSig = void(Tensor, Tensor, Tensor, Tensor, Tensor);

  CacheWriter()
      : reshape_and_cache_(handle<CacheSig>("folio::reshape_and_cache")),
        quantize_and_cache_(handle<CacheSig>("folio::quantize_and_cache")) {}

  void operator()(const Tensor& k, const Tensor& v, const Tensor& key_cache,
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

 private:
  static bool heads_packed(const Tensor& rows) {   // kernels/cpu_fused.py _heads_packed
    return rows.dim() == 3 && rows.stride(2) == 1 && rows.stride(1) == rows.size(2);
  }

  static bool stored_cache_type(at::ScalarType t) {   // kernels/cpu_fused.py _STORED
    return t == at::kChar || t == at::kFloat8_e4m3fn || t == at::kFloat8_e5m2 ||
           t == at::kBFloat16;
  }

  c10::TypedOperatorHandle<CacheSig> reshape_and_cache_, quantize_and_cache_;
};

}  // namespace folio_step
