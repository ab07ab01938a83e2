// The step's state slots, checked before a recurrent operator (gated_delta.cpp,
// short_conv.cpp) writes the pool in place: each inside the pool, none twice (two requests
// writing one slot would race and corrupt both states).
#pragma once

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

}  // namespace folio_cpu
