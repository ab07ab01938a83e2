"""Swap or recompute: the estimate behind preemption_mode="auto".

Recomputing a victim costs a prefill of every token it had computed:
    recompute_s = num_computed_tokens / prefill_tokens_per_s
Swapping costs copying its blocks out now and back in later:
    swap_s = 2 * (num_blocks * bytes_per_block + state_bytes) / swap_bytes_per_s
(state_bytes: a hybrid model's recurrent state, which travels with the blocks). The executor measures prefill_tokens_per_s (a matmul the size of one token budget, scaled
by the model's FLOPs per token) and swap_bytes_per_s (a device -> host copy) at start-up.
The cheaper one wins, provided the swap pool has room (a hybrid's: a host state slot too).
"""

from __future__ import annotations

from folio.shared.config import SchedulerConfig


def should_swap(config: SchedulerConfig, num_computed_tokens: int, num_blocks: int,
                free_swap_blocks: int, free_swap_state_slots: int = 0) -> bool:
    # A hybrid's recurrent state swaps with the blocks: it needs a host state slot.
    if (config.preemption_mode == "recompute" or num_blocks > free_swap_blocks
            or (config.num_state_slots and not free_swap_state_slots)):
        return False
    if config.preemption_mode == "swap":
        return True
    if config.prefill_tokens_per_s <= 0 or config.swap_bytes_per_s <= 0:
        return False   # nothing measured: recompute is always possible
    recompute_s = num_computed_tokens / config.prefill_tokens_per_s
    state_bytes = config.state_bytes if config.num_state_slots else 0
    swap_s = 2 * (num_blocks * config.bytes_per_block + state_bytes) / config.swap_bytes_per_s
    return swap_s < recompute_s
