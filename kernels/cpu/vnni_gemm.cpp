// int8 / int4 weights times int8 activations on AVX-512 VNNI, for every batch size.
//
// Activations are rounded per 32 values as quant_dot.cpp does (llama.cpp's Q8_0 scheme:
// scale = max|x| / 127, q = round-half-even(x / scale)). The weights were repacked at load
// (kernels/vnni_layout.py) so that one 64-byte load holds 4 consecutive K values of 16
// output rows: one vpdpbusd multiplies them by 4 activation bytes broadcast to every lane
// and adds into 16 int32 sums, one per output row. A block of 32 K values is 8 such loads
// for int8 (4 for int4, whose low and high nibbles are two loads' worth), then one
// convert and one FMA by (weight scale x activation scale) per row of x.
//
// Why: the float path converts every weight to float before its FMA (quant_matmul.cpp) and
// the AVX2 integer path needs 6 instructions per 32 weights per row (quant_dot.cpp); here
// it is about 2.5 per 32 weights per row, so one row is bound by memory and a batch by far
// fewer instructions than either, which lets one kernel serve decode, batches and prompts.
// One kernel for every batch size also makes each row's result independent of the batch:
// the same integer sums and the same order of float additions, whatever else is in it.
//
// vpdpbusd multiplies unsigned by signed bytes. int8 weights are stored as w + 128
// (unsigned); the sum of 128 * x over the block comes off again, precomputed per row of x
// and block (exact, in int32). int4 values are 0..15 already; their min adds
// min * scale_x * sum(q_x) per block.
#include <torch/library.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "vnni_gemm.h"

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)
#define FOLIO_VNNI 1
#include <immintrin.h>
#endif

namespace folio_vnni {

#if FOLIO_VNNI
namespace {

using at::Tensor;

constexpr int kBlock = 32;    // K values per activation scale
constexpr int kLanes = 16;    // output rows per tile (one int32 lane each)
constexpr int kMaxRows = 4;   // rows of x sharing each loaded block of W

// x [M, K] rounded per block of 32.
struct Activations {
  int64_t blocks;                  // K / 32
  std::vector<int8_t> q;           // [M, K]
  std::vector<float> scale;        // [M, blocks]
  std::vector<int32_t> offset;     // -128 * sum(q) per block: the int8 weights' +128
  std::vector<float> scaled_sum;   // scale * sum(q) per block: the int4 weights' min
};

void quantize_rows(const float* x, int64_t row_begin, int64_t row_end, Activations& a) {
  for (int64_t b = row_begin * a.blocks; b < row_end * a.blocks; ++b) {
    const float* values = x + b * kBlock;
    const __m512 lo = _mm512_loadu_ps(values), hi = _mm512_loadu_ps(values + 16);
    const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(lo), _mm512_abs_ps(hi)));
    const float inverse = amax > 0.f ? 127.f / amax : 0.f;
    // The default rounding mode: to nearest, ties to even, as std::nearbyint in quant_dot.cpp.
    const __m512i qlo = _mm512_cvtps_epi32(_mm512_mul_ps(lo, _mm512_set1_ps(inverse)));
    const __m512i qhi = _mm512_cvtps_epi32(_mm512_mul_ps(hi, _mm512_set1_ps(inverse)));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(&a.q[b * kBlock]), _mm512_cvtepi32_epi8(qlo));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(&a.q[b * kBlock + 16]), _mm512_cvtepi32_epi8(qhi));
    const int sum = _mm512_reduce_add_epi32(_mm512_add_epi32(qlo, qhi));
    a.scale[b] = amax / 127.f;
    a.offset[b] = -128 * sum;
    a.scaled_sum[b] = a.scale[b] * static_cast<float>(sum);
  }
}

Activations quantize(const Tensor& x) {
  const int64_t m = x.size(0), k = x.size(1), blocks = k / kBlock;
  Activations a{blocks, std::vector<int8_t>(m * k), std::vector<float>(m * blocks),
                std::vector<int32_t>(m * blocks), std::vector<float>(m * blocks)};
  const float* data = x.data_ptr<float>();
  at::parallel_for(0, m, 16, [&](int64_t begin, int64_t end) {
    quantize_rows(data, begin, end, a);
  });
  return a;
}

struct Packed {
  const uint8_t* data;     // [tiles, blocks, loads, 16 lanes, 4 bytes]
  const float* scales;     // [tiles, groups, 16]
  const float* mins;       // [tiles, groups, 16], int4 only
  int64_t blocks, groups, per_group, tile_bytes;
};

// Rows m0 .. m0 + ROWS of x against tile t of W: 16 output rows.
template <int ROWS, bool INT4>
void tile(const Packed& w, int64_t t, const Activations& a, int64_t m0, float* out,
          int64_t ldo, int64_t n) {
  const uint8_t* wt = w.data + t * w.tile_bytes;
  const float* st = w.scales + t * w.groups * kLanes;
  const float* mt = INT4 ? w.mins + t * w.groups * kLanes : nullptr;
  const int32_t* xw[ROWS];
  for (int r = 0; r < ROWS; ++r)
    xw[r] = reinterpret_cast<const int32_t*>(&a.q[(m0 + r) * w.blocks * kBlock]);
  __m512 acc[ROWS];
  for (int r = 0; r < ROWS; ++r) acc[r] = _mm512_setzero_ps();
  const __m512i nibble = _mm512_set1_epi8(0x0F);
  for (int64_t b = 0; b < w.blocks; ++b) {
    const int64_t g = b / w.per_group;
    const __m512 wscale = _mm512_loadu_ps(st + g * kLanes);
    __m512i sums[ROWS];
    for (int r = 0; r < ROWS; ++r)
      sums[r] = INT4 ? _mm512_setzero_si512()
                     : _mm512_set1_epi32(a.offset[(m0 + r) * w.blocks + b]);
    if constexpr (INT4) {
      const uint8_t* wb = wt + b * 4 * 64;
#pragma GCC unroll 4
      for (int l = 0; l < 4; ++l) {
        const __m512i raw = _mm512_loadu_si512(wb + l * 64);
        const __m512i low = _mm512_and_si512(raw, nibble);
        const __m512i high = _mm512_and_si512(_mm512_srli_epi16(raw, 4), nibble);
        for (int r = 0; r < ROWS; ++r) {
          sums[r] = _mm512_dpbusd_epi32(sums[r], low, _mm512_set1_epi32(xw[r][b * 8 + l]));
          sums[r] = _mm512_dpbusd_epi32(sums[r], high, _mm512_set1_epi32(xw[r][b * 8 + 4 + l]));
        }
      }
    } else {
      const uint8_t* wb = wt + b * 8 * 64;
#pragma GCC unroll 8
      for (int l = 0; l < 8; ++l) {
        const __m512i wv = _mm512_loadu_si512(wb + l * 64);
        for (int r = 0; r < ROWS; ++r)
          sums[r] = _mm512_dpbusd_epi32(sums[r], wv, _mm512_set1_epi32(xw[r][b * 8 + l]));
      }
    }
    for (int r = 0; r < ROWS; ++r) {
      const int64_t at = (m0 + r) * w.blocks + b;
      acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sums[r]),
                               _mm512_mul_ps(wscale, _mm512_set1_ps(a.scale[at])), acc[r]);
      if constexpr (INT4)
        acc[r] = _mm512_fmadd_ps(_mm512_loadu_ps(mt + g * kLanes),
                                 _mm512_set1_ps(a.scaled_sum[at]), acc[r]);
    }
  }
  const int64_t n0 = t * kLanes;
  const __mmask16 keep = n - n0 >= kLanes ? 0xFFFF : static_cast<__mmask16>((1u << (n - n0)) - 1);
  for (int r = 0; r < ROWS; ++r) _mm512_mask_storeu_ps(out + (m0 + r) * ldo + n0, keep, acc[r]);
}

template <bool INT4>
void rows(const Packed& w, int64_t t, const Activations& a, int64_t m0, int64_t count,
          float* out, int64_t ldo, int64_t n) {
  switch (count) {
    case 1: tile<1, INT4>(w, t, a, m0, out, ldo, n); break;
    case 2: tile<2, INT4>(w, t, a, m0, out, ldo, n); break;
    case 3: tile<3, INT4>(w, t, a, m0, out, ldo, n); break;
    default: tile<4, INT4>(w, t, a, m0, out, ldo, n); break;
  }
}

}  // namespace

bool available() { return true; }

void matmul(at::Tensor& out, const at::Tensor& x, const std::vector<at::Tensor>& operands,
            int64_t bits, int64_t group, int64_t n) {
  const int64_t m = x.size(0), k = x.size(1);
  TORCH_CHECK(k % kBlock == 0 && group % kBlock == 0 && k % group == 0,
              "the VNNI kernel needs K and the group in whole blocks of 32 (K ", k, ", group ",
              group, ")");
  const Tensor& packed = operands[0];
  const int64_t tiles = (n + kLanes - 1) / kLanes, blocks = k / kBlock;
  const int64_t tile_bytes = blocks * (bits == 8 ? 8 : 4) * 64;
  TORCH_CHECK(packed.scalar_type() == at::kByte && packed.is_contiguous() && packed.dim() == 2 &&
              packed.size(0) == tiles && packed.size(1) == tile_bytes,
              "the packed weight must be uint8 [", tiles, ", ", tile_bytes, "] for N ", n,
              " and K ", k, ", got ", packed.sizes());
  TORCH_CHECK(operands[1].numel() == tiles * (k / group) * kLanes &&
              (bits == 8 || operands[2].numel() == operands[1].numel()),
              "the packed scales (and mins) must be float32 [tiles, K / group, 16]");
  const Packed w{packed.data_ptr<uint8_t>(), operands[1].data_ptr<float>(),
                 bits == 4 ? operands[2].data_ptr<float>() : nullptr, blocks, k / group,
                 group / kBlock, tile_bytes};
  const Activations a = quantize(x);
  float* y = out.data_ptr<float>();
  at::parallel_for(0, tiles, 1, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t)
      for (int64_t m0 = 0; m0 < m; m0 += kMaxRows) {
        const int64_t count = std::min<int64_t>(kMaxRows, m - m0);
        if (bits == 8) rows<false>(w, t, a, m0, count, y, n, n);
        else rows<true>(w, t, a, m0, count, y, n, n);
      }
  });
}

#else   // no AVX-512 VNNI in this build: weight_only_linear.cpp keeps the other kernels

bool available() { return false; }

void matmul(at::Tensor&, const at::Tensor&, const std::vector<at::Tensor>&, int64_t, int64_t,
            int64_t) {
  TORCH_CHECK(false, "this build of the CPU operators has no AVX-512 VNNI kernel");
}

#endif

}  // namespace folio_vnni

namespace {
bool vnni_available() { return folio_vnni::available(); }
}  // namespace

TORCH_LIBRARY_FRAGMENT(folio, m) { m.def("vnni_available() -> bool"); }

TORCH_LIBRARY_IMPL(folio, CatchAll, m) { m.impl("vnni_available", vnni_available); }
