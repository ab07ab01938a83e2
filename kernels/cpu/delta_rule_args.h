// The delta rule's operator arguments, checked alike by its decode step (gated_delta.cpp)
// and its prompt form (gated_delta_chunk.cpp): q, k, out [rows, heads, dim] with a
// contiguous last dimension (the model hands views of one projection's output), v float32
// or bfloat16, g and beta float32 [rows, heads], and the executor's float32 state pool.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>

#include <cstdint>

namespace folio_delta_rule {

inline void check_vectors(const at::Tensor& t, const char* name, int64_t rows, int64_t heads,
                          int64_t dim) {
  TORCH_CHECK(t.device().is_cpu(), name, " must be a CPU tensor");
  TORCH_CHECK(t.dim() == 3 && t.size(0) == rows && t.size(1) == heads && t.size(2) == dim,
              name, " must be [", rows, ", ", heads, ", ", dim, "], got ", t.sizes());
  TORCH_CHECK(t.stride(2) == 1, name, " must be contiguous in its last dimension");
}

inline void check_per_head(const at::Tensor& t, const char* name, int64_t rows,
                           int64_t heads) {
  TORCH_CHECK(t.device().is_cpu() && t.scalar_type() == at::kFloat, name,
              " must be a float32 CPU tensor, got ", t.scalar_type());
  TORCH_CHECK(t.dim() == 2 && t.size(0) == rows && t.size(1) == heads, name, " must be [",
              rows, ", ", heads, "], got ", t.sizes());
}

// Everything but q's and v's rank (each operator says its own row name for those).
inline void check_args(const at::Tensor& out, const at::Tensor& q, const at::Tensor& k,
                       const at::Tensor& v, const at::Tensor& g, const at::Tensor& beta,
                       const at::Tensor& pool, int64_t rows, int64_t heads, int64_t k_dim,
                       int64_t v_dim) {
  check_vectors(q, "q", rows, heads, k_dim);
  check_vectors(k, "k", rows, heads, k_dim);
  check_vectors(v, "v", rows, heads, v_dim);
  check_vectors(out, "out", rows, heads, v_dim);
  TORCH_CHECK(q.scalar_type() == at::kFloat && k.scalar_type() == at::kFloat,
              "q and k must be float32 (l2-normed in float32), got ", q.scalar_type(), " and ",
              k.scalar_type());
  TORCH_CHECK(v.scalar_type() == at::kFloat || v.scalar_type() == at::kBFloat16,
              "v must be float32 or bfloat16, got ", v.scalar_type());
  TORCH_CHECK(out.scalar_type() == at::kFloat, "out must be float32, got ", out.scalar_type());
  check_per_head(g, "g", rows, heads);
  check_per_head(beta, "beta", rows, heads);
  TORCH_CHECK(pool.device().is_cpu() && pool.scalar_type() == at::kFloat,
              "pool must be a float32 CPU tensor, got ", pool.scalar_type());
  TORCH_CHECK(pool.is_contiguous(), "pool must be contiguous (the executor's state pool)");
  TORCH_CHECK(pool.dim() == 4 && pool.size(1) == heads && pool.size(2) == k_dim &&
                  pool.size(3) == v_dim,
              "pool must be [slots, ", heads, ", ", k_dim, ", ", v_dim, "], got ", pool.sizes());
}

}  // namespace folio_delta_rule
