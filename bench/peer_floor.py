"""The matmul floor of an offline workload: its FLOPs, and the fastest matmul rate at its shapes.

FLOPs (per request of prompt length L and k output tokens, n = L + k - 1 forward positions,
since the last sampled token is never fed back):
  linear layers  2 * non-embedding params * n
  lm_head        2 * hidden * vocab * k          (logits only where a token is sampled)
  attention      layers * 4 * heads * head_dim * (1 + 2 + ... + n)   (QK^T and PV, causal)

Rate: each projection shape of the model (fused qkv, o, fused gate/up, down, lm_head) timed at
a decode-like batch (64 rows) and a prefill-like chunk (2048 rows), through MKL (`F.linear`)
and through oneDNN with a prepacked weight (`torch.ops.mkldnn`), the faster of the two per
shape, on `threads` threads. Prompt positions are costed at the prefill rate, the rest (decode
rows, lm_head) at the decode rate; attention is costed at the same rate as the linear layers,
so the floor is optimistic, as a floor should be.
"""

from __future__ import annotations

import time

DECODE_ROWS, PREFILL_ROWS = 64, 2048


def _dims(shape: dict) -> tuple[int, int, int, int, int, int, int]:
    hidden, heads = shape["hidden_size"], shape["num_heads"]
    head_dim = shape.get("head_dim", hidden // heads)
    return (hidden, heads, shape["num_kv_heads"], head_dim, shape["intermediate_size"],
            shape["vocab_size"], shape["num_layers"])


def non_embedding_params(shape: dict) -> int:
    hidden, heads, kv, head_dim, inter, _, layers = _dims(shape)
    per_layer = hidden * heads * head_dim * 2 + 2 * hidden * kv * head_dim + 3 * hidden * inter
    return layers * per_layer


def workload_flops(shape: dict, prompts: list[list[int]], outputs: list[int]) -> dict:
    """FLOPs split by kind and by phase (prompt positions vs decode positions)."""
    hidden, heads, _, head_dim, _, vocab, layers = _dims(shape)
    params = non_embedding_params(shape)
    att = layers * 4 * heads * head_dim
    prefill = decode = 0
    lin = attn = 0
    for prompt, k in zip(prompts, outputs):
        length, n = len(prompt), len(prompt) + k - 1
        attn_prompt = att * length * (length + 1) // 2
        attn_all = att * n * (n + 1) // 2
        lin += 2 * params * n
        attn += attn_all
        prefill += 2 * params * length + attn_prompt
        decode += 2 * params * (n - length) + attn_all - attn_prompt
    lm_head = 2 * hidden * vocab * sum(outputs)
    decode += lm_head
    return {"linear": lin, "lm_head": lm_head, "attention": attn, "total": lin + lm_head + attn,
            "prefill_phase": prefill, "decode_phase": decode,
            "non_embedding_params": params,
            "forward_positions": sum(len(p) + k - 1 for p, k in zip(prompts, outputs))}


def _best_seconds(fn, min_time: float = 0.15, repeats: int = 3) -> float:
    fn()
    fn()
    best = float("inf")
    for _ in range(repeats):
        count, start = 0, time.perf_counter()
        while True:
            fn()
            count += 1
            elapsed = time.perf_counter() - start
            if elapsed >= min_time:
                break
        best = min(best, elapsed / count)
    return best


def _projection_shapes(shape: dict) -> list[tuple[str, int, int, int]]:
    """(name, in, out, times per forward position) for one forward pass over all layers."""
    hidden, heads, kv, head_dim, inter, vocab, layers = _dims(shape)
    return [("qkv", hidden, (heads + 2 * kv) * head_dim, layers),
            ("o", heads * head_dim, hidden, layers),
            ("gate_up", hidden, 2 * inter, layers),
            ("down", inter, hidden, layers),
            ("lm_head", hidden, vocab, 1)]


def measure_matmul(shape: dict, threads: int) -> dict:
    """GFLOP/s at decode and prefill rows: the faster of MKL and oneDNN for each shape."""
    import torch
    import torch.nn.functional as F

    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    onednn = torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn,
                                                               "_linear_pointwise")
    result: dict = {"threads": threads, "onednn_available": bool(onednn), "shapes": {}}
    try:
        with torch.inference_mode():
            for label, rows in (("decode", DECODE_ROWS), ("prefill", PREFILL_ROWS)):
                flops = seconds = 0.0
                for name, k, n, times in _projection_shapes(shape):
                    if label == "prefill" and name == "lm_head":
                        continue   # a prompt chunk computes logits for its last row only
                    x, w = torch.randn(rows, k), torch.randn(n, k) * 0.02
                    mkl = _best_seconds(lambda: F.linear(x, w))
                    best, who = mkl, "mkl"
                    if onednn:
                        packed = torch.ops.mkldnn._reorder_linear_weight(w, rows)
                        dnn = _best_seconds(lambda: torch.ops.mkldnn._linear_pointwise(
                            x, packed, None, "none", [], ""))
                        if dnn < best:
                            best, who = dnn, "onednn"
                    one = 2 * rows * k * n
                    result["shapes"][f"{label}:{name}"] = {
                        "rows": rows, "in": k, "out": n, "gflops": one / best / 1e9,
                        "mkl_gflops": one / mkl / 1e9, "best": who}
                    flops += one * times
                    seconds += best * times
                result[f"{label}_gflops"] = flops / seconds / 1e9
    finally:
        torch.set_num_threads(previous)
    return result


def floor(flops: dict, decode_gflops: float, prefill_gflops: float, output_tokens: int
          ) -> dict:
    seconds = (flops["prefill_phase"] / (prefill_gflops * 1e9)
               + flops["decode_phase"] / (decode_gflops * 1e9))
    return {"seconds": seconds, "tok_per_s": output_tokens / seconds,
            "decode_gflops": decode_gflops, "prefill_gflops": prefill_gflops}
