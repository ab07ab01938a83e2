"""LoRA adapters made with PEFT on the tiny test checkpoints, and their greedy reference
outputs from transformers + PEFT (docs/lora.md)."""

from __future__ import annotations

from pathlib import Path

import torch

ATTENTION = ["q_proj", "k_proj", "v_proj", "o_proj"]
ALL_LINEAR = ATTENTION + ["gate_proj", "up_proj", "down_proj"]
# The prompts every LoRA test compares (one spans several 16-token blocks, so prefix
# caching and preemption matter), with their answer lengths.
PROMPTS = [[5, 6, 7, 8, 9] * 9, [11, 12, 13] * 7, [100, 200, 300]]
MAX_TOKENS = [14, 10, 8]
# The adapters made for long_llama_dir: name -> (seed, rank, alpha, targets, rsLoRA):
# every projection, a subset of a fused module's slices with rsLoRA, attention only, and
# the MLP only.
ADAPTERS = {"all": (1, 8, 16, None, False),
            "qv-down": (2, 4, 8, ["q_proj", "v_proj", "down_proj"], True),
            "attn": (3, 16, 8, ATTENTION, False),
            "mlp": (4, 2, 4, ["gate_proj", "up_proj", "down_proj"], False)}


def make_adapter(model_dir: Path, out_dir: Path, seed: int, rank: int = 8,
                 alpha: float = 16, targets: list[str] | None = None,
                 use_rslora: bool = False) -> Path:
    """A PEFT adapter with random A and B (B non-zero, so it changes the output)."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    config = LoraConfig(r=rank, lora_alpha=alpha, target_modules=targets or ALL_LINEAR,
                        use_rslora=use_rslora, init_lora_weights=False)
    torch.manual_seed(seed)
    peft_model = get_peft_model(model, config)
    with torch.no_grad():   # larger than PEFT's init, so greedy picks differ from the base
        for name, param in peft_model.named_parameters():
            if "lora_B" in name or "lora_A" in name:
                param.normal_(0.0, 0.3)
    peft_model.save_pretrained(str(out_dir), safe_serialization=True)
    return out_dir


def hf_lora_greedy(model_dir: Path, adapter_dir: Path | None, prompts: list[list[int]],
                   max_tokens: list[int]) -> list[list[int]]:
    """transformers' greedy output with the adapter applied by PEFT (None: the base)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    if adapter_dir is not None:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, str(adapter_dir))
    outputs = []
    with torch.inference_mode():
        for prompt, count in zip(prompts, max_tokens):
            ids = torch.tensor([prompt])
            out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids),
                                 max_new_tokens=count, do_sample=False)
            outputs.append(out[0, len(prompt):].tolist())
    return outputs


def greedy_per_adapter(llm, names, prompts=PROMPTS, max_tokens=MAX_TOKENS) -> dict:
    """Every prompt with every adapter of `names` (None: the base), all in one generate:
    adapter -> the greedy tokens of each prompt."""
    from folio import SamplingParams

    jobs = [(name, i) for name in names for i in range(len(prompts))]
    outputs = llm.generate([prompts[i] for _, i in jobs],
                           [SamplingParams(temperature=0.0, max_tokens=max_tokens[i])
                            for _, i in jobs], lora=[name for name, _ in jobs])
    got: dict = {}
    for (name, _), output in zip(jobs, outputs):
        got.setdefault(name, []).append(output.outputs[0].token_ids)
    return got
