// Vector helpers shared by the CPU operators (paged_attention.cpp, fused_ops.cpp): one
// register of floats, loads from float32/bfloat16, and exp for x <= 0.
#pragma once

#include <c10/util/BFloat16.h>
#include <c10/util/Float8_e4m3fn.h>
#include <c10/util/Float8_e5m2.h>
#include <c10/util/Half.h>

#if defined(__AVX2__) || defined(__AVX512F__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>

namespace folio_cpu {

inline float load(float x) { return x; }
inline float load(c10::BFloat16 x) {
  uint32_t bits = static_cast<uint32_t>(x.x) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

// Quantized KV cache elements (kernels/kv_quant.py): int8 (its row's scale applied by the
// caller) and float8, whose bits are widened in registers (see load_vec below).
inline float load(int8_t x) { return static_cast<float>(x); }
inline float load(c10::Float8_e4m3fn x) { return static_cast<float>(x); }
inline float load(c10::Float8_e5m2 x) { return static_cast<float>(x); }

// One vector register of floats: 16 with AVX-512, 8 with AVX, else 4. (Wider-than-register
// generic vectors make GCC scalarize conversions and selects.)
#if defined(__AVX512F__)
#define FOLIO_LANES 16
#elif defined(__AVX__)
#define FOLIO_LANES 8
#else
#define FOLIO_LANES 4
#endif
constexpr int kLanes = FOLIO_LANES;
typedef float Vec __attribute__((vector_size(kLanes * 4)));
typedef int32_t IntVec __attribute__((vector_size(kLanes * 4)));
typedef float Vec8 __attribute__((vector_size(32)));
typedef float Vec4 __attribute__((vector_size(16)));

// exp for x <= 0 (Cephes polynomial, ~1 ulp), on a float or a Vec.
template <typename V>
inline V exp_nonpositive(V x) {
  V n;
  if constexpr (std::is_same_v<V, float>) {
    x = std::max(x, -87.0f);
  } else {
    x = x < -87.0f ? V{} - 87.0f : x;
  }
  n = (x * 1.44269504f + 12582912.0f) - 12582912.0f;   // round to nearest
  const V f = x - n * 0.693359375f + n * 2.12194440e-4f;
  V p = f * 1.9875691500e-4f + 1.3981999507e-3f;
  p = p * f + 8.3334519073e-3f;
  p = p * f + 4.1665795894e-2f;
  p = p * f + 1.6666665459e-1f;
  p = p * f + 5.0000001201e-1f;
  p = p * f * f + f + 1.0f;
  V scale;
  if constexpr (std::is_same_v<V, float>) {
    const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
    std::memcpy(&scale, &bits, sizeof scale);
  } else {
    const IntVec bits = (__builtin_convertvector(n, IntVec) + 127) << 23;
    std::memcpy(&scale, &bits, sizeof scale);
  }
  return p * scale;
}

inline Vec load_vec(const float* p) {
  Vec v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
// bfloat16 -> float: the bits shifted into a float's upper half. GCC 12 tuned for znver3
// splits the generic 16-lane widening into two halves and a merge (5 instructions for 2),
// so the x86 one is named where the build has it.
inline Vec load_vec(const c10::BFloat16* p) {
#if FOLIO_LANES == 16
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return reinterpret_cast<Vec>(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
#elif FOLIO_LANES == 8 && defined(__AVX2__)
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return reinterpret_cast<Vec>(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
#else
  typedef uint16_t HalfVec __attribute__((vector_size(kLanes * 2)));
  typedef uint32_t WordVec __attribute__((vector_size(kLanes * 4)));
  HalfVec h;
  std::memcpy(&h, p, sizeof h);
  const WordVec w = __builtin_convertvector(h, WordVec) << 16;
  Vec v;
  std::memcpy(&v, &w, sizeof v);
  return v;
#endif
}

typedef uint32_t WordVec __attribute__((vector_size(kLanes * 4)));

// kLanes bytes widened to 32-bit lanes, sign- or zero-extended. GCC 12 scalarizes
// __builtin_convertvector from a byte vector (a load took 2.5x float32's time), so the
// x86 widening instructions are named where the build has them.
template <bool kSigned>
inline IntVec widen_bytes(const void* p) {
#if FOLIO_LANES == 16
  const __m128i b = _mm_loadu_si128(static_cast<const __m128i*>(p));
  return reinterpret_cast<IntVec>(kSigned ? _mm512_cvtepi8_epi32(b) : _mm512_cvtepu8_epi32(b));
#elif FOLIO_LANES == 8 && defined(__AVX2__)
  const __m128i b = _mm_loadl_epi64(static_cast<const __m128i*>(p));
  return reinterpret_cast<IntVec>(kSigned ? _mm256_cvtepi8_epi32(b) : _mm256_cvtepu8_epi32(b));
#else
  IntVec w;
  for (int i = 0; i < kLanes; ++i)
    w[i] = kSigned ? static_cast<const int8_t*>(p)[i] : static_cast<const uint8_t*>(p)[i];
  return w;
#endif
}

inline Vec load_vec(const int8_t* p) { return __builtin_convertvector(widen_bytes<true>(p), Vec); }

// A float8 with kExp exponent bits (bias 2^(kExp-1) - 1) and 7 - kExp mantissa bits. A
// normal one's magnitude bits, shifted into a float's exponent and mantissa fields with the
// bias difference added, are its float; a subnormal (exponent 0) is its mantissa times
// 2^(1 - bias - mantissa bits), computed as such (rebiasing by a multiply would make float
// denormals, which cost a microcode assist per vector). Inf/NaN are never written.
template <int kExp>
inline Vec load_fp8_vec(const void* p) {
  constexpr int kMantissa = 7 - kExp;
  constexpr int kBias = (1 << (kExp - 1)) - 1;
  const IntVec w = widen_bytes<false>(p);
  const IntVec magnitude = w & 0x7F;
  const IntVec normal_bits = (magnitude << (23 - kMantissa)) + ((127 - kBias) << 23);
  Vec normal;
  std::memcpy(&normal, &normal_bits, sizeof normal);
  const float step = 1.0f / static_cast<float>(1 << (kBias - 1 + kMantissa));   // 2^(1-bias-m)
  const Vec subnormal = __builtin_convertvector(magnitude, Vec) * step;
  const Vec v = magnitude < (1 << kMantissa) ? subnormal : normal;
  IntVec bits;
  std::memcpy(&bits, &v, sizeof bits);
  bits |= (w & 0x80) << 24;
  Vec out;
  std::memcpy(&out, &bits, sizeof out);
  return out;
}
inline Vec load_vec(const c10::Float8_e4m3fn* p) { return load_fp8_vec<4>(p); }
inline Vec load_vec(const c10::Float8_e5m2* p) { return load_fp8_vec<5>(p); }

// The factor a cache row's values are multiplied by: the float16 after an int8 row's
// head_dim values, 1 for every other element type (the compiler drops the multiply).
template <typename C>
inline float row_scale(const C* row, int64_t head_dim) {
  if constexpr (std::is_same_v<C, int8_t>) {
    uint16_t bits;
    std::memcpy(&bits, row + head_dim, sizeof bits);
    return static_cast<float>(c10::Half(bits, c10::Half::from_bits()));
  } else {
    (void)row;
    (void)head_dim;
    return 1.0f;
  }
}
template <typename C>
constexpr bool kScaledRows = std::is_same_v<C, int8_t>;

}  // namespace folio_cpu
