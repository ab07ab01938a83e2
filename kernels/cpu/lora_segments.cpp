// LoRA on CPU for a step whose rows use several adapters (executor/lora/cpu_pools.py,
// docs/lora.md): one call per projection, in place,
//     out[r] += B_s (A_s x[r])     for every row r of each group (slot s, its rows)
// with the adapters' pairs stacked per module in slots: a [slots, R, in] (A's rows) and
// bt [slots, R, out] (B transposed, the scale folded in), so a rank's output columns are
// contiguous. spans [slots, P, 4] lists, per slot, the (o0, o1, k0, k1) blocks of B that are
// not zero: a fused module's B is block-diagonal (q, k and v each read their own ranks), so
// the kernel reads only those blocks, and no rank past the adapter's own. A slot's unused
// span rows are (0, 0, 0, 0).
// Two passes, each parallel over groups x blocks of 8 rows (the second also over blocks of
// 256 output columns): t = A_s x for the ranks the spans read (float32, a scratch buffer),
// then out += t B_s^T, a register of columns at a time with the block's rows' sums held in
// registers across the ranks (each B register loaded once per row block). A tiny call runs
// on the calling thread alone.
// float32 or bfloat16 (one dtype for x, out, a and bt), summed in float32, rounded once.
#include <torch/library.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <c10/util/BFloat16.h>

#include "vec_math.h"

#include <algorithm>
#include <cstdint>
#include <vector>

namespace {

using at::Tensor;
using namespace folio_cpu;

constexpr int64_t kRowBlock = 8;
constexpr int64_t kColBlock = 256;
constexpr int64_t kSerialWork = int64_t{1} << 19;   // rows x rank x (in + out)

struct Block {
  int64_t slot, begin, end;   // positions in `rows`
};

inline float dot(const float* a, const float* b, int64_t n) {
  float acc = 0.f;
#pragma omp simd reduction(+ : acc)
  for (int64_t i = 0; i < n; ++i) acc += a[i] * b[i];
  return acc;
}

// a . b[j] for four rows b[j] = b + j * stride: four independent sums (one would wait on
// each multiply-add's latency), a read once.
inline void dot4(const float* a, const float* b, int64_t stride, int64_t n, float* to,
                 int64_t to_stride) {
  float s0 = 0.f, s1 = 0.f, s2 = 0.f, s3 = 0.f;
  const float *b0 = b, *b1 = b + stride, *b2 = b + 2 * stride, *b3 = b + 3 * stride;
#pragma omp simd reduction(+ : s0, s1, s2, s3)
  for (int64_t i = 0; i < n; ++i) {
    const float ai = a[i];
    s0 += ai * b0[i];
    s1 += ai * b1[i];
    s2 += ai * b2[i];
    s3 += ai * b3[i];
  }
  to[0] = s0, to[to_stride] = s1, to[2 * to_stride] = s2, to[3 * to_stride] = s3;
}

template <typename T>
inline void widen(float* to, const T* from, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) to[i] = load(from[i]);
}

template <typename T>
inline Vec load_row(const T* p) { return load_vec(p); }   // float32 or bfloat16, widened

template <typename T>
inline void store_row(T* p, const Vec& v) {
  if constexpr (std::is_same_v<T, float>) {
    std::memcpy(p, &v, sizeof v);
  } else {
    for (int l = 0; l < kLanes; ++l) p[l] = static_cast<T>(v[l]);   // round to nearest even
  }
}

// dst[m][lo:hi] += sum_{k0 <= k < k1} t[m * rank + k] * bt[k * size_out + lo:hi] for N rows:
// a register of columns at a time, the N rows' sums held in registers across the ranks, so
// each B register is loaded once for the N rows.
template <int N, typename T>
void add_span(T* const* dst, const float* t, int64_t rank, const T* bt, int64_t size_out,
              int64_t k0, int64_t k1, int64_t lo, int64_t hi) {
  int64_t o = lo;
  for (; o + kLanes <= hi; o += kLanes) {
    Vec acc[N];
    for (int m = 0; m < N; ++m) acc[m] = load_row(dst[m] + o);
    for (int64_t k = k0; k < k1; ++k) {
      const Vec bv = load_row(bt + k * size_out + o);
      for (int m = 0; m < N; ++m) acc[m] += t[m * rank + k] * bv;
    }
    for (int m = 0; m < N; ++m) store_row(dst[m] + o, acc[m]);
  }
  for (; o < hi; ++o) {
    for (int m = 0; m < N; ++m) {
      float sum = load(dst[m][o]);
      for (int64_t k = k0; k < k1; ++k) sum += t[m * rank + k] * load(bt[k * size_out + o]);
      dst[m][o] = static_cast<T>(sum);
    }
  }
}

template <typename T>
void add_span_rows(int64_t n, T* const* dst, const float* t, int64_t rank, const T* bt,
                   int64_t size_out, int64_t k0, int64_t k1, int64_t lo, int64_t hi) {
  static_assert(kRowBlock == 8, "one case per row count of a block");
  switch (n) {
    case 1: return add_span<1>(dst, t, rank, bt, size_out, k0, k1, lo, hi);
    case 2: return add_span<2>(dst, t, rank, bt, size_out, k0, k1, lo, hi);
    case 3: return add_span<3>(dst, t, rank, bt, size_out, k0, k1, lo, hi);
    case 4: return add_span<4>(dst, t, rank, bt, size_out, k0, k1, lo, hi);
    case 5: return add_span<5>(dst, t, rank, bt, size_out, k0, k1, lo, hi);
    case 6: return add_span<6>(dst, t, rank, bt, size_out, k0, k1, lo, hi);
    case 7: return add_span<7>(dst, t, rank, bt, size_out, k0, k1, lo, hi);
    default: return add_span<8>(dst, t, rank, bt, size_out, k0, k1, lo, hi);
  }
}

template <typename T>
void run(Tensor& out, const Tensor& x, const Tensor& a, const Tensor& bt, const int64_t* spans,
         int64_t num_spans, const int64_t* rows, const std::vector<Block>& blocks,
         int64_t num_rows) {
  const int64_t size_in = x.size(1), size_out = out.size(1), rank = a.size(1);
  const T* xp = x.data_ptr<T>();
  const T* ap = a.data_ptr<T>();
  const T* bp = bt.data_ptr<T>();
  T* op = out.data_ptr<T>();
  const int64_t xs = x.stride(0), os = out.stride(0);
  auto span = [&](int64_t slot, int64_t j) { return spans + (slot * num_spans + j) * 4; };
  auto ranks = [&](int64_t slot, int64_t& lo, int64_t& hi) {   // the ranks the spans read
    lo = rank, hi = 0;
    for (int64_t j = 0; j < num_spans; ++j) {
      const int64_t* s = span(slot, j);
      if (s[0] < s[1] && s[2] < s[3]) lo = std::min(lo, s[2]), hi = std::max(hi, s[3]);
    }
  };
  std::vector<float> t(num_rows * rank);
  const int64_t count = static_cast<int64_t>(blocks.size());
  // A tiny call (a few rows of one adapter) runs inline: a parallel region waits for its
  // slowest thread, which a loaded machine often deschedules. A 32-row decode call over 8
  // adapters (about 0.5-4 M here) runs parallel: its adapters' weights come from memory, and
  // two threads read them faster; on the loaded VM both forms took the same time.
  const bool inline_only = num_rows * rank * (size_in + size_out) < kSerialWork;
  auto grain = [&](int64_t items) { return inline_only ? std::max<int64_t>(items, 1) : 1; };
  // Pass 1: t[m, k] = A_s[k] . x[rows[m]].
  at::parallel_for(0, count, grain(count), [&](int64_t first, int64_t last) {
    std::vector<float> xb(kRowBlock * size_in), ak(size_in);
    for (int64_t i = first; i < last; ++i) {
      const Block& b = blocks[i];
      int64_t lo, hi;
      ranks(b.slot, lo, hi);
      for (int64_t m = b.begin; m < b.end; ++m)
        widen(xb.data() + (m - b.begin) * size_in, xp + rows[m] * xs, size_in);
      for (int64_t k = lo; k < hi; ++k) {
        const T* row = ap + (b.slot * rank + k) * size_in;
        const float* av;
        if constexpr (std::is_same_v<T, float>) {
          av = row;
        } else {
          widen(ak.data(), row, size_in);
          av = ak.data();
        }
        int64_t m = b.begin;
        for (; m + 4 <= b.end; m += 4)
          dot4(av, xb.data() + (m - b.begin) * size_in, size_in, size_in, &t[m * rank + k], rank);
        for (; m < b.end; ++m)
          t[m * rank + k] = dot(av, xb.data() + (m - b.begin) * size_in, size_in);
      }
    }
  });
  // Pass 2: out[rows[m], o] += sum_k t[m, k] bt_s[k, o], per block of output columns.
  const int64_t col_blocks = (size_out + kColBlock - 1) / kColBlock;
  at::parallel_for(0, count * col_blocks, grain(count * col_blocks), [&](int64_t first,
                                                                        int64_t last) {
    T* dst[kRowBlock];
    for (int64_t i = first; i < last; ++i) {
      const Block& b = blocks[i / col_blocks];
      const int64_t c0 = (i % col_blocks) * kColBlock;
      const int64_t c1 = std::min(size_out, c0 + kColBlock);
      const int64_t n = b.end - b.begin;
      for (int64_t m = 0; m < n; ++m) dst[m] = op + rows[b.begin + m] * os;
      for (int64_t j = 0; j < num_spans; ++j) {
        const int64_t* s = span(b.slot, j);
        const int64_t lo = std::max(c0, s[0]), hi = std::min(c1, s[1]);
        if (hi <= lo || s[2] >= s[3]) continue;
        add_span_rows(n, dst, t.data() + b.begin * rank, rank, bp + b.slot * rank * size_out,
                      size_out, s[2], s[3], lo, hi);
      }
    }
  });
}

void check_tensor(const Tensor& t, const Tensor& x, const char* name) {
  TORCH_CHECK(t.device().is_cpu(), name, " must be a CPU tensor");
  TORCH_CHECK(t.scalar_type() == x.scalar_type(), name, " has dtype ", t.scalar_type(),
              ", expected x's ", x.scalar_type());
}

void lora_segments(Tensor out, Tensor x, Tensor a, Tensor bt, Tensor spans, Tensor rows,
                   Tensor groups) {
  TORCH_CHECK(x.device().is_cpu() && x.dim() == 2 && x.stride(1) == 1,
              "x must be a CPU [tokens, in] tensor contiguous in its last dimension, got ",
              x.sizes());
  TORCH_CHECK(x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16,
              "x must be float32 or bfloat16, got ", x.scalar_type());
  const int64_t tokens = x.size(0), size_in = x.size(1);
  check_tensor(out, x, "out");
  TORCH_CHECK(out.dim() == 2 && out.size(0) == tokens && out.stride(1) == 1,
              "out must be [", tokens, ", out] contiguous in its last dimension, got ",
              out.sizes());
  const int64_t size_out = out.size(1);
  check_tensor(a, x, "a");
  TORCH_CHECK(a.dim() == 3 && a.size(2) == size_in && a.is_contiguous(),
              "a must be a contiguous [slots, rank, ", size_in, "] tensor, got ", a.sizes());
  const int64_t slots = a.size(0), rank = a.size(1);
  check_tensor(bt, x, "bt");
  TORCH_CHECK(bt.dim() == 3 && bt.size(0) == slots && bt.size(1) == rank &&
                  bt.size(2) == size_out && bt.is_contiguous(),
              "bt must be a contiguous [", slots, ", ", rank, ", ", size_out, "] tensor, got ",
              bt.sizes());
  TORCH_CHECK(spans.device().is_cpu() && spans.scalar_type() == at::kLong &&
                  spans.dim() == 3 && spans.size(0) == slots && spans.size(2) == 4 &&
                  spans.is_contiguous(),
              "spans must be a contiguous int64 [", slots, ", spans, 4] tensor, got ",
              spans.sizes());
  const int64_t num_spans = spans.size(1);
  const int64_t* sp = spans.data_ptr<int64_t>();
  for (int64_t i = 0; i < slots * num_spans; ++i) {
    const int64_t* s = sp + i * 4;
    TORCH_CHECK(0 <= s[0] && s[0] <= s[1] && s[1] <= size_out && 0 <= s[2] && s[2] <= s[3] &&
                    s[3] <= rank,
                "span ", i, " (", s[0], ", ", s[1], ", ", s[2], ", ", s[3],
                ") is outside [0, ", size_out, ") x [0, ", rank, ")");
  }
  TORCH_CHECK(rows.device().is_cpu() && rows.scalar_type() == at::kLong && rows.dim() == 1 &&
                  rows.is_contiguous(),
              "rows must be a contiguous int64 vector");
  const int64_t num_rows = rows.size(0);
  const int64_t* rp = rows.data_ptr<int64_t>();
  std::vector<bool> seen(tokens, false);
  for (int64_t m = 0; m < num_rows; ++m) {
    TORCH_CHECK(0 <= rp[m] && rp[m] < tokens, "rows[", m, "] = ", rp[m], " is not a row of x (",
                tokens, " rows)");
    TORCH_CHECK(!seen[rp[m]], "row ", rp[m], " is listed twice in rows");
    seen[rp[m]] = true;
  }
  TORCH_CHECK(groups.device().is_cpu() && groups.scalar_type() == at::kLong &&
                  groups.dim() == 2 && groups.size(1) == 3 && groups.is_contiguous(),
              "groups must be a contiguous int64 [groups, 3] tensor (slot, start, count)");
  const int64_t* gp = groups.data_ptr<int64_t>();
  std::vector<Block> blocks;
  std::vector<bool> taken(num_rows, false);   // two groups on one position would race
  for (int64_t g = 0; g < groups.size(0); ++g) {
    const int64_t slot = gp[g * 3], start = gp[g * 3 + 1], count = gp[g * 3 + 2];
    TORCH_CHECK(0 <= slot && slot < slots, "group ", g, "'s slot ", slot, " is not in [0, ",
                slots, ")");
    TORCH_CHECK(0 <= start && 0 <= count && start + count <= num_rows, "group ", g,
                "'s rows [", start, ", ", start + count, ") are not within rows (", num_rows, ")");
    for (int64_t m = start; m < start + count; ++m) {
      TORCH_CHECK(!taken[m], "group ", g, " overlaps another group at rows[", m, "]");
      taken[m] = true;
    }
    for (int64_t m = start; m < start + count; m += kRowBlock)
      blocks.push_back({slot, m, std::min(start + count, m + kRowBlock)});
  }
  if (blocks.empty() || size_out == 0) return;
  if (x.scalar_type() == at::kFloat) {
    run<float>(out, x, a, bt, sp, num_spans, rp, blocks, num_rows);
  } else {
    run<c10::BFloat16>(out, x, a, bt, sp, num_spans, rp, blocks, num_rows);
  }
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(folio, m) {
  m.def("lora_segments(Tensor(a!) out, Tensor x, Tensor a, Tensor bt, Tensor spans, "
        "Tensor rows, Tensor groups) -> ()");
}

TORCH_LIBRARY_IMPL(folio, CPU, m) { m.impl("lora_segments", &lora_segments); }
