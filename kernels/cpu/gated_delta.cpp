// The gated delta rule's decode step (Gated DeltaNet, executor/models/hybrid/gated_delta.py
// `recurrent`), on the executor's state pool in place: for each request b and value head h,
// with its state S = pool[slots[b], h] ([k_dim, v_dim] float32; zeros when fresh[b]),
//     S <- exp(g) S;   S <- S + k (beta (v - k^T S))^T;   out = q^T S
// q and k are already l2-normed (q scaled by k_dim^-0.5), float32; v float32 or bfloat16
// (the activations); g, beta float32; out float32. No state is gathered or scattered: each
// (request, head) reads its matrix where it lives and writes it back there.
//
// Two passes over S, vectorized along v_dim: the first reads k^T S (the decay is applied
// to the sum, exp(g) k^T S), the second rewrites each row as exp(g) S + k delta and
// accumulates q^T S from the new row. (request, head) pairs are split over torch's threads.
#include <torch/library.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <c10/util/BFloat16.h>

#include "delta_rule_args.h"
#include "state_slots.h"
#include "vec_math.h"

#include <cmath>
#include <cstdint>
#include <vector>

namespace {

using at::Tensor;
using namespace folio_cpu;

// The accumulators for one head's v_dim values live on the stack up to this width.
constexpr int64_t kMaxVDim = 1024;

inline Vec splat(float x) { return Vec{} + x; }

inline void store_vec(float* p, Vec v) { std::memcpy(p, &v, sizeof v); }

// One (request, head): S [k_dim, v_dim] in place; q, k [k_dim]; v [v_dim] (T); out [v_dim].
template <typename T>
void delta_head(float* S, const float* q, const float* k, const T* v, float g, float beta,
                bool fresh, float* out, int64_t k_dim, int64_t v_dim) {
  alignas(64) float delta[kMaxVDim];
  const int64_t full = v_dim - v_dim % kLanes;
  const float decay = std::exp(g);
  // delta = beta (v - exp(g) k^T S); a fresh state remembers nothing.
  for (int64_t j = 0; j < v_dim; ++j) delta[j] = 0.f;
  if (!fresh) {
    for (int64_t i = 0; i < k_dim; ++i) {
      const float* row = S + i * v_dim;
      const Vec ki = splat(k[i]);
      int64_t j = 0;
      for (; j < full; j += kLanes)
        store_vec(delta + j, load_vec(delta + j) + ki * load_vec(row + j));
      for (; j < v_dim; ++j) delta[j] += k[i] * row[j];
    }
  }
  for (int64_t j = 0; j < v_dim; ++j)
    delta[j] = (load(v[j]) - decay * delta[j]) * beta;
  // S <- exp(g) S + k delta^T, row by row; out = q^T S (the new S).
  for (int64_t j = 0; j < v_dim; ++j) out[j] = 0.f;
  const Vec decay_v = splat(fresh ? 0.f : decay);
  for (int64_t i = 0; i < k_dim; ++i) {
    float* row = S + i * v_dim;
    const Vec ki = splat(k[i]);
    const Vec qi = splat(q[i]);
    int64_t j = 0;
    if (fresh) {   // never read the slot's old contents (a stale NaN would survive * 0)
      for (; j < full; j += kLanes) {
        const Vec s = ki * load_vec(delta + j);
        store_vec(row + j, s);
        store_vec(out + j, load_vec(out + j) + qi * s);
      }
      for (; j < v_dim; ++j) {
        row[j] = k[i] * delta[j];
        out[j] += q[i] * row[j];
      }
      continue;
    }
    for (; j < full; j += kLanes) {
      const Vec s = decay_v * load_vec(row + j) + ki * load_vec(delta + j);
      store_vec(row + j, s);
      store_vec(out + j, load_vec(out + j) + qi * s);
    }
    for (; j < v_dim; ++j) {
      row[j] = decay * row[j] + k[i] * delta[j];
      out[j] += q[i] * row[j];
    }
  }
}

template <typename T>
void run(Tensor& out, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g,
         const Tensor& beta, Tensor& pool, const int64_t* slots,
         const std::vector<bool>& fresh) {
  const int64_t batch = q.size(0), heads = q.size(1), k_dim = q.size(2), v_dim = v.size(2);
  const float* qp = q.data_ptr<float>();
  const float* kp = k.data_ptr<float>();
  const T* vp = v.data_ptr<T>();
  const float* gp = g.data_ptr<float>();
  const float* bp = beta.data_ptr<float>();
  float* sp = pool.data_ptr<float>();
  float* op = out.data_ptr<float>();
  const int64_t matrix = k_dim * v_dim;
  // About 32k state elements per task: a tiny head is not worth a thread of its own.
  const int64_t grain = std::max<int64_t>(1, 32768 / std::max<int64_t>(matrix, 1));
  at::parallel_for(0, batch * heads, grain, [&](int64_t begin, int64_t end) {
    for (int64_t task = begin; task < end; ++task) {
      const int64_t b = task / heads, h = task % heads;
      delta_head<T>(sp + (slots[b] * heads + h) * matrix,
                    qp + b * q.stride(0) + h * q.stride(1),
                    kp + b * k.stride(0) + h * k.stride(1),
                    vp + b * v.stride(0) + h * v.stride(1),
                    gp[b * g.stride(0) + h * g.stride(1)],
                    bp[b * beta.stride(0) + h * beta.stride(1)], fresh[b],
                    op + b * out.stride(0) + h * out.stride(1), k_dim, v_dim);
    }
  });
}

void gated_delta_step(Tensor out, Tensor q, Tensor k, Tensor v, Tensor g, Tensor beta,
                      Tensor pool, Tensor slots, c10::List<bool> fresh) {
  TORCH_CHECK(q.dim() == 3, "q must be [batch, heads, k_dim], got ", q.sizes());
  const int64_t batch = q.size(0), heads = q.size(1), k_dim = q.size(2);
  TORCH_CHECK(v.dim() == 3, "v must be [batch, heads, v_dim], got ", v.sizes());
  const int64_t v_dim = v.size(2);
  folio_delta_rule::check_args(out, q, k, v, g, beta, pool, batch, heads, k_dim, v_dim);
  TORCH_CHECK(v_dim <= kMaxVDim, "v_dim ", v_dim, " is over the ", kMaxVDim, " supported");
  const int64_t* sl = checked_step_slots(slots, fresh, batch, pool.size(0));
  std::vector<bool> is_fresh(fresh.begin(), fresh.end());
  if (batch == 0) return;
  if (v.scalar_type() == at::kFloat) run<float>(out, q, k, v, g, beta, pool, sl, is_fresh);
  else run<c10::BFloat16>(out, q, k, v, g, beta, pool, sl, is_fresh);
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(folio, m) {
  m.def("gated_delta_step(Tensor(a!) out, Tensor q, Tensor k, Tensor v, Tensor g, "
        "Tensor beta, Tensor(b!) pool, Tensor slots, bool[] fresh) -> ()");
}

TORCH_LIBRARY_IMPL(folio, CPU, m) { m.impl("gated_delta_step", &gated_delta_step); }
