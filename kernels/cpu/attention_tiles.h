// The tile arithmetic of paged_attention.cpp: online softmax over a tile of scores, and the
// dots and weighted sums of query rows against a tile's key and value rows, one row or a
// few rows sharing each load. Every function keeps a row's order of operations whatever rows
// share the call, so a row's result never depends on how rows were grouped or split.
#pragma once

#include "vec_math.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <utility>

namespace folio_cpu {

constexpr int kKeyTile = 32;               // context positions per tile
constexpr int kTileVecs = kKeyTile / kLanes;
constexpr float kNoScore = -1e30f;         // running max before any key: finite, no inf - inf

// Folds a Vec's lanes with op (a generic lambda, on vectors and on floats), as a tree.
template <typename Op>
inline float fold(Vec v, Op op) {
#if FOLIO_LANES == 16
  const Vec8 a = op(__builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7),
                    __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15));
  const Vec4 b = op(__builtin_shufflevector(a, a, 0, 1, 2, 3),
                    __builtin_shufflevector(a, a, 4, 5, 6, 7));
#elif FOLIO_LANES == 8
  const Vec4 b = op(__builtin_shufflevector(v, v, 0, 1, 2, 3),
                    __builtin_shufflevector(v, v, 4, 5, 6, 7));
#else
  const Vec4 b = v;
#endif
  return op(op(b[0], b[1]), op(b[2], b[3]));
}
constexpr auto kAdd = [](auto x, auto y) { return x + y; };
constexpr auto kMax = [](auto x, auto y) { return x > y ? x : y; };
inline float hsum(Vec v) { return fold(v, kAdd); }

// scores[0:n] -> exp(scores - new max) in place, updating the running max; returns the sum.
inline float softmax_tile(float* scores, int64_t n, float& running_max) {
  if (n == kKeyTile) {
    Vec tile[kTileVecs];
    Vec top = load_vec(scores);
    for (int i = 0; i < kTileVecs; ++i) {
      tile[i] = load_vec(scores + i * kLanes);
      top = kMax(top, tile[i]);
    }
    running_max = std::max(running_max, fold(top, kMax));
    Vec sum = {};
    for (int i = 0; i < kTileVecs; ++i) {
      tile[i] = exp_nonpositive(tile[i] - running_max);
      sum += tile[i];
    }
    std::memcpy(scores, tile, sizeof tile);
    return hsum(sum);
  }
  // A partial tile (a decode's last, a window's first): exps a vector at a time (each lane
  // is the scalar exp's float), summed in key order as before.
  float tile_max = kNoScore;
  for (int64_t j = 0; j < n; ++j) tile_max = std::max(tile_max, scores[j]);
  const float new_max = std::max(running_max, tile_max);
  running_max = new_max;
  float sum = 0.0f;
  for (int64_t j0 = 0; j0 < n; j0 += kLanes) {
    const int64_t m = std::min<int64_t>(kLanes, n - j0);
    float x[kLanes] = {};
    for (int64_t i = 0; i < m; ++i) x[i] = scores[j0 + i] - new_max;
    const Vec e = exp_nonpositive(load_vec(x));
    for (int64_t i = 0; i < m; ++i) {
      scores[j0 + i] = e[i];
      sum += e[i];
    }
  }
  return sum;
}

// q . k for any head_dim (the compile-time ones go through group_scores).
template <typename T>
inline float dot(const float* q, const T* k, int64_t D) {
  float s = 0.0f;
#pragma omp simd reduction(+ : s)
  for (int64_t d = 0; d < D; ++d) s += q[d] * load(k[d]);
  return s;
}

// Lane sums of dots as a butterfly: pair_sums<d> adds lanes d apart, two vectors into one,
// so that no lane idles; d halves from kLanes / 2 to 1.
template <int d, int... i>
inline Vec pair_sums_of(Vec x, Vec y, std::integer_sequence<int, i...>) {
  // Output lane k: group k / d of 2d lanes of [x | y], lane k % d plus lane k % d + d.
  return __builtin_shufflevector(x, y, (i / d * 2 * d + i % d)...) +
         __builtin_shufflevector(x, y, (i / d * 2 * d + i % d + d)...);
}
template <int d>
inline Vec pair_sums(Vec x, Vec y) {
  return pair_sums_of<d>(x, y, std::make_integer_sequence<int, kLanes>{});
}

// s: vectors that each hold kLanes / kFrom dots' kFrom partial sums (kFrom = kLanes: raw
// dot lanes). Returns kLanes / d dots' d partial sums, in s's order.
template <int d, int kFrom = kLanes>
inline Vec reduce_dots(const Vec* s) {
  if constexpr (d == kFrom) {
    return s[0];
  } else {
    return pair_sums<d>(reduce_dots<2 * d, kFrom>(s),
                        reduce_dots<2 * d, kFrom>(s + kFrom / (2 * d)));
  }
}

// 4 dots' kLanes / 4 partial sums each (reduce_dots<kLanes / 4>) -> the 4 sums, the last
// steps in narrower registers.
inline Vec4 narrow_sums(Vec u) {
#if FOLIO_LANES == 4
  return u;
#else
#if FOLIO_LANES == 16
  const Vec8 pairs = __builtin_shufflevector(u, u, 0, 1, 4, 5, 8, 9, 12, 13) +
                     __builtin_shufflevector(u, u, 2, 3, 6, 7, 10, 11, 14, 15);
#else
  const Vec8 pairs = u;
#endif
  return __builtin_shufflevector(pairs, pairs, 0, 2, 4, 6) +
         __builtin_shufflevector(pairs, pairs, 1, 3, 5, 7);
#endif
}

// acc[D] += sum_j p[j] * values[j][D]
template <typename T, int kD>
inline void accumulate(float* acc, const float* p, const T* const* values, int64_t offset,
                       int64_t n, int64_t D) {
  if constexpr (kD > 0) {
    // Two accumulator sets (even and odd keys): an FMA's latency is not on the critical path.
    constexpr int kVecs = kD / kLanes;
    Vec even[kVecs], odd[kVecs];
#pragma GCC unroll 8
    for (int c = 0; c < kVecs; ++c) {
      even[c] = load_vec(acc + c * kLanes);
      odd[c] = Vec{};
    }
    int64_t j = 0;
    for (; j + 1 < n; j += 2) {
      const T* v0 = values[j] + offset;
      const T* v1 = values[j + 1] + offset;
#pragma GCC unroll 8
      for (int c = 0; c < kVecs; ++c) {
        even[c] += p[j] * load_vec(v0 + c * kLanes);
        odd[c] += p[j + 1] * load_vec(v1 + c * kLanes);
      }
    }
    if (j < n) {
      const T* v0 = values[j] + offset;
#pragma GCC unroll 8
      for (int c = 0; c < kVecs; ++c) even[c] += p[j] * load_vec(v0 + c * kLanes);
    }
#pragma GCC unroll 8
    for (int c = 0; c < kVecs; ++c) {
      const Vec sum = even[c] + odd[c];
      std::memcpy(acc + c * kLanes, &sum, sizeof sum);
    }
  } else {
    for (int64_t j = 0; j < n; ++j) {
      const T* v = values[j] + offset;
      const float pj = p[j];
#pragma omp simd
      for (int64_t d = 0; d < D; ++d) acc[d] += pj * load(v[d]);
    }
  }
}

// A token's GQA group shares each load of a tile's keys and values, kBlockRows rows at a
// time. Every row keeps the single-row functions' order of operations (the even/odd
// chains), so its result is bit-identical whichever rows it was blocked with.
constexpr int kBlockRows = 4;

// accumulate() for R rows at once (kD > 0): acc[b][D] += sum_j p[b][j] * values[j][D], a few
// vectors of D at a time so that the rows' even/odd accumulators stay in registers.
template <int R, typename T, int kD>
inline void accumulate_block(float* const* acc, const float* const* p, const T* const* values,
                             int64_t offset, int64_t n) {
  constexpr int kVecs = kD / kLanes;
  constexpr int kStep = R <= 3 && kVecs % 4 == 0 ? 4 : kVecs % 2 == 0 ? 2 : 1;
  for (int c0 = 0; c0 < kVecs; c0 += kStep) {
    Vec even[R][kStep], odd[R][kStep];
    for (int b = 0; b < R; ++b)
      for (int c = 0; c < kStep; ++c) {
        even[b][c] = load_vec(acc[b] + (c0 + c) * kLanes);
        odd[b][c] = Vec{};
      }
    int64_t j = 0;
    for (; j + 1 < n; j += 2) {
      const T* v0 = values[j] + offset + c0 * kLanes;
      const T* v1 = values[j + 1] + offset + c0 * kLanes;
      Vec x0[kStep], x1[kStep];
      for (int c = 0; c < kStep; ++c) {
        x0[c] = load_vec(v0 + c * kLanes);
        x1[c] = load_vec(v1 + c * kLanes);
      }
#pragma GCC unroll 4
      for (int b = 0; b < R; ++b)
        for (int c = 0; c < kStep; ++c) {
          even[b][c] += p[b][j] * x0[c];
          odd[b][c] += p[b][j + 1] * x1[c];
        }
    }
    if (j < n) {
      const T* v0 = values[j] + offset + c0 * kLanes;
      for (int b = 0; b < R; ++b)
        for (int c = 0; c < kStep; ++c) even[b][c] += p[b][j] * load_vec(v0 + c * kLanes);
    }
    for (int b = 0; b < R; ++b)
      for (int c = 0; c < kStep; ++c) {
        const Vec sum = even[b][c] + odd[b][c];
        std::memcpy(acc[b] + (c0 + c) * kLanes, &sum, sizeof sum);
      }
  }
}

// Scores of R rows that see the same keys (one token's GQA group, kD > 0) against keys
// [lo, hi): each key row is loaded, and widened, once for all R; kLanes keys' sums fill one
// vector. A row's sums take the same steps whatever R is and whichever rows share it (4 keys
// at a time from lo, the last few alone), so splitting a group changes no bits.
template <int R, typename C, int kD>
inline void group_scores(const float* const* qs, const C* const* keys, int64_t head_offset,
                         int64_t lo, int64_t hi, float* const* scores) {
  constexpr int kVecs = kD / kLanes;
  auto lanes = [&](const C* k, Vec* s) {   // s[r]: q_r . k's lanes, summed over D's vectors
    Vec kv[kVecs];
#pragma GCC unroll 8
    for (int c = 0; c < kVecs; ++c) kv[c] = load_vec(k + c * kLanes);
    for (int r = 0; r < R; ++r) {
      Vec x = load_vec(qs[r]) * kv[0];
#pragma GCC unroll 8
      for (int c = 1; c < kVecs; ++c) x += load_vec(qs[r] + c * kLanes) * kv[c];
      s[r] = x;
    }
  };
  auto four_keys = [&](int64_t j, Vec* units) {   // units[r]: reduce_dots<kLanes / 4>
    Vec s[4][R];
    for (int i = 0; i < 4; ++i) lanes(keys[j + i] + head_offset, s[i]);
    for (int r = 0; r < R; ++r) {
      const Vec dots[4] = {s[0][r], s[1][r], s[2][r], s[3][r]};
      units[r] = reduce_dots<kLanes / 4>(dots);
    }
  };
  int64_t j = lo;
  for (; j + kLanes <= hi; j += kLanes) {
    Vec units[kLanes / 4][R];
    for (int u = 0; u < kLanes / 4; ++u) four_keys(j + 4 * u, units[u]);
    for (int r = 0; r < R; ++r) {
      Vec row_units[kLanes / 4];
      for (int u = 0; u < kLanes / 4; ++u) row_units[u] = units[u][r];
      const Vec sums = reduce_dots<1, kLanes / 4>(row_units);
      std::memcpy(scores[r] + j, &sums, sizeof sums);
    }
  }
  for (; j + 4 <= hi; j += 4) {
    Vec units[R];
    four_keys(j, units);
    for (int r = 0; r < R; ++r) {
      const Vec4 four = narrow_sums(units[r]);
      std::memcpy(scores[r] + j, &four, sizeof four);
    }
  }
  for (; j < hi; ++j) {
    Vec s[R];
    lanes(keys[j] + head_offset, s);
    for (int r = 0; r < R; ++r) scores[r][j] = hsum(s[r]);
  }
}

}  // namespace folio_cpu
