// The one entry of a weight-only quantized linear layer (executor/quantization/
// weight_only_linear.py), for the layer's Python forward and for the native decode step alike:
//
//   folio::weight_only_linear(x, operands, config) -> y
//       x float32 [M, K] contiguous; y float32 [M, N] (the bias added)
//       operands, config: as WeightOnlyLinear.native_operands() lays them out:
//         config = [bits, group, int8_activations, has_bias, layout, n]
//         operands = [data, scales, (mins if bits == 4), (bias if has_bias)]
//       layout 1: data, scales and mins repacked for the AVX-512 VNNI kernel
//       (kernels/vnni_layout.py), which takes every batch size (vnni_gemm.cpp). layout 0:
//       as kernels/cpu_quant.py holds them, and
// up to kSmallBatch rows run the register-blocked kernels (quant_dot.cpp with int8
// activations, else quant_matmul.cpp); more rows multiply x by tiles of W dequantized to
// float32 (a float GEMM), each tile small enough to stay in cache.
#include <torch/library.h>
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include <algorithm>
#include <vector>

#include "vnni_gemm.h"

namespace {

using at::Tensor;

constexpr int64_t kSmallBatch = 8;   // read by kernels/cpu_quant.py (small_batch())
constexpr int64_t kTileValues = 2 * 1024 * 1024;    // kernels/cpu_quant.py TILE_VALUES

struct Layout {
  int64_t bits, group;
  bool int8_activations, has_bias, vnni;
  int64_t n;
};

Layout layout_of(const std::vector<Tensor>& operands, at::IntArrayRef config) {
  TORCH_CHECK(config.size() == 6,
              "config must be [bits, group, int8_activations, has_bias, layout, n]");
  const Layout l{config[0], config[1], config[2] != 0, config[3] != 0, config[4] == 1, config[5]};
  TORCH_CHECK(!l.vnni || folio_vnni::available(), "the weights are repacked for the VNNI "
              "kernel, which this build lacks");
  TORCH_CHECK(l.bits == 8 || l.bits == 4, "bits must be 8 or 4, got ", l.bits);
  const size_t expected = 2 + (l.bits == 4) + l.has_bias;
  TORCH_CHECK(operands.size() == expected, "expected ", expected, " operands, got ",
              operands.size());
  return l;
}

template <typename Sig>
c10::TypedOperatorHandle<Sig> op(const char* name) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, "").typed<Sig>();
}

using Int8Sig = void(Tensor, const Tensor&, const Tensor&, const Tensor&, int64_t);
using Int4Sig = void(Tensor, const Tensor&, const Tensor&, const Tensor&, const Tensor&, int64_t);
using Dequant8Sig = void(Tensor, const Tensor&, const Tensor&, int64_t, int64_t, int64_t);
using Dequant4Sig = void(Tensor, const Tensor&, const Tensor&, const Tensor&, int64_t, int64_t,
                         int64_t);

// The AVX2 kernels' handles, looked up once (a lookup per call cost more than a decode row).
struct Kernels {
  c10::TypedOperatorHandle<Int8Sig> dot8 = op<Int8Sig>("folio::quant_dot_int8");
  c10::TypedOperatorHandle<Int8Sig> matmul8 = op<Int8Sig>("folio::quant_matmul_int8");
  c10::TypedOperatorHandle<Int4Sig> dot4 = op<Int4Sig>("folio::quant_dot_int4");
  c10::TypedOperatorHandle<Int4Sig> matmul4 = op<Int4Sig>("folio::quant_matmul_int4");
  c10::TypedOperatorHandle<Dequant8Sig> dequant8 = op<Dequant8Sig>("folio::dequantize_int8");
  c10::TypedOperatorHandle<Dequant4Sig> dequant4 = op<Dequant4Sig>("folio::dequantize_int4");
};

const Kernels& kernels() {
  static const Kernels held;   // after every operator of the library is registered
  return held;
}

void small_batch(Tensor& out, const Tensor& x, const std::vector<Tensor>& w, const Layout& l) {
  const bool dot = l.int8_activations && l.group % 32 == 0;
  const Kernels& k = kernels();
  if (l.bits == 8) {
    (dot ? k.dot8 : k.matmul8).call(out, x, w[0], w[1], l.group);
    return;
  }
  (dot ? k.dot4 : k.matmul4).call(out, x, w[0], w[1], w[2], l.group);
}

void tiled_gemm(Tensor& out, const Tensor& x, const std::vector<Tensor>& w, const Layout& l,
                int64_t n, int64_t k) {
  const int64_t tile = std::min(n, std::max<int64_t>(1, kTileValues / k));
  Tensor weight = at::empty({tile, k}, x.options());
  for (int64_t begin = 0; begin < n; begin += tile) {
    const int64_t end = std::min(n, begin + tile);
    Tensor rows = weight.narrow(0, 0, end - begin);
    if (l.bits == 8) {
      kernels().dequant8.call(rows, w[0], w[1], l.group, begin, end);
    } else {
      kernels().dequant4.call(rows, w[0], w[1], w[2], l.group, begin, end);
    }
    Tensor part = out.narrow(1, begin, end - begin);
    if (tile == n) {
      at::mm_out(out, x, rows.t());
    } else {
      part.copy_(at::mm(x, rows.t()));
    }
  }
}

Tensor weight_only_linear(const Tensor& x, std::vector<Tensor> operands, at::IntArrayRef config) {
  const Layout l = layout_of(operands, config);
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.is_contiguous(),
              "x must be a contiguous float32 [M, K] tensor");
  const int64_t n = l.n;
  Tensor out = at::empty({x.size(0), n}, x.options());
  if (l.vnni) {
    folio_vnni::matmul(out, x, operands, l.bits, l.group, n);
  } else if (x.size(0) <= kSmallBatch) {
    small_batch(out, x, operands, l);
  } else {
    const int64_t k = operands[0].size(1) * (l.bits == 4 ? 2 : 1);
    TORCH_CHECK(x.size(1) == k, "x has ", x.size(1), " columns, the weight ", k);
    tiled_gemm(out, x, operands, l, n, k);
  }
  if (l.has_bias) out.add_(operands.back());
  return out;
}

int64_t weight_only_small_batch() { return kSmallBatch; }

}  // namespace

TORCH_LIBRARY_FRAGMENT(folio, m) {
  m.def("weight_only_linear(Tensor x, Tensor[] operands, int[] config) -> Tensor");
  m.def("weight_only_small_batch() -> int");
}

TORCH_LIBRARY_IMPL(folio, CPU, m) { m.impl("weight_only_linear", weight_only_linear); }
TORCH_LIBRARY_IMPL(folio, CatchAll, m) {
  m.impl("weight_only_small_batch", weight_only_small_batch);
}
