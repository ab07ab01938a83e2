// bfloat16 weights times bfloat16 activations on AVX-512 BF16, for every batch size.
//
//   folio::bf16_linear(x, packed, bias, n) -> y
//       x bfloat16 [M, K] contiguous, K even; y bfloat16 [M, n] (bias, if any, added in float)
//       packed: bfloat16 [tiles, K / 2, 16, 2] from kernels/bf16_layout.py: one 64-byte load
//       holds 2 consecutive K values of 16 output rows, so one vdpbf16ps multiplies them by
//       a pair of x broadcast to every lane and adds into 16 float sums, one per output row.
//   folio::bf16_gemm_available() -> bool
//
// Why: oneDNN's bfloat16 kernel for one row reads the weights at about half the memory's
// speed on AVX-512 CPUs without AMX (docs/cpu.md), so one user's step takes twice the floor.
// This kernel reads each weight byte once per step and has several independent sums in
// flight, which is what a single row needs; a batch reuses each loaded tile for up to 4 rows.
// The same kernel serves every batch size, and each output's sum runs over K in the same
// order whatever the batch: a request's tokens do not depend on its company.
#include <torch/library.h>
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>
#include <optional>

#if defined(__AVX512F__) && defined(__AVX512BF16__)
#define FOLIO_BF16_GEMM 1
#include <immintrin.h>
#endif

namespace {

using at::Tensor;

#if FOLIO_BF16_GEMM

constexpr int64_t kLanes = 16;   // output rows per tile
constexpr int64_t kTiles = 4;    // tiles one task computes side by side (64 outputs)

struct Problem {
  const uint16_t* x;             // [M, K] bfloat16 bits
  const uint16_t* w;             // [tiles, K / 2, 16, 2]
  const float* bias;             // [n] or null
  uint16_t* y;                   // [M, n]
  int64_t k, n, tiles;
};

// ROWS rows of x (from m0) against TILES tiles (from t0): ROWS x TILES accumulators.
template <int ROWS, int TILES>
void block(const Problem& p, int64_t m0, int64_t t0) {
  const int64_t pairs = p.k / 2, tile_values = pairs * 32;
  __m512 acc[ROWS][TILES];
  for (int r = 0; r < ROWS; ++r)
    for (int t = 0; t < TILES; ++t) acc[r][t] = _mm512_setzero_ps();
  const int32_t* xr[ROWS];
  for (int r = 0; r < ROWS; ++r)
    xr[r] = reinterpret_cast<const int32_t*>(p.x + (m0 + r) * p.k);
  const uint16_t* wt = p.w + t0 * tile_values;
  for (int64_t q = 0; q < pairs; ++q) {
    __m512bh wv[TILES];
    for (int t = 0; t < TILES; ++t)
      wv[t] = (__m512bh)_mm512_loadu_si512(wt + t * tile_values + q * 32);
    for (int r = 0; r < ROWS; ++r) {
      const __m512bh xv = (__m512bh)_mm512_set1_epi32(xr[r][q]);
      for (int t = 0; t < TILES; ++t) acc[r][t] = _mm512_dpbf16_ps(acc[r][t], xv, wv[t]);
    }
  }
  for (int t = 0; t < TILES; ++t) {
    const int64_t n0 = (t0 + t) * kLanes;
    const int64_t live = std::min<int64_t>(kLanes, p.n - n0);
    const __mmask16 keep = live >= kLanes ? 0xFFFF : static_cast<__mmask16>((1u << live) - 1);
    const __m512 bias = p.bias ? _mm512_maskz_loadu_ps(keep, p.bias + n0) : _mm512_setzero_ps();
    for (int r = 0; r < ROWS; ++r) {
      const __m256bh out = _mm512_cvtneps_pbh(_mm512_add_ps(acc[r][t], bias));
      _mm256_mask_storeu_epi16(p.y + (m0 + r) * p.n + n0, keep, (__m256i)out);
    }
  }
}

template <int TILES>
void rows(const Problem& p, int64_t m, int64_t t0) {
  // One row gets all its sums from the 4-tile block; rows of a batch go 4 at a time. Either
  // way each output is one accumulator over K in order, so its value is the same.
  int64_t m0 = 0;
  for (; m0 + 4 <= m; m0 += 4) block<4, TILES>(p, m0, t0);
  switch (m - m0) {
    case 3: block<3, TILES>(p, m0, t0); break;
    case 2: block<2, TILES>(p, m0, t0); break;
    case 1: block<1, TILES>(p, m0, t0); break;
    default: break;
  }
}

Tensor bf16_linear(const Tensor& x, const Tensor& packed, const std::optional<Tensor>& bias,
                   int64_t n) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kBFloat16 && x.is_contiguous(),
              "x must be contiguous bfloat16 [M, K], got ", x.scalar_type(), " ", x.sizes());
  const int64_t m = x.size(0), k = x.size(1), tiles = (n + kLanes - 1) / kLanes;
  TORCH_CHECK(k % 2 == 0, "K must be even, got ", k);
  TORCH_CHECK(packed.scalar_type() == at::kBFloat16 && packed.is_contiguous() &&
              packed.dim() == 4 && packed.size(0) == tiles && packed.size(1) == k / 2 &&
              packed.size(2) == kLanes && packed.size(3) == 2,
              "packed must be bfloat16 [", tiles, ", ", k / 2, ", 16, 2], got ", packed.sizes());
  TORCH_CHECK(!bias || (bias->scalar_type() == at::kFloat && bias->numel() == n &&
                        bias->is_contiguous()), "bias must be float32 [", n, "]");
  Tensor y = at::empty({m, n}, x.options());
  if (m == 0) return y;
  const Problem p{reinterpret_cast<const uint16_t*>(x.data_ptr()),
                  reinterpret_cast<const uint16_t*>(packed.data_ptr()),
                  bias ? bias->data_ptr<float>() : nullptr,
                  reinterpret_cast<uint16_t*>(y.data_ptr()), k, n, tiles};
  const int64_t groups = (tiles + kTiles - 1) / kTiles;
  at::parallel_for(0, groups, 1, [&](int64_t begin, int64_t end) {
    for (int64_t g = begin; g < end; ++g) {
      const int64_t t0 = g * kTiles;
      switch (std::min(kTiles, tiles - t0)) {
        case 1: rows<1>(p, m, t0); break;
        case 2: rows<2>(p, m, t0); break;
        case 3: rows<3>(p, m, t0); break;
        default: rows<4>(p, m, t0); break;
      }
    }
  });
  return y;
}

bool bf16_gemm_available() { return true; }

#else   // no AVX-512 BF16 in this build: executor/linear.py keeps oneDNN

Tensor bf16_linear(const Tensor&, const Tensor&, const std::optional<Tensor>&, int64_t) {
  TORCH_CHECK(false, "folio::bf16_linear needs AVX-512 BF16, which this build lacks");
}

bool bf16_gemm_available() { return false; }

#endif

}  // namespace

TORCH_LIBRARY_FRAGMENT(folio, m) {
  m.def("bf16_linear(Tensor x, Tensor packed, Tensor? bias, int n) -> Tensor");
  m.def("bf16_gemm_available() -> bool");
}

TORCH_LIBRARY_IMPL(folio, CPU, m) { m.impl("bf16_linear", bf16_linear); }
TORCH_LIBRARY_IMPL(folio, CatchAll, m) { m.impl("bf16_gemm_available", bf16_gemm_available); }
