// Weight-only quantized matmuls for the CPU executor: y[M, N] = x[M, K] @ dequant(W)^T, with
// float32 activations and float32 accumulation (the activations are never quantized).
//
//   folio::quant_matmul_int8(out, x, q, scales, group)
//       q int8 [N, K]; scales float32 [N, K / group]; w = q * scale
//   folio::quant_matmul_int4(out, x, packed, scales, mins, group)
//       packed uint8 [N, K / 2]; scales, mins float32 [N, K / group]; w = q * scale + min
//       Each 32 values along K are 16 bytes: byte i holds value i (low nibble) and value
//       i + 16 (high nibble), GGUF Q4_0/Q4_1's block layout, so those blocks are kept as they
//       are in the file. group is a multiple of 32.
//   folio::dequantize_int8(out, q, scales, group, n_begin, n_end)
//   folio::dequantize_int4(out, packed, scales, mins, group, n_begin, n_end)
//       rows n_begin:n_end of the float32 weight, for a float GEMM on large batches
//
// A decode step (M = 1) is bound by the bytes of W, so W is read once, converted to floats
// in registers and multiplied with several rows of x (up to kRowsM) while it is there: the
// dequantize (one FMA per value, w = q * s + m) is shared by those rows, which is what makes
// the same kernel usable for prefill chunks. W is walked in tiles of rows whose bytes stay in
// cache while every row of x passes over them. Threads split the tiles (rows of W).
#include <torch/library.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <cstring>

#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif

#include "quant_weights.h"

namespace {

using at::Tensor;
using folio_quant::Weights;

constexpr int kBlock = 32;   // values per load of W (one GGUF block)
constexpr int kRowsM = 4;    // rows of x sharing each converted block of W

#if defined(__AVX512F__)
constexpr int kLanes = 16;
using V = __m512;
inline V vzero() { return _mm512_setzero_ps(); }
inline V vset(float v) { return _mm512_set1_ps(v); }
inline V vload(const float* p) { return _mm512_loadu_ps(p); }
inline V vfma(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
inline float vsum(V v) { return _mm512_reduce_add_ps(v); }
inline void load_int8(const int8_t* q, V* w) {
  w[0] = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)q)));
  w[1] = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)(q + 16))));
}
inline void load_int4(const uint8_t* p, V* w) {
  const __m512i bytes = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)p));
  const __m512i low = _mm512_and_si512(bytes, _mm512_set1_epi32(0xF));
  w[0] = _mm512_cvtepi32_ps(low);
  w[1] = _mm512_cvtepi32_ps(_mm512_srli_epi32(bytes, 4));
}
#elif defined(__AVX2__) && defined(__FMA__)
constexpr int kLanes = 8;
using V = __m256;
inline V vzero() { return _mm256_setzero_ps(); }
inline V vset(float v) { return _mm256_set1_ps(v); }
inline V vload(const float* p) { return _mm256_loadu_ps(p); }
inline V vfma(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
inline float vsum(V v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
inline void load_int8(const int8_t* q, V* w) {
  for (int i = 0; i < 4; ++i) {
    __m128i eight = _mm_loadl_epi64((const __m128i*)(q + 8 * i));
    w[i] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(eight));
  }
}
inline void load_int4(const uint8_t* p, V* w) {
  const __m256i lo = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)p));
  const __m256i hi = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)(p + 8)));
  const __m256i mask = _mm256_set1_epi32(0xF);
  w[0] = _mm256_cvtepi32_ps(_mm256_and_si256(lo, mask));
  w[1] = _mm256_cvtepi32_ps(_mm256_and_si256(hi, mask));
  w[2] = _mm256_cvtepi32_ps(_mm256_srli_epi32(lo, 4));
  w[3] = _mm256_cvtepi32_ps(_mm256_srli_epi32(hi, 4));
}
#else
// Portable: a "vector" of 4 floats that GCC maps to whatever the target has.
constexpr int kLanes = 4;
typedef float V __attribute__((vector_size(16)));
inline V vzero() { return V{0.f, 0.f, 0.f, 0.f}; }
inline V vset(float v) { return V{v, v, v, v}; }
inline V vload(const float* p) { V v; std::memcpy(&v, p, sizeof v); return v; }
inline V vfma(V a, V b, V c) { return a * b + c; }
inline float vsum(V v) { return v[0] + v[1] + v[2] + v[3]; }
inline void load_int8(const int8_t* q, V* w) {
  for (int i = 0; i < kBlock; ++i) w[i / 4][i % 4] = static_cast<float>(q[i]);
}
inline void load_int4(const uint8_t* p, V* w) {
  for (int i = 0; i < 16; ++i) {
    w[i / 4][i % 4] = static_cast<float>(p[i] & 0xF);
    w[(i + 16) / 4][i % 4] = static_cast<float>(p[i] >> 4);
  }
}
#endif

constexpr int kVecs = kBlock / kLanes;   // vectors per block of 32 values
// Rows of W per register block: their NB x kRowsM accumulators (kVecs wide each) stay in
// registers (32 with AVX-512, 16 with AVX2).
constexpr int kRowsN = kLanes == 16 ? 4 : 2;


// out[m, n0 + j] for m < MB, j < NB: sums over K, one block of 32 values of each W row at a
// time, dequantized in registers and multiplied into all MB rows of x.
template <int NB, int MB>
void register_block(const Weights& w, int64_t n0, const float* x, int64_t ldx, float* out,
                    int64_t ldo) {
  // Every loop over j, m, v is unrolled so the accumulators live in registers (a loop over
  // W's rows outside the loop over K left them in memory: 3x slower).
  V acc[NB][MB][kVecs];
#pragma GCC unroll 16
  for (int j = 0; j < NB; ++j)
#pragma GCC unroll 16
    for (int m = 0; m < MB; ++m)
#pragma GCC unroll 16
      for (int v = 0; v < kVecs; ++v) acc[j][m][v] = vzero();
  const int64_t groups = w.k / w.group;
  const int64_t full = w.group / kBlock * kBlock;   // int8 per-channel: a tail may remain
  float tail[NB][MB] = {};
  for (int64_t g = 0; g < groups; ++g) {
    V vs[NB], vm[NB];
#pragma GCC unroll 16
    for (int j = 0; j < NB; ++j) {
      const int64_t at = (n0 + j) * groups + g;
      vs[j] = vset(w.scales[at]);
      vm[j] = vset(w.mins != nullptr ? w.mins[at] : 0.f);
    }
    for (int64_t k = g * w.group; k < g * w.group + full; k += kBlock) {
#pragma GCC unroll 16
      for (int j = 0; j < NB; ++j) {
        V wv[kVecs];
        if (w.int4) {
          load_int4(static_cast<const uint8_t*>(w.data) + (n0 + j) * (w.k / 2) + k / 2, wv);
        } else {
          load_int8(static_cast<const int8_t*>(w.data) + (n0 + j) * w.k + k, wv);
        }
#pragma GCC unroll 16
        for (int v = 0; v < kVecs; ++v) wv[v] = vfma(wv[v], vs[j], vm[j]);
#pragma GCC unroll 16
        for (int m = 0; m < MB; ++m)
#pragma GCC unroll 16
          for (int v = 0; v < kVecs; ++v)
            acc[j][m][v] = vfma(vload(x + m * ldx + k + v * kLanes), wv[v], acc[j][m][v]);
      }
    }
    if (full != w.group) {   // int8 only (int4 groups are whole blocks)
      for (int j = 0; j < NB; ++j) {
        const int8_t* q = static_cast<const int8_t*>(w.data) + (n0 + j) * w.k;
        const float scale = w.scales[(n0 + j) * groups + g];
        for (int64_t k = g * w.group + full; k < (g + 1) * w.group; ++k) {
          const float value = static_cast<float>(q[k]) * scale;
          for (int m = 0; m < MB; ++m) tail[j][m] += x[m * ldx + k] * value;
        }
      }
    }
  }
  for (int j = 0; j < NB; ++j)
    for (int m = 0; m < MB; ++m) {
      V sum = acc[j][m][0];
      for (int v = 1; v < kVecs; ++v) sum = sum + acc[j][m][v];
      out[m * ldo + n0 + j] = vsum(sum) + tail[j][m];
    }
}

template <int NB>
void rows_block(const Weights& w, int64_t n0, const float* x, int64_t ldx, int64_t rows,
                float* out, int64_t ldo) {
  switch (rows) {
    case 1: register_block<NB, 1>(w, n0, x, ldx, out, ldo); break;
    case 2: register_block<NB, 2>(w, n0, x, ldx, out, ldo); break;
    case 3: register_block<NB, 3>(w, n0, x, ldx, out, ldo); break;
    default: register_block<NB, 4>(w, n0, x, ldx, out, ldo); break;
  }
}

void matmul(const Weights& w, const float* x, int64_t m_rows, int64_t n_rows, float* out) {
  // A tile of W rows (a few tens of KB at most) is reused by every block of x rows; one
  // row of x is reused by a tile. Small tiles for decode, so both threads have work.
  const int64_t tile = m_rows <= kRowsM ? 16 : 64;
  const int64_t tiles = (n_rows + tile - 1) / tile;
  at::parallel_for(0, tiles, 1, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const int64_t n_begin = t * tile;
      const int64_t n_end = std::min(n_rows, n_begin + tile);
      for (int64_t m = 0; m < m_rows; m += kRowsM) {
        const int64_t rows = std::min<int64_t>(kRowsM, m_rows - m);
        const float* xm = x + m * w.k;
        float* om = out + m * n_rows;
        int64_t n = n_begin;
        for (; n + kRowsN <= n_end; n += kRowsN) rows_block<kRowsN>(w, n, xm, w.k, rows, om, n_rows);
        for (; n < n_end; ++n) rows_block<1>(w, n, xm, w.k, rows, om, n_rows);
      }
    }
  });
}

// dequant(W)[n_begin:n_end] into out [n_end - n_begin, K] float32: for a large batch the
// rows are dequantized a tile at a time and handed to a float GEMM (faster there than
// register_block, whose loads of x cost as much as its FMAs).
void dequantize_rows(const Weights& w, int64_t n_begin, int64_t n_end, float* out) {
  const int64_t groups = w.k / w.group;
  const int64_t full = w.group / kBlock * kBlock;
  at::parallel_for(n_begin, n_end, 16, [&](int64_t begin, int64_t end) {
    for (int64_t n = begin; n < end; ++n) {
      float* row = out + (n - n_begin) * w.k;
      for (int64_t g = 0; g < groups; ++g) {
        const float scale = w.scales[n * groups + g];
        const V vs = vset(scale), vm = vset(w.mins != nullptr ? w.mins[n * groups + g] : 0.f);
        for (int64_t k = g * w.group; k < g * w.group + full; k += kBlock) {
          V wv[kVecs];
          if (w.int4) {
            load_int4(static_cast<const uint8_t*>(w.data) + n * (w.k / 2) + k / 2, wv);
          } else {
            load_int8(static_cast<const int8_t*>(w.data) + n * w.k + k, wv);
          }
          for (int v = 0; v < kVecs; ++v) {
            const V value = vfma(wv[v], vs, vm);
            std::memcpy(row + k + v * kLanes, &value, sizeof value);
          }
        }
        const int8_t* q = static_cast<const int8_t*>(w.data) + n * w.k;
        for (int64_t k = g * w.group + full; k < (g + 1) * w.group; ++k)
          row[k] = static_cast<float>(q[k]) * scale;
      }
    }
  });
}

void quant_matmul_int8(Tensor out, const Tensor& x, const Tensor& q, const Tensor& scales,
                       int64_t group) {
  const Weights w = folio_quant::int8_weights(out, x, q, scales, group, 1);
  matmul(w, x.data_ptr<float>(), x.size(0), q.size(0), out.data_ptr<float>());
}

void quant_matmul_int4(Tensor out, const Tensor& x, const Tensor& packed, const Tensor& scales,
                       const Tensor& mins, int64_t group) {
  const Weights w = folio_quant::int4_weights(out, x, packed, scales, mins, group);
  matmul(w, x.data_ptr<float>(), x.size(0), packed.size(0), out.data_ptr<float>());
}

void check_out_rows(const Tensor& out, int64_t n_begin, int64_t n_end, int64_t n, int64_t k) {
  TORCH_CHECK(0 <= n_begin && n_begin <= n_end && n_end <= n, "rows ", n_begin, ":", n_end,
              " outside the weight's ", n);
  TORCH_CHECK(out.scalar_type() == at::kFloat && out.is_contiguous() &&
              out.numel() == (n_end - n_begin) * k, "out must be float32 [rows, K]");
}

void dequantize_int8(Tensor out, const Tensor& q, const Tensor& scales, int64_t group,
                     int64_t n_begin, int64_t n_end) {
  TORCH_CHECK(q.scalar_type() == at::kChar && q.dim() == 2 && q.is_contiguous(),
              "q must be a contiguous int8 [N, K] tensor");
  TORCH_CHECK(group > 0 && q.size(1) % group == 0 && scales.is_contiguous() &&
              scales.scalar_type() == at::kFloat && scales.numel() == q.size(0) * (q.size(1) / group),
              "scales must be float32 [N, K / group]");
  check_out_rows(out, n_begin, n_end, q.size(0), q.size(1));
  const Weights w{q.data_ptr(), scales.data_ptr<float>(), nullptr, q.size(1), group, false};
  dequantize_rows(w, n_begin, n_end, out.data_ptr<float>());
}

void dequantize_int4(Tensor out, const Tensor& packed, const Tensor& scales, const Tensor& mins,
                     int64_t group, int64_t n_begin, int64_t n_end) {
  TORCH_CHECK(packed.scalar_type() == at::kByte && packed.dim() == 2 && packed.is_contiguous(),
              "packed must be a contiguous uint8 [N, K / 2] tensor");
  const int64_t k = packed.size(1) * 2;
  TORCH_CHECK(group % kBlock == 0 && k % group == 0, "int4 group ", group, " must be a multiple of 32 dividing K");
  TORCH_CHECK(scales.scalar_type() == at::kFloat && mins.scalar_type() == at::kFloat &&
              scales.is_contiguous() && mins.is_contiguous() &&
              scales.numel() == packed.size(0) * (k / group) && mins.numel() == scales.numel(),
              "scales and mins must be float32 [N, K / group]");
  check_out_rows(out, n_begin, n_end, packed.size(0), k);
  const Weights w{packed.data_ptr(), scales.data_ptr<float>(), mins.data_ptr<float>(), k, group,
                  true};
  dequantize_rows(w, n_begin, n_end, out.data_ptr<float>());
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(folio, m) {
  m.def("quant_matmul_int8(Tensor(a!) out, Tensor x, Tensor q, Tensor scales, int group) -> ()");
  m.def("quant_matmul_int4(Tensor(a!) out, Tensor x, Tensor packed, Tensor scales, "
        "Tensor mins, int group) -> ()");
  m.def("dequantize_int8(Tensor(a!) out, Tensor q, Tensor scales, int group, int n_begin, "
        "int n_end) -> ()");
  m.def("dequantize_int4(Tensor(a!) out, Tensor packed, Tensor scales, Tensor mins, int group, "
        "int n_begin, int n_end) -> ()");
}

TORCH_LIBRARY_IMPL(folio, CPU, m) {
  m.impl("quant_matmul_int8", quant_matmul_int8);
  m.impl("quant_matmul_int4", quant_matmul_int4);
  m.impl("dequantize_int8", dequantize_int8);
  m.impl("dequantize_int4", dequantize_int4);
}
