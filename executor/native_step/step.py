"""The call a CausalLM makes for a small step instead of its layer loop."""

from __future__ import annotations

import torch

from folio.executor.models.decoder import CausalLM
from folio.executor.native_step.layers import build_decode_step
from folio.executor.ops import AttentionInputs


class NativeStep:
    """Runs every decoder layer of a step of up to `max_tokens` tokens in one C++ call;
    returns (hidden, residual) as the layer loop leaves them, bit for bit."""

    def __init__(self, model: CausalLM, max_tokens: int) -> None:
        self.max_tokens = max_tokens
        self._native = build_decode_step(model)

    def __call__(self, positions: torch.Tensor, hidden: torch.Tensor,
                 kv_caches: list[tuple[torch.Tensor, torch.Tensor]], inputs: AttentionInputs
                 ) -> tuple[torch.Tensor, torch.Tensor]:
        return self._native.run(positions, hidden, [k for k, _ in kv_caches],
                                [v for _, v in kv_caches], inputs.slot_mapping,
                                inputs.block_tables, inputs.seq_lens, inputs.query_start_loc)
