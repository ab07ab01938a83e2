// Vector helpers shared by the CPU operators (paged_attention.cpp, fused_ops.cpp): one
// register of floats, loads from float32/bfloat16, and exp for x <= 0.
#pragma once

#include <c10/util/BFloat16.h>

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
inline Vec load_vec(const c10::BFloat16* p) {
  typedef uint16_t HalfVec __attribute__((vector_size(kLanes * 2)));
  typedef uint32_t WordVec __attribute__((vector_size(kLanes * 4)));
  HalfVec h;
  std::memcpy(&h, p, sizeof h);
  const WordVec w = __builtin_convertvector(h, WordVec) << 16;
  Vec v;
  std::memcpy(&v, &w, sizeof v);
  return v;
}

}  // namespace folio_cpu
