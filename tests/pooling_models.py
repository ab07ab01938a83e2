"""Tiny pooling checkpoints made with transformers, and transformers' own pooled vectors
and reranker scores as the oracle (tests of shared/pooling/, executor/pooling/ and
frontend/openai/pooling/).

- an embedding model: a random `Qwen3Model` (the decoder without its LM head, as
  Qwen3-Embedding ships), optionally with sentence-transformers' modules.json declaring its
  pooling (last token or mean) and normalisation;
- a decoder reranker: a random `Qwen3ForCausalLM` scored, as Qwen3-Reranker is, from its
  next-token logits of two tokens after shared/pooling/rerank_prompt.py's prompt.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja",
                   "special_tokens_map.json")
SIZES = dict(vocab_size=1024, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, intermediate_size=128, max_position_embeddings=512,
             head_dim=16, initializer_range=0.1, bos_token_id=None, eos_token_id=0,
             pad_token_id=0)


def _tokenizer(tokenizer_dir: Path, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for name in TOKENIZER_FILES:
        if (tokenizer_dir / name).exists():
            shutil.copy(tokenizer_dir / name, out / name)


def _perturb_norms(model) -> None:
    import torch

    with torch.no_grad():   # transformers starts norms at 1: a misplaced one would not show
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.add_(torch.randn_like(param) * 0.2)


def make_embedding_model(tokenizer_dir: Path, out: Path, pooling: str | None = "lasttoken",
                         normalize: bool = True, seed: int = 0, **config) -> Path:
    """A random Qwen3Model checkpoint; `pooling` ("lasttoken", "mean_tokens", "cls" or
    None: no sentence-transformers files) is declared in 1_Pooling/config.json."""
    import torch
    from transformers import Qwen3Config, Qwen3Model

    _tokenizer(tokenizer_dir, out)
    torch.manual_seed(seed)
    model = Qwen3Model(Qwen3Config(**SIZES | config))
    _perturb_norms(model)
    model.save_pretrained(str(out), safe_serialization=True)
    if pooling is not None:
        modules = [{"idx": 0, "name": "0", "path": "",
                    "type": "sentence_transformers.models.Transformer"},
                   {"idx": 1, "name": "1", "path": "1_Pooling",
                    "type": "sentence_transformers.models.Pooling"}]
        if normalize:
            modules.append({"idx": 2, "name": "2", "path": "2_Normalize",
                            "type": "sentence_transformers.models.Normalize"})
        (out / "modules.json").write_text(json.dumps(modules))
        (out / "1_Pooling").mkdir(exist_ok=True)
        (out / "1_Pooling" / "config.json").write_text(json.dumps(
            {"word_embedding_dimension": SIZES["hidden_size"],
             f"pooling_mode_{pooling}": True}))
    return out


def make_reranker(tokenizer_dir: Path, out: Path, seed: int = 1) -> Path:
    """A random Qwen3ForCausalLM checkpoint (a decoder reranker's shape)."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    _tokenizer(tokenizer_dir, out)
    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(Qwen3Config(**SIZES))
    _perturb_norms(model)
    model.save_pretrained(str(out), safe_serialization=True)
    return out


def hf_embeddings(model_dir: Path, prompts: list[list[int]], pooling: str,
                  normalize: bool = True):
    """transformers' pooled hidden states (float32), one prompt at a time (no padding)."""
    import torch
    from transformers import AutoModel

    model = AutoModel.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    vectors = []
    with torch.no_grad():
        for ids in prompts:
            hidden = model(torch.tensor([ids])).last_hidden_state[0]
            vector = hidden[-1] if pooling == "last" else hidden.mean(dim=0)
            if normalize:
                vector = torch.nn.functional.normalize(vector, dim=0)
            vectors.append(vector.numpy())
    return vectors


def hf_rerank_scores(model_dir: Path, prompts: list[list[int]], against: int, for_: int
                     ) -> list[float]:
    """Qwen3-Reranker's score: softmax over the (against, for) logits at the last position,
    the `for` probability."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    scores = []
    with torch.no_grad():
        for ids in prompts:
            logits = model(torch.tensor([ids])).logits[0, -1]
            scores.append(float(torch.softmax(logits[[against, for_]], dim=0)[1]))
    return scores


def cosine(a, b) -> float:
    import numpy as np

    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))
