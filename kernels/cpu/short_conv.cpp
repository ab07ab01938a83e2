// The causal depthwise convolution's decode step (executor/models/hybrid/short_conv.py),
// on the executor's window pool in place: request b's window is windows[slots[b]]
// ([channels, K-1], its channel's last K-1 inputs; zeros when fresh[b]), and for each
// channel c with its K taps w,
//     out[b, c] = bias[c] + sum_j w[j] window[c, j] + w[K-1] x[b, c]
// then the window shifts left by one and takes x[b, c] at its end. LFM2's short
// convolutions and Gated DeltaNet's q/k/v convolution both run it. float32 or bfloat16
// (one dtype for x, windows, weight, bias and out), summed in float32, rounded once.
#include <torch/library.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <c10/util/BFloat16.h>

#include "state_slots.h"
#include "vec_math.h"

#include <cstdint>
#include <optional>
#include <vector>

namespace {

using at::Tensor;
using namespace folio_cpu;

template <typename T>
void run(Tensor& out, const Tensor& x, Tensor& windows, const Tensor& weight,
         const T* bias, const int64_t* slots, const std::vector<bool>& fresh) {
  const int64_t batch = x.size(0), channels = x.size(1), width = windows.size(2);
  const int64_t taps = width + 1;
  const T* xp = x.data_ptr<T>();
  const T* wp = weight.data_ptr<T>();
  T* win = windows.data_ptr<T>();
  T* op = out.data_ptr<T>();
  const int64_t xs = x.stride(0), os = out.stride(0);
  // Rows of channels: a request's row is a few thousand multiply-adds, so several requests
  // share a thread (and one request runs on one).
  at::parallel_for(0, batch, std::max<int64_t>(1, 8192 / std::max<int64_t>(channels, 1)),
                   [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) {
      T* w0 = win + slots[b] * channels * width;
      const T* xb = xp + b * xs;
      T* ob = op + b * os;
      for (int64_t c = 0; c < channels; ++c) {
        T* window = w0 + c * width;
        const T* taps_c = wp + c * taps;
        const float input = load(xb[c]);
        float acc = bias != nullptr ? load(bias[c]) : 0.f;
        if (!fresh[b]) {   // a fresh window is zeros: its taps add nothing
          for (int64_t j = 0; j < width; ++j) acc += load(taps_c[j]) * load(window[j]);
          for (int64_t j = 0; j + 1 < width; ++j) window[j] = window[j + 1];
        } else {
          for (int64_t j = 0; j + 1 < width; ++j) window[j] = T(0.f);
        }
        acc += load(taps_c[width]) * input;
        if (width > 0) window[width - 1] = xb[c];
        ob[c] = static_cast<T>(acc);
      }
    }
  });
}

void check_same_dtype(const Tensor& t, const Tensor& x, const char* name) {
  TORCH_CHECK(t.device().is_cpu(), name, " must be a CPU tensor");
  TORCH_CHECK(t.scalar_type() == x.scalar_type(), name, " has dtype ", t.scalar_type(),
              ", expected x's ", x.scalar_type());
}

void causal_conv_step(Tensor out, Tensor x, Tensor windows, Tensor weight,
                      std::optional<Tensor> bias, Tensor slots, c10::List<bool> fresh) {
  TORCH_CHECK(x.device().is_cpu() && x.dim() == 2 && x.stride(1) == 1,
              "x must be a CPU [batch, channels] tensor contiguous in its last dimension, got ",
              x.sizes());
  TORCH_CHECK(x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16,
              "x must be float32 or bfloat16, got ", x.scalar_type());
  const int64_t batch = x.size(0), channels = x.size(1);
  check_same_dtype(out, x, "out");
  TORCH_CHECK(out.dim() == 2 && out.size(0) == batch && out.size(1) == channels &&
                  out.stride(1) == 1,
              "out must be [", batch, ", ", channels, "] contiguous in its last dimension");
  check_same_dtype(windows, x, "windows");
  TORCH_CHECK(windows.dim() == 3 && windows.size(1) == channels && windows.is_contiguous(),
              "windows must be a contiguous [slots, ", channels, ", kernel - 1] tensor, got ",
              windows.sizes());
  const int64_t width = windows.size(2);
  check_same_dtype(weight, x, "weight");
  TORCH_CHECK(weight.is_contiguous() && weight.numel() == channels * (width + 1) &&
                  weight.size(0) == channels && weight.size(-1) == width + 1,
              "weight must be a contiguous [", channels, ", 1, ", width + 1, "] tensor, got ",
              weight.sizes());
  const Tensor* b = bias.has_value() ? &*bias : nullptr;
  if (b != nullptr) {
    check_same_dtype(*b, x, "bias");
    TORCH_CHECK(b->dim() == 1 && b->size(0) == channels && b->is_contiguous(),
                "bias must be a contiguous [", channels, "] tensor");
  }
  const int64_t* sl = checked_step_slots(slots, fresh, batch, windows.size(0));
  std::vector<bool> is_fresh(fresh.begin(), fresh.end());
  if (batch == 0) return;
  if (x.scalar_type() == at::kFloat) {
    run<float>(out, x, windows, weight, b ? b->data_ptr<float>() : nullptr, sl, is_fresh);
  } else {
    run<c10::BFloat16>(out, x, windows, weight,
                       b ? b->data_ptr<c10::BFloat16>() : nullptr, sl, is_fresh);
  }
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(folio, m) {
  m.def("causal_conv_step(Tensor(a!) out, Tensor x, Tensor(b!) windows, Tensor weight, "
        "Tensor? bias, Tensor slots, bool[] fresh) -> ()");
}

TORCH_LIBRARY_IMPL(folio, CPU, m) { m.impl("causal_conv_step", &causal_conv_step); }
