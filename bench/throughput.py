"""Offline throughput: Folio vs transformers' batched `generate`, same workload, one run.

    python bench/throughput.py                 # both engines, prints tok/s and the ratio
    python bench/throughput.py --skip-hf       # Folio only
    python bench/throughput.py --skip-hf --dtype bfloat16 --cpu-threads 1
    python bench/throughput.py --step-times    # Folio's prefill tok/s and decode ms/step

Workload: 64 requests, prompt lengths 16-512 and output lengths 16-256 drawn with a fixed
seed, random token ids, greedy decoding, EOS ignored so both engines make the same number of
tokens. Model: a ~32M-parameter Llama-shaped checkpoint with random weights, built locally.
`--step-times` runs Folio alone, step by step, on the same model and requests (64 output
tokens each): the first steps are prompt chunks under the 2048-token budget, then decode
steps while all the requests run; it prints the prefill rate and the median decode step.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

MODEL_SHAPE = dict(arch="llama", vocab_size=8192, hidden_size=512, num_layers=8, num_heads=8,
                   num_kv_heads=4, intermediate_size=1408, max_position_embeddings=2048,
                   initializer_range=0.02)


def build_model(path: Path) -> Path:
    from folio.tiny_models import make_random_checkpoint

    if not (path / "model.safetensors").exists():
        path.mkdir(parents=True, exist_ok=True)
        make_random_checkpoint(path, **MODEL_SHAPE)
    return path


def workload(num_requests: int, seed: int) -> tuple[list[list[int]], list[int]]:
    rng = random.Random(seed)
    vocab = MODEL_SHAPE["vocab_size"]
    prompts = [[rng.randrange(1, vocab) for _ in range(rng.randint(16, 512))]
               for _ in range(num_requests)]
    outputs = [rng.randint(16, 256) for _ in range(num_requests)]
    return prompts, outputs


def add_workload_args(parser: argparse.ArgumentParser) -> None:
    """The workload's and Folio's engine flags (bench/peer.py races the same)."""
    parser.add_argument("--num-requests", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--max-num-batched-tokens", type=int, default=2048)
    parser.add_argument("--num-kv-blocks", type=int, default=None)
    parser.add_argument("--model-dir", type=Path, default=ROOT / ".folio-cache" / "bench-llama-32m")


def run_folio(model: Path, prompts, outputs, args) -> dict:
    from folio import LLM, SamplingParams

    llm = LLM(str(model), skip_tokenizer_init=True, dtype=getattr(args, "dtype", "float32"),
              block_size=args.block_size, max_num_batched_tokens=args.max_num_batched_tokens,
              num_kv_blocks=args.num_kv_blocks, cpu_threads=getattr(args, "cpu_threads", None))
    llm.generate([prompts[0][:16]], SamplingParams(max_tokens=2))   # warm-up
    engine, scheduler = llm.engine, llm.engine.scheduler
    for i, (prompt, count) in enumerate(zip(prompts, outputs)):
        engine.add_request(f"bench-{i}", prompt,
                           SamplingParams(temperature=0, max_tokens=count, ignore_eos=True))
    peak = {"blocks": 0, "utilization": 1.0, "running": 0}
    produced = 0
    tokens: dict[str, list[int]] = {f"bench-{i}": [] for i in range(len(prompts))}
    start = time.perf_counter()
    while engine.has_unfinished_requests():
        for output in engine.step():
            produced += len(output.new_token_ids)
            tokens[output.request_id] += output.new_token_ids
        peak["running"] = max(peak["running"], len(scheduler.running))
        if scheduler.pool.num_used > peak["blocks"]:   # measure only at a new peak
            peak["blocks"] = scheduler.pool.num_used
            peak["utilization"] = scheduler.kv_slot_utilization()
    elapsed = time.perf_counter() - start
    assert produced == sum(outputs), "Folio produced a different number of tokens"
    max_model_len = llm.engine.executor.max_model_len
    peak_tokens = peak["blocks"] * args.block_size
    return {"seconds": elapsed, "output_tokens": produced, "tok_per_s": produced / elapsed,
            "peak_running": peak["running"], "peak_kv_blocks": peak["blocks"],
            "kv_slot_utilization_at_peak": peak["utilization"],
            "max_model_len": max_model_len,
            # The same KV memory, reserved contiguously for max_model_len tokens a request:
            "contiguous_concurrency": peak_tokens // max_model_len,
            "stats": llm.stats(),
            # Per request, in order: bench/peer.py compares them with vLLM's.
            "token_ids": [tokens[f"bench-{i}"] for i in range(len(prompts))]}


def run_hf(model: Path, prompts, outputs) -> dict:
    import torch
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(str(model), dtype=torch.float32).eval()
    width = max(len(p) for p in prompts)
    pad = 0
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    new_tokens = max(outputs)
    with torch.inference_mode():
        hf.generate(ids[:1, -16:], attention_mask=mask[:1, -16:], max_new_tokens=2,
                    do_sample=False, pad_token_id=pad)
        start = time.perf_counter()
        hf.generate(ids, attention_mask=mask, max_new_tokens=new_tokens,
                    min_new_tokens=new_tokens, do_sample=False, pad_token_id=pad)
        elapsed = time.perf_counter() - start
    # One batch runs until its longest request is done; count only the tokens requested.
    useful = sum(outputs)
    return {"seconds": elapsed, "output_tokens": useful, "tok_per_s": useful / elapsed}


def step_times(model: Path, prompts, args) -> dict:
    """Executor time per step, prompt steps apart from full-batch decode steps."""
    from folio import LLM, SamplingParams

    llm = LLM(str(model), skip_tokenizer_init=True, dtype=args.dtype,
              cpu_threads=args.cpu_threads)
    engine = llm.engine
    for i, prompt in enumerate(prompts):
        engine.add_request(f"r{i}", prompt, SamplingParams(temperature=0, max_tokens=64,
                                                           ignore_eos=True))
    prefill_tokens, prefill_s, decode_ms = 0, 0.0, []
    for _ in range(40):
        plan = engine.scheduler.schedule()
        start = time.perf_counter()
        result = engine.executor.execute(plan)
        elapsed = time.perf_counter() - start
        engine.scheduler.update(plan, result)
        if plan.new_requests:
            prefill_tokens += plan.num_scheduled_tokens
            prefill_s += elapsed
        elif len(plan.running_handles) == len(prompts):
            decode_ms.append(elapsed * 1e3)
    median = statistics.median(decode_ms) if decode_ms else float("nan")
    return {"prefill_tokens": prefill_tokens, "prefill_tok_per_s": prefill_tokens / prefill_s,
            "decode_steps": len(decode_ms), "decode_ms_median": median,
            "decode_tok_per_s": len(prompts) * 1e3 / median}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_workload_args(parser)
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    parser.add_argument("--cpu-threads", type=int, default=None,
                        help="Folio's torch threads (default: one per usable core)")
    parser.add_argument("--skip-hf", action="store_true")
    parser.add_argument("--step-times", action="store_true",
                        help="Folio alone: prefill tok/s and decode ms/step at the full batch")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args()

    model = build_model(args.model_dir)
    prompts, outputs = workload(args.num_requests, args.seed)
    if args.step_times:
        times = step_times(model, prompts, args)
        print(json.dumps(times, indent=2) if args.json else
              f"prefill: {times['prefill_tokens']} tokens at {times['prefill_tok_per_s']:.0f} "
              f"tok/s (steps mixing prompt chunks and decodes)\n"
              f"decode, {len(prompts)} running: median {times['decode_ms_median']:.1f} ms/step "
              f"over {times['decode_steps']} steps = {times['decode_tok_per_s']:.0f} tok/s")
        return
    report = {"requests": len(prompts), "prompt_tokens": sum(map(len, prompts)),
              "output_tokens": sum(outputs), "folio": run_folio(model, prompts, outputs, args)}
    if not args.skip_hf:
        report["transformers"] = run_hf(model, prompts, outputs)
        report["ratio"] = report["folio"]["tok_per_s"] / report["transformers"]["tok_per_s"]
    if args.json:
        report["folio"].pop("token_ids")
        print(json.dumps(report, indent=2))
        return
    print(f"workload: {report['requests']} requests, {report['prompt_tokens']} prompt tokens, "
          f"{report['output_tokens']} output tokens")
    folio = report["folio"]
    print(f"folio:        {folio['tok_per_s']:8.1f} output tok/s ({folio['seconds']:.1f} s)")
    print(f"  peak: {folio['peak_running']} requests running, {folio['peak_kv_blocks']} KV blocks "
          f"in use, {100 * folio['kv_slot_utilization_at_peak']:.1f}% of their slots hold "
          f"tokens")
    print(f"  a contiguous reservation of max_model_len={folio['max_model_len']} per request "
          f"would fit {folio['contiguous_concurrency']} requests in that memory")
    if "transformers" in report:
        hf = report["transformers"]
        print(f"transformers: {hf['tok_per_s']:8.1f} output tok/s ({hf['seconds']:.1f} s)")
        print(f"ratio:        {report['ratio']:8.2f}x")


if __name__ == "__main__":
    main()
