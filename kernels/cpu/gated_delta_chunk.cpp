// The gated delta rule over one request's prompt (L tokens), on its state in the executor's
// pool in place: the meaning of executor/models/hybrid/gated_delta.py `chunked` (and of L
// decode steps, kernels/cpu/gated_delta.cpp), per value head h with S = pool[slot, h]
// ([k_dim, v_dim] float32; zeros when fresh), for t = 0..L-1:
//     S <- exp(g_t) S;   S <- S + k_t (beta_t (v_t - k_t^T S))^T;   o_t = q_t^T S
// q, k [L, H, k_dim] float32 (prepared: l2-normed, q scaled); v [L, H, v_dim] float32 or
// bfloat16; g, beta [L, H] float32; out [L, H, v_dim] float32.
//
// A blocked recurrence, not the chunked (triangular solve) form: S's columns never mix
// (column j's update reads only column j and v_t[j]), so each task owns a stripe of
// columns of one head (128 x 32 floats, 16 KiB: it stays in L1 for all L tokens) and runs
// the tokens through it. One sweep over the stripe's rows per token rewrites S and
// accumulates both q_t^T S (this token's output) and k_{t+1}^T S (the next token's read),
// so S is loaded and stored once per token. That is 3 multiply-adds and a multiply per
// element of S per token, against the chunked form's ~5 multiply-adds (its extra products,
// the intra-chunk matrices and the triangular solve, are what make it parallel over tokens,
// which a CPU does not need: heads x stripes already fill its cores); measured in
// docs/hybrid.md. The sums run in the decode step's order, so a prompt leaves the state
// that decoding its tokens one at a time would.
#include <torch/library.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <c10/util/BFloat16.h>

#include "delta_rule_args.h"
#include "vec_math.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

namespace {

using at::Tensor;
using namespace folio_cpu;

// Vectors of columns per stripe: 2 x 16 floats with AVX-512 (a 128-row stripe is 16 KiB).
constexpr int kStripe = 2;

// A "vector" of one float (the columns past the last full vector) or of kLanes floats.
template <typename V> struct Lanes;
template <> struct Lanes<float> {
  static constexpr int n = 1;
  static float load(const float* p) { return *p; }
  static float load(const c10::BFloat16* p) { return folio_cpu::load(*p); }
  static void store(float* p, float x) { *p = x; }
};
template <> struct Lanes<Vec> {
  static constexpr int n = kLanes;
  static Vec load(const float* p) { return load_vec(p); }
  static Vec load(const c10::BFloat16* p) { return load_vec(p); }
  static void store(float* p, Vec x) { std::memcpy(p, &x, sizeof x); }
};

// x in every lane, one broadcast instruction (GCC builds a generic vector lane by lane from
// a loop, 16 masked broadcasts, and `V{} + x` adds a zero first, for -0's sake).
template <typename V>
inline V splat(float x) {
  if constexpr (std::is_same_v<V, float>) {
    return x;
  } else {
#if FOLIO_LANES == 16
    return reinterpret_cast<V>(_mm512_set1_ps(x));
#elif FOLIO_LANES == 8 && defined(__AVX__)
    return reinterpret_cast<V>(_mm256_set1_ps(x));
#else
    return V{} + x;
#endif
  }
}

// Where one request's tensors are, and their token and head strides (elements).
template <typename T>
struct Prompt {
  const float *q, *k;
  const T* v;
  const float *g, *beta;
  float* out;
  float* state;                         // the request's [H, k_dim, v_dim] in the pool
  int64_t q_t, q_h, k_t, k_h, v_t, v_h, g_t, g_h, b_t, b_h, o_t, o_h;
  int64_t length, k_dim, v_dim;
  bool fresh;
};

// One sweep over the stripe's rows for token t: S <- decay S + k_t delta^T, row by row,
// accumulating q_t^T S into out and (kNext) k_{t+1}^T S into next.
template <typename V, int W, bool kNext>
inline void sweep(float* S, int64_t row_stride, int64_t k_dim, const float* q, const float* k,
                  const float* k_next, float decay, const V* delta, V* out, V* next) {
  using L = Lanes<V>;
  const V decay_v = splat<V>(decay);
  for (int w = 0; w < W; ++w) out[w] = V{}, next[w] = V{};
  for (int64_t i = 0; i < k_dim; ++i) {
    float* row = S + i * row_stride;
    const V ki = splat<V>(k[i]), qi = splat<V>(q[i]);
    const V kn = kNext ? splat<V>(k_next[i]) : V{};
    for (int w = 0; w < W; ++w) {
      const V s = decay_v * L::load(row + w * L::n) + ki * delta[w];
      L::store(row + w * L::n, s);
      out[w] = out[w] + qi * s;
      if constexpr (kNext) next[w] = next[w] + kn * s;
    }
  }
}

// One head's columns [col, col + W lanes) through all the prompt's tokens, on a packed copy
// of the stripe: in the pool its rows are v_dim floats apart (512 bytes at 128), so the
// stripe's 2 cache lines a row would share 16 of L1's 64 sets and evict each other every
// token; packed, they spread over all of them. The copy is written back at the end.
template <typename T, typename V, int W>
void stripe(const Prompt<T>& p, int64_t h, int64_t col) {
  using L = Lanes<V>;
  constexpr int64_t width = W * L::n;
  float* pooled = p.state + h * p.k_dim * p.v_dim + col;
  const float* q = p.q + h * p.q_h;
  const float* k = p.k + h * p.k_h;
  const T* v = p.v + h * p.v_h + col;
  float* out = p.out + h * p.o_h + col;
  std::vector<float> packed(static_cast<size_t>(p.k_dim * width), 0.f);
  float* S = packed.data();
  V read[W], delta[W], acc[W], next[W];
  for (int w = 0; w < W; ++w) read[w] = V{};
  if (!p.fresh) {  // k_0^T S, in the decode step's order (a fresh slot is never read)
    for (int64_t i = 0; i < p.k_dim; ++i) {
      std::memcpy(S + i * width, pooled + i * p.v_dim, sizeof(float) * width);
      const V ki = splat<V>(k[i]);
      for (int w = 0; w < W; ++w) read[w] = read[w] + ki * L::load(S + i * width + w * L::n);
    }
  }
  for (int64_t t = 0; t < p.length; ++t) {
    const float decay = std::exp(p.g[t * p.g_t + h * p.g_h]);
    const float beta = p.beta[t * p.b_t + h * p.b_h];
    const V decay_v = splat<V>(decay), beta_v = splat<V>(beta);
    for (int w = 0; w < W; ++w)
      delta[w] = (L::load(v + t * p.v_t + w * L::n) - decay_v * read[w]) * beta_v;
    const float* qt = q + t * p.q_t;
    const float* kt = k + t * p.k_t;
    if (t + 1 < p.length)
      sweep<V, W, true>(S, width, p.k_dim, qt, kt, kt + p.k_t, decay, delta, acc, next);
    else
      sweep<V, W, false>(S, width, p.k_dim, qt, kt, nullptr, decay, delta, acc, next);
    for (int w = 0; w < W; ++w) {
      L::store(out + t * p.o_t + w * L::n, acc[w]);
      read[w] = next[w];
    }
  }
  for (int64_t i = 0; i < p.k_dim; ++i)
    std::memcpy(pooled + i * p.v_dim, S + i * width, sizeof(float) * width);
}

// A unit of work: one head's stripe of W vectors, one vector, or one column.
struct Task {
  int64_t head, col;
  int kind;   // 0: kStripe vectors, 1: one vector, 2: one column
};

std::vector<Task> tasks_for(int64_t heads, int64_t v_dim) {
  std::vector<Task> tasks;
  for (int64_t h = 0; h < heads; ++h) {
    int64_t col = 0;
    for (; col + kStripe * kLanes <= v_dim; col += kStripe * kLanes) tasks.push_back({h, col, 0});
    for (; col + kLanes <= v_dim; col += kLanes) tasks.push_back({h, col, 1});
    for (; col < v_dim; ++col) tasks.push_back({h, col, 2});
  }
  return tasks;
}

template <typename T>
void run(const Prompt<T>& p, int64_t heads) {
  const std::vector<Task> tasks = tasks_for(heads, p.v_dim);
  at::parallel_for(0, static_cast<int64_t>(tasks.size()), 1, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const Task& task = tasks[i];
      if (task.kind == 0) stripe<T, Vec, kStripe>(p, task.head, task.col);
      else if (task.kind == 1) stripe<T, Vec, 1>(p, task.head, task.col);
      else stripe<T, float, 1>(p, task.head, task.col);
    }
  });
}

void gated_delta_prompt(Tensor out, Tensor q, Tensor k, Tensor v, Tensor g, Tensor beta,
                        Tensor pool, int64_t slot, bool fresh) {
  TORCH_CHECK(q.dim() == 3, "q must be [length, heads, k_dim], got ", q.sizes());
  TORCH_CHECK(v.dim() == 3, "v must be [length, heads, v_dim], got ", v.sizes());
  const int64_t length = q.size(0), heads = q.size(1), k_dim = q.size(2), v_dim = v.size(2);
  folio_delta_rule::check_args(out, q, k, v, g, beta, pool, length, heads, k_dim, v_dim);
  TORCH_CHECK(slot >= 0 && slot < pool.size(0), "slot ", slot, " outside the pool of ",
              pool.size(0), " slots");
  if (length == 0) return;   // nothing read, nothing written (a fresh state stays unwritten)
  auto fill = [&](auto* vp) {
    using T = std::remove_const_t<std::remove_pointer_t<decltype(vp)>>;
    Prompt<T> p{q.data_ptr<float>(), k.data_ptr<float>(), vp, g.data_ptr<float>(),
                beta.data_ptr<float>(), out.data_ptr<float>(),
                pool.data_ptr<float>() + slot * heads * k_dim * v_dim,
                q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
                g.stride(0), g.stride(1), beta.stride(0), beta.stride(1), out.stride(0),
                out.stride(1), length, k_dim, v_dim, fresh};
    run<T>(p, heads);
  };
  if (v.scalar_type() == at::kFloat) fill(v.data_ptr<float>());
  else fill(v.data_ptr<c10::BFloat16>());
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(folio, m) {
  m.def("gated_delta_prompt(Tensor(a!) out, Tensor q, Tensor k, Tensor v, Tensor g, "
        "Tensor beta, Tensor(b!) pool, int slot, bool fresh) -> ()");
}

TORCH_LIBRARY_IMPL(folio, CPU, m) { m.impl("gated_delta_prompt", &gated_delta_prompt); }
