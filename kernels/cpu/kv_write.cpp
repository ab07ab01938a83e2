// The KV cache write into a cache stored in another type than the model's (kernels/kv_quant.py
// defines the rows; this matches it bit for bit):
//
//   folio::quantize_and_cache(key, value, k_cache, v_cache, slots)
//
// key/value [tokens, kv_heads, head_dim] float32 or bfloat16, heads packed; caches
// contiguous [blocks, block_size, kv_heads, width]: int8 rows (width head_dim + 2: the values
// divided by their float16 scale amax/127, rounded half to even, then the scale's bits),
// float8 e4m3fn/e5m2 (clamped to the finite range) or bfloat16. Slots < 0 are skipped.
// (The torch reference's dozen small ops per layer cost ~180 us a decode step.)
#include <torch/library.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>

#include "vec_math.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

namespace {

using at::Tensor;
using namespace folio_cpu;

template <typename T>
void quantize_int8_row(const T* src, int8_t* dst, int64_t D) {
  float amax = 0.0f;
  for (int64_t d = 0; d < D; ++d) amax = std::max(amax, std::fabs(load(src[d])));
  const c10::Half scale(std::min(amax / 127.0f, 65504.0f));
  const float divisor = static_cast<float>(scale) > 0.0f ? static_cast<float>(scale) : 1.0f;
  for (int64_t d = 0; d < D; ++d) {
    const float q = std::nearbyint(load(src[d]) / divisor);   // half to even, as torch.round
    dst[d] = static_cast<int8_t>(std::clamp(q, -127.0f, 127.0f));
  }
  std::memcpy(dst + D, &scale.x, sizeof scale.x);
}

template <typename T, typename C>
void cast_row(const T* src, C* dst, int64_t D) {
  if constexpr (std::is_same_v<C, c10::BFloat16>) {
    for (int64_t d = 0; d < D; ++d) dst[d] = static_cast<C>(load(src[d]));
  } else {
    // e4m3fn has no infinity to saturate to: clamp to the finite range, as kv_quant does.
    const float limit = static_cast<float>(std::numeric_limits<C>::max());
    for (int64_t d = 0; d < D; ++d) dst[d] = static_cast<C>(std::clamp(load(src[d]), -limit, limit));
  }
}

template <typename T, typename C, typename S>
void write_rows(const Tensor& rows, const Tensor& cache, const S* slots, int64_t tokens) {
  const int64_t heads = rows.size(1), D = rows.size(2), width = cache.size(3);
  const T* src = rows.data_ptr<T>();
  C* dst = static_cast<C*>(cache.data_ptr());
  const int64_t src_stride = rows.stride(0);
  at::parallel_for(0, tokens, 64, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      if (slots[t] < 0) continue;
      for (int64_t h = 0; h < heads; ++h) {
        const T* row = src + t * src_stride + h * D;
        C* out = dst + (static_cast<int64_t>(slots[t]) * heads + h) * width;
        if constexpr (std::is_same_v<C, int8_t>) quantize_int8_row(row, out, D);
        else cast_row(row, out, D);
      }
    }
  });
}

template <typename S>
void write_both(const Tensor& key, const Tensor& value, const Tensor& key_cache,
                const Tensor& value_cache, const S* slots, int64_t tokens) {
  auto by_cache = [&](auto tag) {
    using T = decltype(tag);
    for (const auto& [rows, cache] : {std::pair{key, key_cache}, std::pair{value, value_cache}}) {
      switch (cache.scalar_type()) {
        case at::kChar: write_rows<T, int8_t>(rows, cache, slots, tokens); break;
        case at::kFloat8_e4m3fn: write_rows<T, c10::Float8_e4m3fn>(rows, cache, slots, tokens); break;
        case at::kFloat8_e5m2: write_rows<T, c10::Float8_e5m2>(rows, cache, slots, tokens); break;
        default: write_rows<T, c10::BFloat16>(rows, cache, slots, tokens);
      }
    }
  };
  if (key.scalar_type() == at::kFloat) by_cache(float{});
  else by_cache(c10::BFloat16{});
}

void quantize_and_cache(Tensor key, Tensor value, Tensor key_cache, Tensor value_cache,
                        Tensor slot_mapping) {
  const auto dtype = key.scalar_type(), cache_dtype = key_cache.scalar_type();
  TORCH_CHECK(dtype == at::kFloat || dtype == at::kBFloat16,
              "key must be float32 or bfloat16, got ", dtype);
  TORCH_CHECK(cache_dtype == at::kChar || cache_dtype == at::kFloat8_e4m3fn ||
                  cache_dtype == at::kFloat8_e5m2 || cache_dtype == at::kBFloat16,
              "the cache must be int8, float8 (e4m3fn, e5m2) or bfloat16, got ", cache_dtype);
  const int64_t width = key.size(2) + (cache_dtype == at::kChar ? 2 : 0);
  for (const auto& [rows, cache, name] : {std::tuple{key, key_cache, "key"},
                                          std::tuple{value, value_cache, "value"}}) {
    TORCH_CHECK(rows.device().is_cpu() && cache.device().is_cpu(), name, ": CPU tensors only");
    TORCH_CHECK(rows.scalar_type() == dtype && cache.scalar_type() == cache_dtype, name,
                ": key and value (and their caches) must share a dtype");
    TORCH_CHECK(rows.dim() == 3 && cache.dim() == 4 && rows.size(1) == cache.size(2) &&
                    cache.size(3) == width && rows.size(0) == key.size(0),
                name, " must be [tokens, kv_heads, head_dim] and its cache [blocks, block_size,"
                " kv_heads, ", width, "]");
    TORCH_CHECK(rows.stride(2) == 1 && rows.stride(1) == rows.size(2),
                name, "'s heads must be contiguous within a token");
    TORCH_CHECK(cache.is_contiguous(), name, "'s cache must be contiguous");
  }
  TORCH_CHECK(slot_mapping.dim() == 1 && slot_mapping.size(0) == key.size(0) &&
                  slot_mapping.is_contiguous(),
              "slot_mapping must be a contiguous [tokens] tensor, as many as key and value");
  const int64_t slots_total = key_cache.size(0) * key_cache.size(1);
  auto run = [&](const auto* slots) {
    for (int64_t t = 0; t < key.size(0); ++t)
      TORCH_CHECK(slots[t] < slots_total, "slot ", slots[t], " is outside the cache's ",
                  slots_total, " slots");
    write_both(key, value, key_cache, value_cache, slots, key.size(0));
  };
  if (slot_mapping.scalar_type() == at::kLong) {
    run(slot_mapping.data_ptr<int64_t>());
  } else {
    TORCH_CHECK(slot_mapping.scalar_type() == at::kInt, "slot_mapping must be int32 or int64");
    run(slot_mapping.data_ptr<int32_t>());
  }
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(folio, m) {
  m.def("quantize_and_cache(Tensor key, Tensor value, Tensor(a!) key_cache, "
        "Tensor(b!) value_cache, Tensor slot_mapping) -> ()");
}

TORCH_LIBRARY_IMPL(folio, CPU, m) { m.impl("quantize_and_cache", &quantize_and_cache); }
