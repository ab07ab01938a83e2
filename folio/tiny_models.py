"""Small checkpoints and tokenizers made locally, for tests, benchmarks and the default model.

Nothing is downloaded: the tokenizer is a byte-level BPE trained on the documentation that
ships inside CPython (`pydoc_data`), and checkpoints are saved with transformers'
`save_pretrained` in safetensors, exactly as a real Hugging Face checkpoint directory.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")

# ChatML, the format Qwen and many small chat models use.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def python_docs_text() -> str:
    """About 450 kB of English prose and code that every CPython install carries."""
    from pydoc_data.topics import topics

    return "\n\n".join(topics[key] for key in sorted(topics))


def train_tokenizer(out_dir: str | Path, vocab_size: int = 1024,
                    text: str | None = None) -> None:
    """Train a byte-level BPE tokenizer and save it as a Hugging Face fast tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    text = python_docs_text() if text is None else text
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(SPECIAL_TOKENS),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    lines = text.splitlines(keepends=True)
    tokenizer.train_from_iterator(lines, trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token="<|endoftext|>",
                                   pad_token="<|endoftext|>",
                                   additional_special_tokens=["<|im_start|>", "<|im_end|>"])
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(str(out_dir))


# Each architecture's short name and its transformers class prefix (LlamaForCausalLM, ...);
# tests/executor/test_models_units.py checks these cover executor/models/architectures.py.
CLASS_PREFIXES = {"llama": "Llama", "mistral": "Mistral", "qwen2": "Qwen2", "qwen3": "Qwen3",
                  "qwen3_moe": "Qwen3Moe", "mixtral": "Mixtral", "phi3": "Phi3",
                  "gemma2": "Gemma2", "gemma3": "Gemma3", "smollm3": "SmolLM3",
                  "olmo3": "Olmo3", "gpt_oss": "GptOss", "gemma4": "Gemma4",
                  # Hybrids (recurrent state beside attention; executor/models/hybrid/).
                  "qwen3_5": "Qwen3_5", "lfm2": "Lfm2",
                  "qwen3_5_moe": "Qwen3_5Moe", "qwen3_next": "Qwen3Next", "lfm2_moe": "Lfm2Moe"}
ARCHITECTURES = tuple(CLASS_PREFIXES)
# Architectures newer than the first three: their norm weights are perturbed after init
# (transformers initialises them to a constant), so a norm loaded into the wrong place shows.
_PERTURBED = ("qwen3", "qwen3_moe", "mixtral", "phi3", "gemma2", "gemma3", "smollm3", "olmo3",
              "gpt_oss", "gemma4")
# Their configs default head_dim to a large constant (128, 256): derive it instead.
_OWN_HEAD_DIM = ("qwen3", "qwen3_moe", "gemma2", "gemma3", "gpt_oss", "qwen3_5_moe",
                 "qwen3_next", "gemma4")
# The hybrid MoE families default to hundreds of wide experts: a few narrow ones instead.
_SMALL_EXPERTS = ("qwen3_5_moe", "qwen3_next", "lfm2_moe")


def _classes(arch: str):
    import transformers as hf

    names = CLASS_PREFIXES
    if arch not in names:
        raise ValueError(f"arch must be one of {ARCHITECTURES}, got {arch!r}")
    text_only = ("gemma3", "gemma4", "qwen3_5", "qwen3_5_moe")   # multimodal families
    config = (f"{names[arch]}TextConfig" if arch in text_only else f"{names[arch]}Config")
    return getattr(hf, config), getattr(hf, f"{names[arch]}ForCausalLM")


def make_random_checkpoint(out_dir: str | Path, arch: str = "llama", vocab_size: int = 1024,
                           hidden_size: int = 64, num_layers: int = 2, num_heads: int = 4,
                           num_kv_heads: int = 2, intermediate_size: int = 128,
                           max_position_embeddings: int = 1024, tie_word_embeddings: bool = False,
                           initializer_range: float = 0.1, seed: int = 0,
                           dtype: str = "float32", **extra: Any) -> None:
    """Save a randomly initialised checkpoint of `arch` (one of ARCHITECTURES) in
    safetensors; `extra` goes to the transformers config (e.g. num_local_experts)."""
    import torch

    config_cls, model_cls = _classes(arch)
    if arch in _OWN_HEAD_DIM:
        extra.setdefault("head_dim", hidden_size // num_heads)
    if arch in _SMALL_EXPERTS:
        for key, value in (("num_experts", 8), ("num_experts_per_tok", 2),
                           ("moe_intermediate_size", max(intermediate_size // 4, 1)),
                           ("shared_expert_intermediate_size", max(intermediate_size // 2, 1))):
            extra.setdefault(key, value)
        if arch == "lfm2_moe":   # its config has no default layer pattern
            extra.pop("shared_expert_intermediate_size")
            extra.setdefault("layer_types", ["full_attention" if i % 2 else "conv"
                                             for i in range(num_layers)])
    if arch == "gemma4":   # its global layers' head, and per-layer inputs, small too
        extra.setdefault("global_head_dim", 2 * extra["head_dim"])
        extra.setdefault("hidden_size_per_layer_input", 8)
        extra.setdefault("vocab_size_per_layer_input", vocab_size)
    eos = 0  # "<|endoftext|>" is the first special token of train_tokenizer
    config = config_cls(vocab_size=vocab_size, hidden_size=hidden_size,
                        num_hidden_layers=num_layers, num_attention_heads=num_heads,
                        num_key_value_heads=num_kv_heads, intermediate_size=intermediate_size,
                        max_position_embeddings=max_position_embeddings,
                        tie_word_embeddings=tie_word_embeddings,
                        initializer_range=initializer_range, bos_token_id=None,
                        eos_token_id=eos, pad_token_id=eos, **extra)
    torch.manual_seed(seed)
    model = model_cls(config)
    if arch in _PERTURBED:
        with torch.no_grad():
            for name, param in [*model.named_parameters(), *model.named_buffers()]:
                if name.endswith(("norm.weight", "layer_scalar")):   # Gemma 4: a buffer
                    param.add_(torch.randn_like(param) * 0.2)
                elif name.endswith(("sinks", "bias")):   # gpt-oss: zeros after init
                    param.add_(torch.randn_like(param) * 0.5)
    model = model.to(getattr(torch, dtype))
    model.save_pretrained(str(out_dir), safe_serialization=True)


def make_tiny_model_dir(out_dir: str | Path, arch: str = "llama", vocab_size: int = 1024,
                        **checkpoint: Any) -> Path:
    """Tokenizer plus random checkpoint in one directory, ready for `folio.LLM(model=...)`."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    train_tokenizer(out, vocab_size=vocab_size)
    make_random_checkpoint(out, arch=arch, vocab_size=vocab_size, **checkpoint)
    return out

