// Fused elementwise operators for the CPU executor: each reads and writes its tensors once,
// where the torch references (kernels/reference.py) make several passes and temporaries.
//
//   folio::rms_norm(out, x, weight, eps)                 out = rmsnorm(x) * weight
//   folio::fused_add_rms_norm(x, residual, weight, eps)  residual += x; x = rmsnorm(residual) * w
//   folio::rotary(positions, query, key, cos_sin)        neox-style rotation, in place
//   folio::silu_and_mul(out, gate_up)                    out = silu(gate) * up, one pass
//   folio::reshape_and_cache(key, value, k_cache, v_cache, slots)   rows into cache slots
//
// (silu's exp is vec_math.h's vector polynomial: a scalar std::exp loop ran 3-4x slower
// than torch's vectorized one.)
//
// float32 or bfloat16; arithmetic in float32. Rows are split across torch's threads.
#include <torch/library.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <c10/util/BFloat16.h>

#include "vec_math.h"

#include <cmath>
#include <cstdint>
#include <vector>

namespace {

using at::Tensor;
using namespace folio_cpu;

void check_rows(const Tensor& t, const char* name) {
  TORCH_CHECK(t.device().is_cpu(), name, " must be a CPU tensor");
  TORCH_CHECK(t.dim() == 2, name, " must be 2-D [tokens, hidden], got ", t.dim(), "-D");
  TORCH_CHECK(t.stride(1) == 1, name, " must be contiguous in its last dimension");
}

void check_dtype(const Tensor& t, const Tensor& like, const char* name) {
  TORCH_CHECK(t.scalar_type() == like.scalar_type(), name, " has dtype ", t.scalar_type(),
              ", expected ", like.scalar_type());
}

template <typename T>
float normalizer(const float* row, int64_t n, float eps) {
  float sum = 0.f;
  for (int64_t i = 0; i < n; ++i) sum += row[i] * row[i];
  return 1.f / std::sqrt(sum / static_cast<float>(n) + eps);
}

// out[r] = weight * to_T(x[r] * rsqrt(mean(x[r]^2) + eps)); with `residual`, x[r] is first
// replaced by x[r] + residual[r], which is also written back to residual[r].
template <typename T>
void norm_rows(T* out, int64_t out_stride, const T* x, int64_t x_stride, T* residual,
               int64_t res_stride, const T* weight, int64_t rows, int64_t n, float eps) {
  at::parallel_for(0, rows, 16, [&](int64_t begin, int64_t end) {
    std::vector<float> buffer(n);
    for (int64_t r = begin; r < end; ++r) {
      const T* xr = x + r * x_stride;
      float* h = buffer.data();
      if (residual != nullptr) {
        T* rr = residual + r * res_stride;
        for (int64_t i = 0; i < n; ++i) {
          T sum = static_cast<T>(static_cast<float>(xr[i]) + static_cast<float>(rr[i]));
          rr[i] = sum;
          h[i] = static_cast<float>(sum);
        }
      } else {
        for (int64_t i = 0; i < n; ++i) h[i] = static_cast<float>(xr[i]);
      }
      const float scale = normalizer<T>(h, n, eps);
      T* o = out + r * out_stride;
      for (int64_t i = 0; i < n; ++i) {
        // As the reference: normalize in float, round to T, then multiply by the weight.
        const T normed = static_cast<T>(h[i] * scale);
        o[i] = static_cast<T>(static_cast<float>(weight[i]) * static_cast<float>(normed));
      }
    }
  });
}

template <typename T>
void dispatch_norm(Tensor& out, const Tensor& x, Tensor* residual, const Tensor& weight,
                   double eps) {
  const int64_t n = x.size(1);
  norm_rows<T>(out.data_ptr<T>(), out.stride(0), x.data_ptr<T>(), x.stride(0),
               residual ? residual->data_ptr<T>() : nullptr, residual ? residual->stride(0) : 0,
               weight.data_ptr<T>(), x.size(0), n, static_cast<float>(eps));
}

void check_norm(const Tensor& x, const Tensor& weight) {
  check_rows(x, "x");
  TORCH_CHECK(weight.dim() == 1 && weight.size(0) == x.size(1) && weight.is_contiguous(),
              "weight must be a contiguous [", x.size(1), "] tensor");
  check_dtype(weight, x, "weight");
  TORCH_CHECK(x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16,
              "float32 or bfloat16 tensors only, got ", x.scalar_type());
}

void rms_norm(Tensor out, Tensor x, Tensor weight, double eps) {
  check_norm(x, weight);
  check_rows(out, "out");
  check_dtype(out, x, "out");
  TORCH_CHECK(out.sizes() == x.sizes(), "out must have x's shape");
  if (x.scalar_type() == at::kFloat) dispatch_norm<float>(out, x, nullptr, weight, eps);
  else dispatch_norm<c10::BFloat16>(out, x, nullptr, weight, eps);
}

void fused_add_rms_norm(Tensor x, Tensor residual, Tensor weight, double eps) {
  check_norm(x, weight);
  check_rows(residual, "residual");
  check_dtype(residual, x, "residual");
  TORCH_CHECK(residual.sizes() == x.sizes(), "residual must have x's shape");
  // x is read (into the sum) before it is overwritten, row by row.
  if (x.scalar_type() == at::kFloat) dispatch_norm<float>(x, x, &residual, weight, eps);
  else dispatch_norm<c10::BFloat16>(x, x, &residual, weight, eps);
}

// One head vector of `dim` values: [a, b] -> [a*cos - b*sin, b*cos + a*sin] (halves a, b).
template <typename T>
inline void rotate(T* v, const float* cos, const float* sin, int64_t half) {
  for (int64_t i = 0; i < half; ++i) {
    const float a = static_cast<float>(v[i]);
    const float b = static_cast<float>(v[i + half]);
    v[i] = static_cast<T>(a * cos[i] - b * sin[i]);
    v[i + half] = static_cast<T>(b * cos[i] + a * sin[i]);
  }
}

template <typename T>
void rotary_impl(const Tensor& positions, Tensor& query, Tensor& key, const Tensor& cos_sin) {
  const int64_t tokens = query.size(0), dim = query.size(2), half = dim / 2;
  const int64_t q_heads = query.size(1), k_heads = key.size(1);
  const int64_t* pos = positions.data_ptr<int64_t>();
  const float* table = cos_sin.data_ptr<float>();
  const int64_t max_pos = cos_sin.size(0);
  T* q = query.data_ptr<T>();
  T* k = key.data_ptr<T>();
  const int64_t qs0 = query.stride(0), qs1 = query.stride(1);
  const int64_t ks0 = key.stride(0), ks1 = key.stride(1);
  for (int64_t t = 0; t < tokens; ++t)
    TORCH_CHECK(pos[t] >= 0 && pos[t] < max_pos, "position ", pos[t], " outside the rotary "
                "table of ", max_pos, " positions");
  at::parallel_for(0, tokens, 8, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const float* cos = table + pos[t] * dim;
      const float* sin = cos + half;
      for (int64_t h = 0; h < q_heads; ++h) rotate<T>(q + t * qs0 + h * qs1, cos, sin, half);
      for (int64_t h = 0; h < k_heads; ++h) rotate<T>(k + t * ks0 + h * ks1, cos, sin, half);
    }
  });
}

void rotary(Tensor positions, Tensor query, Tensor key, Tensor cos_sin) {
  TORCH_CHECK(query.dim() == 3 && key.dim() == 3, "query and key must be [tokens, heads, dim]");
  TORCH_CHECK(query.size(0) == key.size(0) && query.size(2) == key.size(2),
              "query and key must agree in tokens and head size");
  TORCH_CHECK(query.stride(2) == 1 && key.stride(2) == 1,
              "query and key must be contiguous in their last dimension");
  TORCH_CHECK(query.size(2) % 2 == 0, "head size must be even");
  check_dtype(key, query, "key");
  TORCH_CHECK(query.scalar_type() == at::kFloat || query.scalar_type() == at::kBFloat16,
              "float32 or bfloat16 tensors only, got ", query.scalar_type());
  TORCH_CHECK(positions.scalar_type() == at::kLong && positions.dim() == 1 &&
              positions.is_contiguous() && positions.size(0) == query.size(0),
              "positions must be a contiguous int64 [tokens] tensor");
  TORCH_CHECK(cos_sin.scalar_type() == at::kFloat && cos_sin.is_contiguous() &&
              cos_sin.dim() == 2 && cos_sin.size(1) == query.size(2),
              "cos_sin must be a contiguous float32 [positions, head size] table");
  if (query.scalar_type() == at::kFloat) rotary_impl<float>(positions, query, key, cos_sin);
  else rotary_impl<c10::BFloat16>(positions, query, key, cos_sin);
}

// silu(g) = g / (1 + exp(-g)), written with exp of -|g| so that the exp never overflows.
template <typename V>   // a float or a Vec
inline V silu(V g) {
  const V e = exp_nonpositive(g < 0.f ? g : -g);
  return g >= 0.f ? g / (1.f + e) : g * e / (1.f + e);
}

inline void store(float* p, float x) { *p = x; }
inline void store(c10::BFloat16* p, float x) { *p = static_cast<c10::BFloat16>(x); }

template <typename T>
void silu_and_mul_rows(T* out, int64_t out_stride, const T* gate_up, int64_t in_stride,
                       int64_t rows, int64_t n) {
  at::parallel_for(0, rows, 8, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const T* gate = gate_up + r * in_stride;
      const T* up = gate + n;
      T* o = out + r * out_stride;
      int64_t i = 0;
      if constexpr (std::is_same_v<T, float>) {
        for (; i + kLanes <= n; i += kLanes) {
          const Vec v = silu(load_vec(gate + i)) * load_vec(up + i);
          std::memcpy(o + i, &v, sizeof v);
        }
      }
      for (; i < n; ++i) {
        // bfloat16 as the reference: silu rounded to T, then the product rounded to T.
        const float activated = load(static_cast<T>(silu(load(gate[i]))));
        store(o + i, activated * load(up[i]));
      }
    }
  });
}

void silu_and_mul(Tensor out, Tensor gate_up) {
  check_rows(gate_up, "gate_up");
  check_rows(out, "out");
  check_dtype(out, gate_up, "out");
  TORCH_CHECK(gate_up.size(1) % 2 == 0, "gate_up's last dimension must be even");
  const int64_t n = gate_up.size(1) / 2;
  TORCH_CHECK(out.size(0) == gate_up.size(0) && out.size(1) == n,
              "out must be [", gate_up.size(0), ", ", n, "]");
  if (gate_up.scalar_type() == at::kFloat) {
    silu_and_mul_rows<float>(out.data_ptr<float>(), out.stride(0), gate_up.data_ptr<float>(),
                             gate_up.stride(0), gate_up.size(0), n);
  } else {
    TORCH_CHECK(gate_up.scalar_type() == at::kBFloat16,
                "float32 or bfloat16 tensors only, got ", gate_up.scalar_type());
    silu_and_mul_rows<c10::BFloat16>(out.data_ptr<c10::BFloat16>(), out.stride(0),
                                     gate_up.data_ptr<c10::BFloat16>(), gate_up.stride(0),
                                     gate_up.size(0), n);
  }
}

// Each token's [kv_heads, head_dim] row is contiguous in `rows` (a view of the qkv output)
// and in the cache [blocks, block_size, kv_heads, head_dim]: one copy per token and tensor.
template <typename S>
void copy_rows(const Tensor& rows, Tensor& cache, const S* slots, int64_t tokens) {
  const int64_t width = cache.size(2) * cache.size(3);
  const int64_t num_slots = cache.size(0) * cache.size(1);
  const int64_t bytes = width * cache.element_size();
  const char* src = static_cast<const char*>(rows.data_ptr());
  char* dst = static_cast<char*>(cache.data_ptr());
  const int64_t src_stride = rows.stride(0) * rows.element_size();
  for (int64_t t = 0; t < tokens; ++t) {
    const int64_t slot = static_cast<int64_t>(slots[t]);
    if (slot < 0) continue;   // a padding row
    TORCH_CHECK(slot < num_slots, "slot ", slot, " outside the cache of ", num_slots, " slots");
    std::memcpy(dst + slot * bytes, src + t * src_stride, bytes);
  }
}

void check_cache_rows(const Tensor& rows, const Tensor& cache, const char* name) {
  TORCH_CHECK(rows.device().is_cpu() && cache.device().is_cpu(), name, " must be on the CPU");
  TORCH_CHECK(rows.dim() == 3 && cache.dim() == 4 && rows.size(1) == cache.size(2) &&
              rows.size(2) == cache.size(3), name, " must be [tokens, kv_heads, head_dim] and "
              "its cache [blocks, block_size, kv_heads, head_dim]");
  TORCH_CHECK(rows.stride(2) == 1 && rows.stride(1) == rows.size(2),
              name, "'s heads must be contiguous within a token");
  TORCH_CHECK(cache.is_contiguous(), name, "'s cache must be contiguous");
  TORCH_CHECK(rows.scalar_type() == cache.scalar_type(), name, " has dtype ",
              rows.scalar_type(), ", its cache ", cache.scalar_type());
}

void reshape_and_cache(Tensor key, Tensor value, Tensor key_cache, Tensor value_cache,
                       Tensor slot_mapping) {
  check_cache_rows(key, key_cache, "key");
  check_cache_rows(value, value_cache, "value");
  TORCH_CHECK(value.size(0) == key.size(0) && slot_mapping.dim() == 1 &&
              slot_mapping.size(0) == key.size(0) && slot_mapping.is_contiguous(),
              "slot_mapping must be a contiguous [tokens] tensor, as many as key and value");
  const int64_t tokens = key.size(0);
  if (slot_mapping.scalar_type() == at::kLong) {
    const int64_t* slots = slot_mapping.data_ptr<int64_t>();
    copy_rows(key, key_cache, slots, tokens);
    copy_rows(value, value_cache, slots, tokens);
  } else {
    TORCH_CHECK(slot_mapping.scalar_type() == at::kInt, "slot_mapping must be int32 or int64");
    const int32_t* slots = slot_mapping.data_ptr<int32_t>();
    copy_rows(key, key_cache, slots, tokens);
    copy_rows(value, value_cache, slots, tokens);
  }
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(folio, m) {
  m.def("rms_norm(Tensor(a!) out, Tensor x, Tensor weight, float eps) -> ()");
  m.def("fused_add_rms_norm(Tensor(a!) x, Tensor(b!) residual, Tensor weight, float eps) -> ()");
  m.def("rotary(Tensor positions, Tensor(a!) query, Tensor(b!) key, Tensor cos_sin) -> ()");
  m.def("silu_and_mul(Tensor(a!) out, Tensor gate_up) -> ()");
  m.def("reshape_and_cache(Tensor key, Tensor value, Tensor(a!) key_cache, "
        "Tensor(b!) value_cache, Tensor slot_mapping) -> ()");
}

TORCH_LIBRARY_IMPL(folio, CPU, m) {
  m.impl("rms_norm", &rms_norm);
  m.impl("fused_add_rms_norm", &fused_add_rms_norm);
  m.impl("rotary", &rotary);
  m.impl("silu_and_mul", &silu_and_mul);
  m.impl("reshape_and_cache", &reshape_and_cache);
}
