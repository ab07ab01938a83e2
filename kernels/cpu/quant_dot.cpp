// Quantized matmuls with int8 activations for small batches (decode steps): y[M, N] =
// xq[M, K] . W[N, K]^T, where each row of x is quantized per block of 32 values
// (scale = max|x| / 127 over the block, q = round-half-even(x / scale): llama.cpp's Q8_0
// scheme for activations), and the sums are integer dot products of 32 values at a time.
//
//   folio::quant_dot_int8(out, x, q, scales, group)
//       q int8 [N, K] in -127..127; scales float32 [N, K / group]; w = q * scale
//   folio::quant_dot_int4(out, x, packed, scales, mins, group)
//       kernels/cpu/quant_matmul.cpp's int4 layout (GGUF Q4_0/Q4_1 blocks); w = q * s + min
//   group is a multiple of 32 and K a multiple of group.
//
// Why: on a one-user decode step the float kernel spends about 6 instructions per 8 weights
// converting int8 to float and multiplying (on AVX2 that, not memory, bounds it); the
// integer dot product of 32 values is 4 (sign, multiply-add pairs twice, convert) plus one
// float FMA per block, so a step reads its weights about 3x faster. The price is the
// activations' rounding, a few parts in a thousand per block (docs/benchmarks.md, quality).
//
// int8 x int8 uses the sign trick (x86 has u8 x s8 multiply-adds only): |qx| times qw with
// qx's sign, which is why q must not hold -128. int4 values are unsigned already.
#include <torch/library.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <vector>

#if defined(__AVX2__)
#include <immintrin.h>
#endif

#include "quant_weights.h"

namespace {

using at::Tensor;
using folio_quant::Weights;

constexpr int kBlock = 32;   // values per activation scale and per integer dot product
constexpr int kRowsM = 4;    // rows of x sharing each loaded block of W
constexpr int kRowsN = 2;    // rows of W per register block

// x [M, K] quantized per block of 32.
struct QuantizedX {
  int64_t rows, k;
  std::vector<int8_t> q;           // [M, K]
  std::vector<uint8_t> magnitude;  // |q|, [M, K]
  std::vector<float> scale;        // [M, K / 32]
  std::vector<float> scaled_sum;   // scale * sum(q) per block, for int4's mins
};

QuantizedX quantize_x(const float* x, int64_t rows, int64_t k) {
  QuantizedX out{rows, k, std::vector<int8_t>(rows * k), std::vector<uint8_t>(rows * k),
                 std::vector<float>(rows * k / kBlock), std::vector<float>(rows * k / kBlock)};
  for (int64_t b = 0; b < rows * k / kBlock; ++b) {
    const float* values = x + b * kBlock;
    float amax = 0.f;
    for (int i = 0; i < kBlock; ++i) amax = std::max(amax, std::fabs(values[i]));
    const float scale = amax / 127.f;
    const float inverse = amax > 0.f ? 127.f / amax : 0.f;
    int sum = 0;
    for (int i = 0; i < kBlock; ++i) {
      const int q = static_cast<int>(std::nearbyint(values[i] * inverse));
      out.q[b * kBlock + i] = static_cast<int8_t>(q);
      out.magnitude[b * kBlock + i] = static_cast<uint8_t>(std::abs(q));
      sum += q;
    }
    out.scale[b] = scale;
    out.scaled_sum[b] = scale * static_cast<float>(sum);
  }
  return out;
}


#if defined(__AVX2__)
inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// The 32 int4 values of one block as bytes 0..15, in order.
inline __m256i load_int4_block(const uint8_t* p) {
  const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  const __m128i mask = _mm_set1_epi8(0x0F);
  return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(raw, 4), mask),
                          _mm_and_si128(raw, mask));
}

template <int NB, int MB>
void register_block(const Weights& w, int64_t n0, const QuantizedX& x, int64_t m0, float* out,
                    int64_t ldo) {
  const int64_t blocks = w.k / kBlock, per_group = w.group / kBlock, groups = w.k / w.group;
  const __m256i ones = _mm256_set1_epi16(1);
  __m256 acc[NB][MB];
  float min_terms[NB][MB] = {};
#pragma GCC unroll 8
  for (int j = 0; j < NB; ++j)
#pragma GCC unroll 8
    for (int m = 0; m < MB; ++m) acc[j][m] = _mm256_setzero_ps();
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t g = b / per_group;
#pragma GCC unroll 8
    for (int j = 0; j < NB; ++j) {
      const int64_t n = n0 + j;
      const float wscale = w.scales[n * groups + g];
      __m256i wv;
      if (w.int4) {
        wv = load_int4_block(static_cast<const uint8_t*>(w.data) + n * (w.k / 2) + b * 16);
      } else {
        wv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(
            static_cast<const int8_t*>(w.data) + n * w.k + b * kBlock));
      }
#pragma GCC unroll 8
      for (int m = 0; m < MB; ++m) {
        const int64_t at = (m0 + m) * w.k + b * kBlock;
        const __m256i xq = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(&x.q[at]));
        __m256i pairs;
        if (w.int4) {
          pairs = _mm256_maddubs_epi16(wv, xq);
        } else {
          const __m256i xm = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(&x.magnitude[at]));
          pairs = _mm256_maddubs_epi16(xm, _mm256_sign_epi8(wv, xq));
        }
        const __m256 dot = _mm256_cvtepi32_ps(_mm256_madd_epi16(pairs, ones));
        const float xscale = x.scale[(m0 + m) * blocks + b];
        acc[j][m] = _mm256_fmadd_ps(dot, _mm256_set1_ps(xscale * wscale), acc[j][m]);
        if (w.int4) min_terms[j][m] += w.mins[n * groups + g] * x.scaled_sum[(m0 + m) * blocks + b];
      }
    }
  }
  for (int j = 0; j < NB; ++j)
    for (int m = 0; m < MB; ++m) out[(m0 + m) * ldo + n0 + j] = hsum(acc[j][m]) + min_terms[j][m];
}
#else
// Portable: the same integer sums, one value at a time (identical results: integer sums
// are exact and each block's float terms are added in the same order).
template <int NB, int MB>
void register_block(const Weights& w, int64_t n0, const QuantizedX& x, int64_t m0, float* out,
                    int64_t ldo) {
  const int64_t blocks = w.k / kBlock, per_group = w.group / kBlock, groups = w.k / w.group;
  for (int j = 0; j < NB; ++j) {
    const int64_t n = n0 + j;
    for (int m = 0; m < MB; ++m) {
      float total = 0.f, min_term = 0.f;
      for (int64_t b = 0; b < blocks; ++b) {
        const int64_t g = b / per_group;
        const int64_t at = (m0 + m) * w.k + b * kBlock;
        int dot = 0;
        for (int i = 0; i < kBlock; ++i) {
          int value;
          if (w.int4) {
            const uint8_t byte = static_cast<const uint8_t*>(w.data)[n * (w.k / 2) + b * 16 + i % 16];
            value = i < 16 ? (byte & 0xF) : (byte >> 4);
          } else {
            value = static_cast<const int8_t*>(w.data)[n * w.k + b * kBlock + i];
          }
          dot += value * x.q[at + i];
        }
        total += static_cast<float>(dot) * (x.scale[(m0 + m) * blocks + b] * w.scales[n * groups + g]);
        if (w.int4) min_term += w.mins[n * groups + g] * x.scaled_sum[(m0 + m) * blocks + b];
      }
      out[(m0 + m) * ldo + n] = total + min_term;
    }
  }
}
#endif

template <int NB>
void rows_block(const Weights& w, int64_t n0, const QuantizedX& x, int64_t m0, int64_t rows,
                float* out, int64_t ldo) {
  switch (rows) {
    case 1: register_block<NB, 1>(w, n0, x, m0, out, ldo); break;
    case 2: register_block<NB, 2>(w, n0, x, m0, out, ldo); break;
    case 3: register_block<NB, 3>(w, n0, x, m0, out, ldo); break;
    default: register_block<NB, 4>(w, n0, x, m0, out, ldo); break;
  }
}

void matmul(const Weights& w, const float* x_values, int64_t m_rows, int64_t n_rows, float* out) {
  const QuantizedX x = quantize_x(x_values, m_rows, w.k);
  // Tiles of 16 rows of W: both threads have work on the smallest layers.
  constexpr int64_t tile = 16;
  const int64_t tiles = (n_rows + tile - 1) / tile;
  at::parallel_for(0, tiles, 1, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const int64_t n_begin = t * tile, n_end = std::min(n_rows, n_begin + tile);
      for (int64_t m = 0; m < m_rows; m += kRowsM) {
        const int64_t rows = std::min<int64_t>(kRowsM, m_rows - m);
        int64_t n = n_begin;
        for (; n + kRowsN <= n_end; n += kRowsN) rows_block<kRowsN>(w, n, x, m, rows, out, n_rows);
        for (; n < n_end; ++n) rows_block<1>(w, n, x, m, rows, out, n_rows);
      }
    }
  });
}

void quant_dot_int8(Tensor out, const Tensor& x, const Tensor& q, const Tensor& scales,
                    int64_t group) {
  const Weights w = folio_quant::int8_weights(out, x, q, scales, group, kBlock);
  matmul(w, x.data_ptr<float>(), x.size(0), q.size(0), out.data_ptr<float>());
}

void quant_dot_int4(Tensor out, const Tensor& x, const Tensor& packed, const Tensor& scales,
                    const Tensor& mins, int64_t group) {
  const Weights w = folio_quant::int4_weights(out, x, packed, scales, mins, group);
  matmul(w, x.data_ptr<float>(), x.size(0), packed.size(0), out.data_ptr<float>());
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(folio, m) {
  m.def("quant_dot_int8(Tensor(a!) out, Tensor x, Tensor q, Tensor scales, int group) -> ()");
  m.def("quant_dot_int4(Tensor(a!) out, Tensor x, Tensor packed, Tensor scales, Tensor mins, "
        "int group) -> ()");
}

TORCH_LIBRARY_IMPL(folio, CPU, m) {
  m.impl("quant_dot_int8", quant_dot_int8);
  m.impl("quant_dot_int4", quant_dot_int4);
}
