"""LoRA on CPU (docs/lora.md): the C++ segmented operator and the grouped low-rank matmuls
against the gathered batched form, and an engine's output tokens/s with adapters mixed in
against the base model.

    python -m bench.lora kernel                     # C++, grouped, bmm: one projection
    python -m bench.lora engine --model /tmp/smol/f32 --adapters 8 --rank 16 --requests 32

The machine is shared: run briefly, and write `uptime`'s load beside each figure.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch


def per_adapter(x, out, pairs, groups):
    """One gather, pair of GEMMs and scatter-add per adapter present."""
    for (a, b), rows in zip(pairs, groups):
        out.index_add_(0, rows, (x.index_select(0, rows) @ a.t()) @ b.t())
    return out


def folio_step(pairs, groups):
    """Folio's form (executor/lora/layers.py add_lora): the adapters' rows gathered once in
    adapter order, one pair of GEMMs per adapter on its slice, one scatter-add."""
    from folio.executor.lora.adapter import LoraWeights
    from folio.executor.lora.layers import LoraStep

    step = LoraStep()
    step.rows = torch.cat(groups)
    at = 0
    for index, (pair, rows) in enumerate(zip(pairs, groups)):
        step.groups.append((LoraWeights(f"a{index}", "", pair[0].shape[0], {"m": pair}),
                            slice(at, at + len(rows))))
        at += len(rows)
    return step


def gathered(x, out, a_stack, b_stack, ids):
    """Every token's A and B gathered, then one batched matmul pair (rank-padded)."""
    a_tok, b_tok = a_stack[ids], b_stack[ids]   # [T, r, in], [T, out, r]
    low = torch.bmm(a_tok, x.unsqueeze(2))      # [T, r, 1]
    return out + torch.bmm(b_tok, low).squeeze(2)


def cpp_segments(pairs, groups, max_rank):
    """The C++ operator's call (kernels/cpu/lora_segments.cpp) on slots holding `pairs`, or
    None when the CPU operators are not built."""
    from folio.executor.lora.adapter import LoraWeights
    from folio.executor.lora.cpu_pools import LoraCpuPools
    from folio.kernels import cpu_attention
    from folio.kernels.cpu_lora import lora_segments_cpu

    if not cpu_attention.load().ok:
        return None
    pools = LoraCpuPools(len(pairs), max_rank, pairs[0][0].dtype)
    for slot, pair in enumerate(pairs):
        pools.put(slot, LoraWeights(f"a{slot}", "", max_rank, {"m.0.m": pair}))
    pool = pools.modules["m.0.m"]
    rows = torch.cat(groups)
    table, at = [], 0
    for slot, g in enumerate(groups):
        table.append((slot, at, len(g)))
        at += len(g)
    table = torch.tensor(table, dtype=torch.int64)
    return lambda x, out: lora_segments_cpu(x, out, pool.a, pool.bt, pool.spans, rows, table)


def _time(fn, repeat: int) -> float:
    """The fastest of `repeat` calls, in ms: the least disturbed by a shared machine."""
    fn()
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best * 1e3


def kernel(args) -> None:
    from folio.executor.lora.layers import add_lora

    torch.manual_seed(0)
    torch.set_num_threads(args.threads)
    size_in, size_out, rank = args.hidden, args.out, args.rank
    weight = torch.randn(size_out, size_in)
    for tokens in (32, 256):
        for count in (1, 4, 8):
            x = torch.randn(tokens, size_in)
            a_stack = torch.randn(count, rank, size_in) * 0.01
            b_stack = torch.randn(count, size_out, rank) * 0.01
            ids = torch.arange(tokens) % count
            groups = [torch.nonzero(ids == i).flatten() for i in range(count)]
            pairs = [(a_stack[i], b_stack[i]) for i in range(count)]
            step = folio_step(pairs, groups)
            cpp = cpp_segments(pairs, groups, rank)
            base = _time(lambda: x @ weight.t(), args.repeat)
            g = _time(lambda: add_lora(x, x @ weight.t(), "m", step), args.repeat)
            p = _time(lambda: per_adapter(x, x @ weight.t(), pairs, groups), args.repeat)
            b = _time(lambda: gathered(x, x @ weight.t(), a_stack, b_stack, ids), args.repeat)
            c = None if cpp is None else _time(lambda: cpp(x, x @ weight.t()), args.repeat)
            want = gathered(x, x @ weight.t(), a_stack, b_stack, ids)
            for got in (add_lora(x, x @ weight.t(), "m", step),
                        per_adapter(x, x @ weight.t(), pairs, groups),
                        *([] if cpp is None else [cpp(x, x @ weight.t())])):
                assert torch.allclose(got, want, atol=1e-4)
            print(json.dumps({"tokens": tokens, "adapters": count, "rank": rank,
                              "base_ms": round(base, 3),
                              "cpp_ms": None if c is None else round(c, 3),
                              "grouped_ms": round(g, 3),
                              "per_adapter_ms": round(p, 3), "bmm_ms": round(b, 3)}))


def _random_adapter(out: Path, model_config: dict, rank: int, seed: int) -> Path:
    """A rank-`rank` PEFT-format adapter on every projection, random weights."""
    from safetensors.torch import save_file

    gen = torch.Generator().manual_seed(seed)
    hidden, inter = model_config["hidden_size"], model_config["intermediate_size"]
    heads, kv_heads = model_config["num_attention_heads"], model_config["num_key_value_heads"]
    head_dim = model_config.get("head_dim") or hidden // heads
    shapes = {"self_attn.q_proj": (hidden, heads * head_dim),
              "self_attn.k_proj": (hidden, kv_heads * head_dim),
              "self_attn.v_proj": (hidden, kv_heads * head_dim),
              "self_attn.o_proj": (heads * head_dim, hidden),
              "mlp.gate_proj": (hidden, inter), "mlp.up_proj": (hidden, inter),
              "mlp.down_proj": (inter, hidden)}
    tensors = {}
    for layer in range(model_config["num_hidden_layers"]):
        for module, (size_in, size_out) in shapes.items():
            key = f"base_model.model.model.layers.{layer}.{module}"
            tensors[f"{key}.lora_A.weight"] = torch.randn(rank, size_in, generator=gen) * 0.01
            tensors[f"{key}.lora_B.weight"] = torch.randn(size_out, rank, generator=gen) * 0.01
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out / "adapter_model.safetensors"))
    (out / "adapter_config.json").write_text(json.dumps(
        {"peft_type": "LORA", "r": rank, "lora_alpha": 2 * rank,
         "target_modules": [m.split(".")[1] for m in shapes]}))
    return out


def engine(args) -> None:
    from folio import LLM, SamplingParams

    model_config = json.loads((Path(args.model) / "config.json").read_text())
    root = Path(tempfile.mkdtemp(prefix="folio-lora-bench-"))
    names = [f"lora{i}" for i in range(args.adapters)]
    modules = [f"{n}={_random_adapter(root / n, model_config, args.rank, i)}"
               for i, n in enumerate(names)]
    prompts = [[(7 * i + j) % 1000 + 10 for j in range(args.prompt_len)]
               for i in range(args.requests)]
    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens, ignore_eos=True)

    def rate(llm, lora) -> float:
        # Warm: every adapter the run names once, so the first use of each (its slot
        # filled from host memory) is not timed as decoding.
        warm = 2 if lora is None else len(set(lora))
        llm.generate(prompts[:warm], params, lora=None if lora is None else lora[:warm])
        start = time.perf_counter()
        outputs = llm.generate(prompts, params, lora=lora)
        tokens = sum(len(o.outputs[0].token_ids) for o in outputs)
        return tokens / (time.perf_counter() - start)

    common = dict(dtype="float32", max_model_len=1024, enable_prefix_caching=False,
                  max_num_seqs=args.requests)
    plain = LLM(args.model, **common)
    off = rate(plain, None)
    del plain
    llm = LLM(args.model, enable_lora=True, lora_modules=modules, max_loras=args.adapters,
              max_lora_rank=args.rank, **common)
    base = rate(llm, None)
    mixed = rate(llm, [names[i % len(names)] for i in range(args.requests)])
    print(json.dumps({"model": args.model, "adapters": args.adapters, "rank": args.rank,
                      "requests": args.requests, "max_tokens": args.max_tokens,
                      "lora_off_tok_s": round(off, 1), "base_rows_tok_s": round(base, 1),
                      "mixed_tok_s": round(mixed, 1),
                      "mixed_vs_base": round(mixed / base, 3),
                      "base_rows_vs_off": round(base / off, 3)}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="what", required=True)
    k = sub.add_parser("kernel")
    k.add_argument("--hidden", type=int, default=576)   # SmolLM2-135M's q/k/v input
    k.add_argument("--out", type=int, default=960)      # its fused qkv output
    k.add_argument("--rank", type=int, default=16)
    k.add_argument("--repeat", type=int, default=50)
    k.add_argument("--threads", type=int, default=1)
    e = sub.add_parser("engine")
    e.add_argument("--model", required=True)
    e.add_argument("--adapters", type=int, default=8)
    e.add_argument("--rank", type=int, default=16)
    e.add_argument("--requests", type=int, default=32)
    e.add_argument("--prompt-len", type=int, default=32)
    e.add_argument("--max-tokens", type=int, default=32)
    args = parser.parse_args()
    kernel(args) if args.what == "kernel" else engine(args)


if __name__ == "__main__":
    main()
