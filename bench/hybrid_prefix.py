"""Prefix caching on a hybrid model (recurrent state beside paged KV) against a
full-attention model, on the same multi-turn chat trace; and the two models' tokens per GiB
of cache at a long context.

    python bench/hybrid_prefix.py                                   # tiny random models
    python bench/hybrid_prefix.py --default-shapes --dtype bfloat16 # tokens/GiB, real widths
    python bench/hybrid_prefix.py --hybrid /models/qwen3.5 --full /models/qwen3 \
        --conversations 32 --turns 6 --checkpoint-blocks 1,2,4,8

Each conversation's turn t sends the whole conversation so far (every earlier user message
and answer) plus a new user message of --user-tokens random ids; the answers are greedy,
--answer-tokens long. All conversations' turn t go in one generate call, turn after turn, so
from the second turn on each prompt's prefix was seen once before. A hybrid's checkpoints
share max_num_seqs spare state slots (least recently used evicted first), so the hit ratio
depends on seats against conversations in flight: --max-num-seqs. Printed per model (and,
for the hybrid, per --checkpoint-blocks value): prompt tokens, prefix-hit tokens, the hit
ratio, the hybrid's hits as a fraction of the full-attention model's (target: >= 0.8 from
the second sighting of a prefix, docs/hybrid.md), and the checkpoints' memory
(state_checkpoints x state bytes). Tokens per GiB: one token's KV of the attention layers
plus one request's state spread over --context tokens (target: hybrid >= 3x full at 8k).

Without --hybrid/--full it makes tiny random checkpoints (Qwen3.5 and Qwen3 of the same
width) in a temporary directory: that only checks the script runs; the figures that count
come from real checkpoints on a quiet machine. Offline (folio.LLM), CPU, float32 unless
--dtype.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def tiny_models(directory: Path) -> tuple[Path, Path]:
    from folio.tiny_models import make_tiny_model_dir

    width = dict(hidden_size=64, num_heads=4, num_kv_heads=2, intermediate_size=128,
                 num_layers=4, max_position_embeddings=4096)
    hybrid = make_tiny_model_dir(
        directory / "qwen3_5", arch="qwen3_5", head_dim=16, linear_num_key_heads=2,
        linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=16,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                         "partial_rotary_factor": 0.25}, **width)
    full = make_tiny_model_dir(directory / "qwen3", arch="qwen3", **width)
    return hybrid, full


def conversation_trace(llm, args) -> dict:
    """Run the trace; the prefix-cache counters it moved and the engine's stats after."""
    from folio import SamplingParams

    rng = random.Random(args.seed)
    vocab = llm.model_config.vocab_size if hasattr(llm, "model_config") else 1000
    histories = [[] for _ in range(args.conversations)]
    params = SamplingParams(temperature=0.0, max_tokens=args.answer_tokens, ignore_eos=True)
    before = llm.stats()
    for _ in range(args.turns):
        prompts = [history + [rng.randrange(10, min(vocab, 1000))
                              for _ in range(args.user_tokens)] for history in histories]
        results = llm.generate(prompts, [params] * len(prompts))
        histories = [prompt + list(result.outputs[0].token_ids)
                     for prompt, result in zip(prompts, results)]
    after = llm.stats()
    return {"prompt_tokens": after["prefix_cache_queries"] - before["prefix_cache_queries"],
            "hit_tokens": after["prefix_cache_hits"] - before["prefix_cache_hits"],
            "stats": after}


def tokens_per_gib(model_dir: Path, context: int, dtype_bytes: int) -> float:
    from folio.executor.models.hf_config import read_model_config

    return _per_gib(read_model_config(model_dir), context, dtype_bytes)


def _per_gib(config, context: int, dtype_bytes: int) -> float:
    per_token = config.kv_block_bytes(1, lambda dim: dim * dtype_bytes)
    return 2**30 / (per_token + config.state_bytes(dtype_bytes) / context)


def default_shapes(context: int, dtype_bytes: int) -> list[dict]:
    """Tokens per GiB at transformers' Qwen3_5TextConfig defaults (a full-size Qwen3.5: 32
    layers of width 4096, every 4th full attention with 4 KV heads of 256) against Qwen3 of
    the very same widths with every layer full attention: the memory a real-size hybrid
    saves, from the configs alone (no weights)."""
    import transformers as hf

    from folio.executor.models.hf_config import parse_model_config

    hybrid = {**hf.Qwen3_5TextConfig().to_dict(), "architectures": ["Qwen3_5ForCausalLM"]}
    full = {key: value for key, value in hybrid.items() if key != "layer_types"}
    full.update(architectures=["Qwen3ForCausalLM"], model_type="qwen3",
                rope_parameters={"rope_type": "default", "rope_theta": 10_000_000.0})
    rows = [{"model": f"{name} (Qwen3.5 default widths)",
             "tokens_per_gib": round(_per_gib(parse_model_config(raw), context, dtype_bytes))}
            for name, raw in (("full", full), ("hybrid", hybrid))]
    rows[1]["vs_full"] = round(rows[1]["tokens_per_gib"] / rows[0]["tokens_per_gib"], 2)
    return rows


def run_model(model_dir: Path, args, **engine) -> dict:
    from folio import LLM

    llm = LLM(str(model_dir), dtype=args.dtype, device="cpu", num_kv_blocks=args.kv_blocks,
              max_num_seqs=args.max_num_seqs or 2 * args.conversations, **engine)
    return conversation_trace(llm, args)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hybrid", type=Path, help="hybrid checkpoint directory")
    parser.add_argument("--full", type=Path, help="full-attention checkpoint directory")
    parser.add_argument("--conversations", type=int, default=4)
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--user-tokens", type=int, default=40)
    parser.add_argument("--answer-tokens", type=int, default=16)
    parser.add_argument("--checkpoint-blocks", default="4",
                        help="hybrid_checkpoint_blocks values to compare, comma-separated")
    parser.add_argument("--kv-blocks", type=int, default=1024)
    parser.add_argument("--max-num-seqs", type=int, default=0,
                        help="seats (default: 2 x conversations); a hybrid keeps as many "
                             "state slots again for its prefix checkpoints")
    parser.add_argument("--context", type=int, default=8192, help="for tokens per GiB")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument("--default-shapes", action="store_true",
                        help="only tokens per GiB at a full-size Qwen3.5's widths against "
                             "Qwen3 of the same widths (transformers' config defaults)")
    args = parser.parse_args()
    if args.default_shapes:
        for row in default_shapes(args.context, 4 if args.dtype == "float32" else 2):
            print("  ".join(f"{key}={value}" for key, value in row.items()))
        return 0
    with tempfile.TemporaryDirectory() as scratch:
        hybrid, full = args.hybrid, args.full
        if hybrid is None or full is None:
            hybrid, full = tiny_models(Path(scratch))
        dtype_bytes = 4 if args.dtype == "float32" else 2
        baseline = run_model(full, args)
        rows = [{"model": "full", "dir": str(full), **_counts(baseline),
                 "tokens_per_gib": round(tokens_per_gib(full, args.context, dtype_bytes))}]
        for blocks in (int(b) for b in args.checkpoint_blocks.split(",")):
            outcome = run_model(hybrid, args, hybrid_checkpoint_blocks=blocks)
            stats = outcome["stats"]
            from folio.executor.models.hf_config import read_model_config
            state = read_model_config(hybrid).state_bytes(dtype_bytes)
            rows.append({
                "model": f"hybrid (checkpoint every {blocks} blocks)", "dir": str(hybrid),
                **_counts(outcome),
                "hits_vs_full": round(outcome["hit_tokens"] / max(baseline["hit_tokens"], 1),
                                      3),
                "checkpoint_mib": round(stats.get("state_checkpoints", 0) * state / 2**20, 2),
                "tokens_per_gib": round(tokens_per_gib(hybrid, args.context, dtype_bytes))})
    for row in rows:
        print("  ".join(f"{key}={value}" for key, value in row.items() if key != "dir"))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    return 0


def _counts(outcome: dict) -> dict:
    prompt, hits = outcome["prompt_tokens"], outcome["hit_tokens"]
    return {"prompt_tokens": prompt, "hit_tokens": hits,
            "hit_ratio": round(hits / prompt, 3) if prompt else 0.0}


if __name__ == "__main__":
    raise SystemExit(main())
