// Integer GEMM on AVX-512 VNNI for weight-only quantized layers (vnni_gemm.cpp), as
// weight_only_linear.cpp calls it. The weights are repacked once at load
// (kernels/vnni_layout.py) into the layout the kernel reads.
#pragma once

#include <ATen/core/Tensor.h>

#include <vector>

namespace folio_vnni {

// Whether this build holds the kernel (compiled with AVX-512 VNNI).
bool available();

// out [M, n] = quantize_per_32(x [M, K]) . W^T, W repacked: operands = [packed, scales,
// (mins for bits 4)] as kernels/vnni_layout.py lays them out; n <= the padded rows.
void matmul(at::Tensor& out, const at::Tensor& x, const std::vector<at::Tensor>& operands,
            int64_t bits, int64_t group, int64_t n);

}  // namespace folio_vnni
