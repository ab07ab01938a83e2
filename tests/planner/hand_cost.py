"""A cost model made by hand: what the planner tests (and the /plan page test) replay on."""

from __future__ import annotations

from folio.planner.cost import FEATURES, CostModel, KVLayout


def hand_cost(base_ms: float = 10.0, per_prefill_token: float = 0.0, num_kv_blocks: int = 64,
              block_size: int = 16, max_model_len: int = 512, prefix_caching: bool = True,
              max_num_batched_tokens: int = 512) -> CostModel:
    executor = dict.fromkeys(FEATURES, 0.0) | {"base": base_ms,
                                               "per_prefill_token": per_prefill_token}
    # float32 KV of 2 layers x 2 heads x 8 dims: 4 bytes x 8 x 2 x 2 x 2 = 256 bytes a token.
    kv = KVLayout(num_kv_blocks, block_size, max_model_len, "float32",
                  num_kv_blocks * block_size * 256,
                  {"float32": 256, "bfloat16": 128, "int8": 80}, 0)
    return CostModel(executor, {"base": 0.0, "per_row": 0.0}, 0.0, 0.0, kv,
                     {"max_num_seqs": 256, "max_num_batched_tokens": max_num_batched_tokens,
                      "enable_chunked_prefill": True, "enable_prefix_caching": prefix_caching,
                      "preemption_mode": "recompute"}, model="hand-made")
