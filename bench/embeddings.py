"""Embedding throughput: Folio's pooling runner vs sentence-transformers, same checkpoint,
same machine, same inputs, alternated round by round.

    python bench/embeddings.py                    # the full run: 256 inputs of 128 tokens
    python bench/embeddings.py --tiny --num-inputs 16 --input-tokens 32 --rounds 1   # smoke

Model: a Qwen3-architecture embedding checkpoint (`Qwen3Model`, last-token pooling,
normalised, declared in sentence-transformers' files as Qwen3-Embedding does) built from
SmolLM2-135M's weights at --source (a Llama: its layers become Qwen3's, with q/k norms of
ones, so it is Qwen3-Embedding's architecture and cost, not a trained embedder; no
Qwen3-architecture embedding model ships inside a PyPI package). `--tiny` builds a random
one instead. Both engines read the same directory in float32 and take the same texts
(tokenized by each, inside the timed region); Folio runs in process (`folio.LLM.embed`)
with prefix caching off, so repeated rounds compute everything again, as
sentence-transformers does. The vectors are compared (cosine) as a check.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "chat_template.jinja")


def sentence_transformers_files(out: Path, hidden_size: int) -> None:
    modules = [{"idx": 0, "name": "0", "path": "",
                "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling",
                "type": "sentence_transformers.models.Pooling"},
               {"idx": 2, "name": "2", "path": "2_Normalize",
                "type": "sentence_transformers.models.Normalize"}]
    (out / "modules.json").write_text(json.dumps(modules))
    (out / "1_Pooling").mkdir(exist_ok=True)
    (out / "1_Pooling" / "config.json").write_text(json.dumps(
        {"word_embedding_dimension": hidden_size, "pooling_mode_lasttoken": True}))
    (out / "2_Normalize").mkdir(exist_ok=True)
    (out / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 8192}))


def build_from_smollm2(source: Path, out: Path) -> Path:
    """SmolLM2's Llama weights as a Qwen3Model (q/k norms of ones) embedding checkpoint."""
    import torch
    from safetensors.torch import load_file, save_file
    from transformers import Qwen3Config

    if (out / "model.safetensors").exists():
        return out
    out.mkdir(parents=True, exist_ok=True)
    llama = json.loads((source / "config.json").read_text())
    config = Qwen3Config(
        vocab_size=llama["vocab_size"], hidden_size=llama["hidden_size"],
        intermediate_size=llama["intermediate_size"],
        num_hidden_layers=llama["num_hidden_layers"],
        num_attention_heads=llama["num_attention_heads"],
        num_key_value_heads=llama["num_key_value_heads"], head_dim=llama["head_dim"],
        max_position_embeddings=llama["max_position_embeddings"],
        rms_norm_eps=llama["rms_norm_eps"], rope_theta=llama["rope_parameters"]["rope_theta"],
        tie_word_embeddings=False, bos_token_id=llama.get("bos_token_id"),
        eos_token_id=llama.get("eos_token_id"), pad_token_id=llama.get("pad_token_id"))
    config.architectures = ["Qwen3Model"]
    config.save_pretrained(str(out))
    weights = {name.removeprefix("model."): tensor
               for name, tensor in load_file(str(source / "model.safetensors")).items()
               if not name.startswith("lm_head.")}
    for layer in range(config.num_hidden_layers):
        for norm in ("q_norm", "k_norm"):
            weights[f"layers.{layer}.self_attn.{norm}.weight"] = torch.ones(config.head_dim)
    save_file({k: v.contiguous() for k, v in weights.items()}, str(out / "model.safetensors"),
              metadata={"format": "pt"})
    for name in TOKENIZER_FILES:
        if (source / name).exists():
            shutil.copy(source / name, out / name)
    sentence_transformers_files(out, config.hidden_size)
    return out


def build_tiny(out: Path) -> Path:
    from folio.tiny_models import train_tokenizer
    from tests.pooling_models import make_embedding_model

    if (out / "model.safetensors").exists():
        return out
    tokenizer = out.parent / f"{out.name}-tokenizer"
    train_tokenizer(tokenizer, vocab_size=1024)
    make_embedding_model(tokenizer, out, max_position_embeddings=2048)
    sentence_transformers_files(out, 64)
    return out


def texts_of(model_dir: Path, count: int, tokens: int) -> list[str]:
    """`count` distinct texts of about `tokens` tokens each, cut from the Python docs."""
    from transformers import AutoTokenizer

    from folio.tiny_models import python_docs_text

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    ids = tokenizer.encode(python_docs_text(), add_special_tokens=False)
    if len(ids) < count * tokens:
        raise SystemExit(f"the corpus has {len(ids)} tokens, fewer than {count * tokens}")
    return [tokenizer.decode(ids[i * tokens:(i + 1) * tokens]) for i in range(count)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--source", type=Path, default=Path("/tmp/smollm2-f32"),
                        help="SmolLM2 checkpoint (Llama) the embedding model is built from")
    parser.add_argument("--model-dir", type=Path, default=None,
                        help="where the embedding checkpoint is built (kept for reruns)")
    parser.add_argument("--tiny", action="store_true", help="a tiny random Qwen3Model instead")
    parser.add_argument("--num-inputs", type=int, default=256)
    parser.add_argument("--input-tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--st-batch-size", type=int, default=32,
                        help="sentence-transformers' encode batch size (its default)")
    parser.add_argument("--max-num-batched-tokens", type=int, default=8192)
    parser.add_argument("--cpu-threads", type=int, default=None,
                        help="both engines' torch threads (default: torch's)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    import numpy as np
    import torch
    from sentence_transformers import SentenceTransformer

    from folio import LLM

    default = Path("/tmp/folio-bench-embed" + ("-tiny" if args.tiny else ""))
    model_dir = args.model_dir or default
    model_dir = build_tiny(model_dir) if args.tiny else build_from_smollm2(args.source,
                                                                           model_dir)
    if args.cpu_threads:
        torch.set_num_threads(args.cpu_threads)
    texts = texts_of(model_dir, args.num_inputs, args.input_tokens)
    blocks = -(-args.num_inputs * (args.input_tokens + 32) // 16)
    folio = LLM(model=str(model_dir), dtype="float32", device="cpu",
                enable_prefix_caching=False, num_kv_blocks=blocks,
                max_num_seqs=args.num_inputs, max_num_batched_tokens=args.max_num_batched_tokens,
                cpu_threads=args.cpu_threads)
    st = SentenceTransformer(str(model_dir), device="cpu")

    def run_folio():
        outputs = folio.embed(texts)
        return (np.array([o.outputs.embedding for o in outputs]),
                sum(len(o.prompt_token_ids) for o in outputs))

    def run_st():
        return st.encode(texts, batch_size=args.st_batch_size, convert_to_numpy=True), None

    runs = {"folio": run_folio, "sentence_transformers": run_st}
    run_folio(), run_st()   # warm up both (weights paged in, kernels picked)
    seconds: dict[str, list[float]] = {name: [] for name in runs}
    vectors: dict[str, np.ndarray] = {}
    tokens = 0
    for round_ in range(args.rounds):
        order = list(runs) if round_ % 2 == 0 else list(reversed(runs))   # alternated
        for name in order:
            start = time.perf_counter()
            vectors[name], counted = runs[name]()
            seconds[name].append(time.perf_counter() - start)
            tokens = counted or tokens
    a, b = vectors["folio"], vectors["sentence_transformers"]
    cosines = (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))
    median = {name: statistics.median(values) for name, values in seconds.items()}
    result = {
        "model": str(model_dir), "inputs": args.num_inputs, "input_tokens": tokens,
        "rounds": args.rounds, "threads": torch.get_num_threads(),
        "seconds": seconds,
        "inputs_per_s": {name: args.num_inputs / s for name, s in median.items()},
        "tokens_per_s": {name: tokens / s for name, s in median.items()},
        "folio_speedup": median["sentence_transformers"] / median["folio"],
        "min_cosine": float(cosines.min()),
    }
    if args.json:
        print(json.dumps(result))
    else:
        for name in runs:
            print(f"{name:>22}: {result['inputs_per_s'][name]:8.1f} inputs/s "
                  f"{result['tokens_per_s'][name]:10.0f} tokens/s (median of {args.rounds})")
        print(f"Folio / sentence-transformers: {result['folio_speedup']:.2f}x; "
              f"{tokens} tokens per round; min cosine {result['min_cosine']:.6f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
