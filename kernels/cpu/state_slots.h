// The step's state slots, checked before a recurrent operator (gated_delta.cpp,
// short_conv.cpp) writes the pool in place: each inside the pool, none twice (two requests
// writing one slot would race and corrupt both states).
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/List.h>
#include <c10/util/Exception.h>

#include <cstdint>
#include <vector>

namespace folio_cpu {

inline void check_slots(const int64_t* slots, int64_t batch, int64_t pool_slots) {
  std::vector<char> seen(static_cast<size_t>(pool_slots), 0);
  for (int64_t b = 0; b < batch; ++b) {
    TORCH_CHECK(slots[b] >= 0 && slots[b] < pool_slots, "slot ", slots[b],
                " outside the pool of ", pool_slots, " slots");
    TORCH_CHECK(!seen[slots[b]], "slot ", slots[b], " appears twice in one step");
    seen[slots[b]] = 1;
  }
}

// The step's `slots` (a contiguous int64 CPU tensor, one per request) and `fresh` flags,
// checked against the batch and the pool; returns the slots' data.
inline const int64_t* checked_step_slots(const at::Tensor& slots, const c10::List<bool>& fresh,
                                         int64_t batch, int64_t pool_slots) {
  TORCH_CHECK(slots.device().is_cpu() && slots.scalar_type() == at::kLong &&
                  slots.dim() == 1 && slots.size(0) == batch && slots.is_contiguous(),
              "slots must be a contiguous int64 CPU tensor of ", batch, " entries");
  TORCH_CHECK(static_cast<int64_t>(fresh.size()) == batch, "fresh must have ", batch,
              " entries, got ", fresh.size());
  const int64_t* data = slots.data_ptr<int64_t>();
  check_slots(data, batch, pool_slots);
  return data;
}

}  // namespace folio_cpu
