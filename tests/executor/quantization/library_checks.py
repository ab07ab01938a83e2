"""What the tests of checkpoints made by the quantization libraries (AutoAWQ,
compressed-tensors) check alike: the tiny llama's prompts, Folio's fused layers and the
checkpoint's layers each holds, and Folio's answers against transformers running the
library's dequantized model."""

from __future__ import annotations

import torch

PROMPTS = [[5, 6, 7, 8, 9, 10, 11, 12], [300, 12, 999, 4, 77, 1]]
MAX_TOKENS = 4
# Folio's fused layers and the checkpoint's layers they hold, in order
FUSED = {"self_attn.qkv_proj": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
         "self_attn.o_proj": ("self_attn.o_proj",),
         "mlp.gate_up_proj": ("mlp.gate_proj", "mlp.up_proj"),
         "mlp.down_proj": ("mlp.down_proj",)}


def kept_layers(llm) -> dict:
    """The engine's layers kept quantized, by name."""
    from folio.executor.quantization.weight_only_linear import WeightOnlyLinear

    return {name: module for name, module in llm.engine.executor.model.named_modules()
            if isinstance(module, WeightOnlyLinear)}


def library_weight(params: dict, layer: int, parts: tuple[str, ...]) -> torch.Tensor:
    """The library's weights of a Folio fused layer's parts, stacked as Folio fuses them."""
    return torch.cat([params[f"model.layers.{layer}.{part}.weight"] for part in parts])


def assert_answers_like(llm, reference, label: str) -> None:
    """Folio's prompt logprobs (top 5, within 1e-3) and greedy tokens for PROMPTS equal
    `reference`'s (a transformers model)."""
    from folio.shared.sampling_params import SamplingParams

    outs = llm.generate(PROMPTS, SamplingParams(max_tokens=MAX_TOKENS, temperature=0,
                                                prompt_logprobs=5))
    with torch.inference_mode():
        for prompt, out in zip(PROMPTS, outs):
            ids = torch.tensor([prompt])
            want = torch.log_softmax(reference(ids).logits[0, :-1].float(), dim=-1)
            positions = out.prompt_logprobs[1:]
            assert len(positions) == want.shape[0]
            for position, row in zip(positions, want):
                for token, entry in position.items():
                    assert abs(entry.logprob - row[token].item()) < 1e-3, (label, token)
            greedy = reference.generate(ids, attention_mask=torch.ones_like(ids),
                                        max_new_tokens=MAX_TOKENS, do_sample=False)
            assert out.outputs[0].token_ids == greedy[0, len(prompt):].tolist(), label
