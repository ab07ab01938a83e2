// The quantized weight formats of kernels/cpu_quant.py as the matmul kernels read them
// (quant_matmul.cpp: float activations; quant_dot.cpp: int8 activations), and the checks of
// their operators' arguments.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>

#include <cstdint>

namespace folio_quant {

struct Weights {
  const void* data;        // int8 [N, K] or packed uint8 [N, K / 2]
  const float* scales;     // [N, K / group]
  const float* mins;       // [N, K / group], nullptr for int8
  int64_t k, group;
  bool int4;
};

inline void check_operands(const at::Tensor& out, const at::Tensor& x, const at::Tensor& scales,
                           int64_t n, int64_t k, int64_t group, int64_t group_multiple) {
  TORCH_CHECK(x.device().is_cpu() && x.scalar_type() == at::kFloat && x.dim() == 2 &&
              x.is_contiguous(), "x must be a contiguous float32 CPU tensor [M, K]");
  TORCH_CHECK(x.size(1) == k, "x has ", x.size(1), " columns, the weight ", k);
  TORCH_CHECK(out.scalar_type() == at::kFloat && out.is_contiguous() && out.dim() == 2 &&
              out.size(0) == x.size(0) && out.size(1) == n, "out must be float32 [M, N]");
  TORCH_CHECK(group > 0 && k % group == 0, "group ", group, " does not divide K = ", k);
  TORCH_CHECK(group % group_multiple == 0, "group ", group, " is not a multiple of ",
              group_multiple);
  TORCH_CHECK(scales.scalar_type() == at::kFloat && scales.is_contiguous() &&
              scales.numel() == n * (k / group), "scales must be float32 [N, K / group]");
}

// out = x @ W.T for int8 W [N, K] with one scale per `group` values along K.
inline Weights int8_weights(const at::Tensor& out, const at::Tensor& x, const at::Tensor& q,
                            const at::Tensor& scales, int64_t group, int64_t group_multiple) {
  TORCH_CHECK(q.scalar_type() == at::kChar && q.dim() == 2 && q.is_contiguous(),
              "q must be a contiguous int8 [N, K] tensor");
  check_operands(out, x, scales, q.size(0), q.size(1), group, group_multiple);
  return Weights{q.data_ptr(), scales.data_ptr<float>(), nullptr, q.size(1), group, false};
}

// The same for packed int4 [N, K / 2] (GGUF's 32-value blocks) with a scale and a min per group.
inline Weights int4_weights(const at::Tensor& out, const at::Tensor& x, const at::Tensor& packed,
                            const at::Tensor& scales, const at::Tensor& mins, int64_t group) {
  TORCH_CHECK(packed.scalar_type() == at::kByte && packed.dim() == 2 && packed.is_contiguous(),
              "packed must be a contiguous uint8 [N, K / 2] tensor");
  const int64_t k = packed.size(1) * 2;
  check_operands(out, x, scales, packed.size(0), k, group, 32);
  TORCH_CHECK(mins.scalar_type() == at::kFloat && mins.is_contiguous() &&
              mins.numel() == scales.numel(), "mins must be float32 [N, K / group]");
  return Weights{packed.data_ptr(), scales.data_ptr<float>(), mins.data_ptr<float>(), k, group,
                 true};
}

}  // namespace folio_quant
