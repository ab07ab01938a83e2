"""Decode speed by weight quantization and KV cache type, or the quantized kernels alone.

    python bench/quantized_decode.py --model-dir /tmp/smollm2-f32            # a real checkpoint
    python bench/quantized_decode.py --rounds 3 --quantizations none int8 int4
    python bench/quantized_decode.py --quantizations none --kv-cache-dtypes auto int8 \\
        --users 4 --prompt-len 2048 --output-len 32
    python bench/quantized_decode.py --kernels [--rows 1 8 64 512] [--repeat 3] [--cpu-threads 1]
    python bench/quantized_decode.py --model-pass [--rows 1 4 8] [--cpu-threads 2]

Each run loads the model in a fresh process (offline `folio.LLM`, tokenizer skipped), warms
up, then times two workloads of random token ids, greedy, EOS ignored: one request alone
(--prompt-len in, --output-len out) and --users requests added at once. Output tok/s counts
the generated tokens over the whole run, prompt processing included (as `vllm bench serve`
does). Runs alternate between the quantizations and KV cache types so a change in the
machine's load hits all; the load average is printed beside each run. Without --model-dir a
random ~135M-parameter Llama (SmolLM2-135M's shape) is built with folio/tiny_models.py.

--kernels: milliseconds per matmul of the quantized kernels, float activations
(kernels/cpu/quant_matmul.cpp) and int8 activations ("a8", kernels/cpu/quant_dot.cpp, up to 8
rows), against float32 oneDNN (PackedLinear), on SmolLM2-135M's shapes at several batch sizes
(--rows): which path is fastest where. Above 8 rows both int8 columns are the same float GEMM
path. --model-pass: one pass through every linear layer of SmolLM2-135M (30 x qkv, o,
gate_up, down, then lm_head; random weights, 134 MB as int8), which, unlike one layer timed
again and again, reads its weights from memory rather than cache, as a decode step does.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

SMOLLM2_SHAPE = dict(arch="llama", vocab_size=49152, hidden_size=576, num_layers=30,
                     num_heads=9, num_kv_heads=3, intermediate_size=1536,
                     max_position_embeddings=2048, tie_word_embeddings=True,
                     initializer_range=0.02)
# (N, K): SmolLM2-135M's o_proj, gate/up, down, k/v, lm_head
KERNEL_SHAPES = ((576, 576), (1536, 576), (576, 1536), (192, 576), (49152, 576))
# One decoder layer's fused linears of SmolLM2-135M (qkv, o, gate_up, down), 30 layers.
LAYER_SHAPES = ((960, 576), (576, 576), (3072, 576), (576, 1536))


# ---- decode through folio.LLM -----------------------------------------------------------------

def timed_generate(llm, prompts: list[list[int]], output_len: int) -> float:
    """Output tok/s of `prompts` added at once and run to the end."""
    from folio import SamplingParams

    engine = llm.engine
    for i, prompt in enumerate(prompts):
        engine.add_request(f"q-{time.monotonic_ns()}-{i}", prompt,
                           SamplingParams(temperature=0, max_tokens=output_len,
                                          ignore_eos=True))
    produced = 0
    start = time.perf_counter()
    while engine.has_unfinished_requests():
        produced += sum(len(out.new_token_ids) for out in engine.step())
    elapsed = time.perf_counter() - start
    assert produced == output_len * len(prompts)
    return produced / elapsed


def rss_mib() -> float:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def worker(args: argparse.Namespace) -> dict:
    import torch

    from folio import LLM, SamplingParams
    from folio.executor.quantization.weight_only_linear import WeightOnlyLinear

    quantization, kv_cache_dtype = args.worker
    llm = LLM(args.model_dir, skip_tokenizer_init=True, dtype="float32", device="cpu",
              quantization=quantization, kv_cache_dtype=kv_cache_dtype,
              num_kv_blocks=args.num_kv_blocks, cpu_threads=args.cpu_threads)
    model = llm.engine.executor.model
    vocab = llm.engine.executor.model_config.vocab_size
    rng = random.Random(args.seed)
    prompts = [[rng.randrange(1, vocab) for _ in range(args.prompt_len)]
               for _ in range(args.users)]
    llm.generate([prompts[0][:16]], SamplingParams(max_tokens=4))   # warm-up
    one = timed_generate(llm, prompts[:1], args.output_len)
    many = timed_generate(llm, prompts, args.output_len)
    return {"quantization": quantization, "kv_cache_dtype": kv_cache_dtype,
            "one_user_tok_s": one, f"{args.users}_users_tok_s": many,
            "quantized_layers": sum(isinstance(m, WeightOnlyLinear)
                                    for m in model.modules()),
            "rss_mib": rss_mib(),
            "threads": torch.get_num_threads()}


def decode_runs(args: argparse.Namespace) -> None:
    if args.model_dir is None:
        from folio.tiny_models import make_random_checkpoint

        path = Path("/tmp/folio-bench-smollm2-shape")
        if not (path / "model.safetensors").exists():
            path.mkdir(parents=True, exist_ok=True)
            make_random_checkpoint(path, **SMOLLM2_SHAPE)
        args.model_dir = str(path)
    command = [sys.executable, __file__, "--model-dir", args.model_dir, "--users",
               str(args.users), "--prompt-len", str(args.prompt_len), "--output-len",
               str(args.output_len), "--num-kv-blocks", str(args.num_kv_blocks), "--seed",
               str(args.seed), "--cpu-threads", str(args.cpu_threads)]
    pairs = [tuple(pair.split(":")) for pair in args.pairs] if args.pairs else [
        (q, kv) for q in args.quantizations for kv in args.kv_cache_dtypes]
    for round_ in range(args.rounds):
        for quantization, kv_cache_dtype in pairs:
            load = os.getloadavg()[0]
            out = subprocess.run(command + ["--worker", quantization, kv_cache_dtype],
                                 check=True, capture_output=True, text=True).stdout
            result = json.loads(out.strip().splitlines()[-1])
            result.update(round=round_, load_before=load, load_after=os.getloadavg()[0])
            print(json.dumps({k: round(v, 1) if isinstance(v, float) else v
                              for k, v in result.items()}), flush=True)


# ---- the kernels alone ------------------------------------------------------------------------

def mean_ms(fn, x, budget_s: float = 0.2) -> float:
    """Mean milliseconds per call over `budget_s` (3 calls at least), after one untimed."""
    fn(x)
    calls, start = 0, time.perf_counter()
    while time.perf_counter() - start < budget_s or calls < 3:
        fn(x)
        calls += 1
    return (time.perf_counter() - start) / calls * 1e3


def kernel_paths(linear) -> dict:
    from folio.executor.linear import PackedLinear
    from folio.kernels.cpu_quant import (quant_matmul_int4, quant_matmul_int8, quantize_int4,
                                         quantize_int8)

    w = linear.weight
    q8c, s8c = quantize_int8(w, w.shape[1])
    q8g, s8g = quantize_int8(w, 32)
    p4, s4, m4 = quantize_int4(w, 32)
    p4b, s4b, m4b = quantize_int4(w, 64)
    return {"float32 onednn": PackedLinear(linear),
            "int8 ch": lambda x: quant_matmul_int8(x, q8c, s8c),
            "int8 ch a8": lambda x: quant_matmul_int8(x, q8c, s8c, True),
            "int8 g32": lambda x: quant_matmul_int8(x, q8g, s8g),
            "int4 g32": lambda x: quant_matmul_int4(x, p4, s4, m4),
            "int4 g32 a8": lambda x: quant_matmul_int4(x, p4, s4, m4, True),
            "int4 g64": lambda x: quant_matmul_int4(x, p4b, s4b, m4b)}


def kernel_table(rows_list: list[int], repeat: int) -> None:
    import torch

    for n, k in KERNEL_SHAPES:
        layers = kernel_paths(torch.nn.Linear(k, n, bias=False))
        for rows in rows_list:
            if n > 10000 and rows > 64:
                continue   # lm_head runs on the sampled rows only
            x = torch.randn(rows, k)
            best = {name: min(mean_ms(fn, x) for _ in range(repeat))
                    for name, fn in layers.items()}
            cells = "  ".join(f"{name} {ms:7.3f}" for name, ms in best.items())
            print(f"{n:5d}x{k:<4d} M={rows:<3d} {cells}", flush=True)


def model_pass(rows_list: list[int], repeat: int) -> None:
    import torch

    from folio.kernels.cpu_quant import (quant_matmul_int4, quant_matmul_int8, quantize_int4,
                                         quantize_int8)

    torch.manual_seed(0)
    shapes = LAYER_SHAPES * 30
    int8 = [quantize_int8(torch.randn(n, k) * 0.05, k) for n, k in shapes]
    int4 = [quantize_int4(torch.randn(n, k) * 0.05, 32) for n, k in shapes]
    head = quantize_int8(torch.randn(49152, 576) * 0.05, 576)
    for rows in rows_list:
        x = {k: torch.randn(rows, k) for k in (576, 1536)}
        cells = []
        for bits, layers in ((8, int8), (4, int4)):
            for a8 in (False, True):
                def once(_=None) -> None:
                    for weight in layers:
                        k = weight[0].shape[1] * (1 if bits == 8 else 2)
                        (quant_matmul_int8 if bits == 8 else quant_matmul_int4)(x[k], *weight, a8)
                    quant_matmul_int8(x[576], *head, a8)
                best = min(mean_ms(once, None, 0.0) for _ in range(repeat))
                cells.append(f"int{bits}{' a8' if a8 else ''} {best:7.2f}")
        print(f"model pass M={rows:<2d} " + "  ".join(cells), flush=True)


def kernels(args: argparse.Namespace) -> None:
    import torch

    from folio.kernels import cpu_attention

    torch.set_num_threads(args.cpu_threads)
    status = cpu_attention.load()
    if not status.ok:
        raise SystemExit(f"the CPU operators are unavailable: {status.detail}")
    print(f"threads {torch.get_num_threads()}, load {os.getloadavg()[0]:.2f}")
    with torch.inference_mode():
        (model_pass if args.model_pass else kernel_table)(args.rows, args.repeat)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-dir", help="float checkpoint (default: a random one in "
                        "the SmolLM2-135M shape under /tmp)")
    parser.add_argument("--quantizations", nargs="+", default=["none", "int8", "int4"])
    parser.add_argument("--kv-cache-dtypes", nargs="+", default=["auto"])
    parser.add_argument("--pairs", nargs="+", metavar="QUANTIZATION:KV_CACHE_DTYPE",
                        help="run these combinations only, instead of every quantization "
                             "with every KV cache type")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--users", type=int, default=64)
    parser.add_argument("--prompt-len", type=int, default=256)
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--num-kv-blocks", type=int, default=2048)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cpu-threads", type=int, default=len(os.sched_getaffinity(0)),
                        help="fixed, so that no run's thread count follows a neighbour's "
                        "load (default: every usable core)")
    parser.add_argument("--worker", nargs=2, metavar=("QUANTIZATION", "KV_CACHE_DTYPE"),
                        help=argparse.SUPPRESS)
    kernel = parser.add_argument_group("the kernels alone")
    modes = kernel.add_mutually_exclusive_group()
    modes.add_argument("--kernels", action="store_true", help="ms per matmul, by shape")
    modes.add_argument("--model-pass", action="store_true",
                       help="ms per pass through all of SmolLM2-135M's linears")
    kernel.add_argument("--rows", type=int, nargs="+", default=[1, 8, 64, 512])
    kernel.add_argument("--repeat", type=int, default=3,
                        help="trials per cell; the best is kept")
    args = parser.parse_args()
    if args.worker is not None:
        print(json.dumps(worker(args)))
    elif args.kernels or args.model_pass:
        kernels(args)
    else:
        decode_runs(args)


if __name__ == "__main__":
    main()
