"""Greedy reference outputs from Hugging Face transformers on the same checkpoint."""

from __future__ import annotations

import random

import torch


def hf_greedy(model_dir, prompts: list[list[int]], max_tokens: list[int],
              device: str = "cpu") -> list[list[int]]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).to(device)
    outputs = []
    with torch.inference_mode():
        for prompt, new_tokens in zip(prompts, max_tokens):
            ids = torch.tensor([prompt], device=device)
            generated = model.generate(ids, attention_mask=torch.ones_like(ids),
                                       max_new_tokens=new_tokens, do_sample=False)
            outputs.append(generated[0, len(prompt):].tolist())
    return outputs


def random_prompts(count: int, min_len: int, max_len: int, vocab: int, seed: int
                   ) -> tuple[list[list[int]], list[int]]:
    rng = random.Random(seed)
    lengths = [min_len, max_len] + [rng.randint(min_len, max_len) for _ in range(count - 2)]
    prompts = [[rng.randrange(1, vocab) for _ in range(n)] for n in lengths]
    max_tokens = [rng.randint(1, 40) for _ in range(count)]
    return prompts, max_tokens
