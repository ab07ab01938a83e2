"""Decode speed with float32, int8 and int4 weights (`--quantization`), alternated, one process a run.

    python bench/quantized_decode.py --model-dir /tmp/smollm2-f32            # a real checkpoint
    python bench/quantized_decode.py --rounds 3 --quantizations none int8 int4

Each run loads the model in a fresh process (offline `folio.LLM`, tokenizer skipped), warms
up, then times two workloads of random token ids, greedy, EOS ignored: one request alone
(--prompt-len in, --output-len out) and --users requests added at once. Output tok/s counts
the generated tokens over the whole run, prompt processing included (as `vllm bench serve`
does). Runs alternate between the quantizations so a change in the machine's load hits both;
the load average is printed beside each run. Without --model-dir a random ~135M-parameter
Llama (SmolLM2-135M's shape) is built with folio/tiny_models.py.
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

    llm = LLM(args.model_dir, skip_tokenizer_init=True, dtype="float32", device="cpu",
              quantization=args.worker, num_kv_blocks=args.num_kv_blocks,
              cpu_threads=args.cpu_threads)
    model = llm.engine.executor.model
    vocab = llm.engine.executor.model_config.vocab_size
    rng = random.Random(args.seed)
    prompts = [[rng.randrange(1, vocab) for _ in range(args.prompt_len)]
               for _ in range(args.users)]
    llm.generate([prompts[0][:16]], SamplingParams(max_tokens=4))   # warm-up
    one = timed_generate(llm, prompts[:1], args.output_len)
    many = timed_generate(llm, prompts, args.output_len)
    return {"quantization": args.worker, "one_user_tok_s": one,
            f"{args.users}_users_tok_s": many,
            "quantized_layers": sum(isinstance(m, WeightOnlyLinear)
                                    for m in model.modules()),
            "rss_mib": rss_mib(),
            "threads": torch.get_num_threads()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-dir", help="float checkpoint (default: a random one in "
                        "the SmolLM2-135M shape under /tmp)")
    parser.add_argument("--quantizations", nargs="+", default=["none", "int8", "int4"])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--users", type=int, default=64)
    parser.add_argument("--prompt-len", type=int, default=256)
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--num-kv-blocks", type=int, default=2048)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cpu-threads", type=int, default=len(os.sched_getaffinity(0)),
                        help="fixed, so that no run's thread count follows a neighbour's "
                        "load (default: every usable core)")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker is not None:
        print(json.dumps(worker(args)))
        return
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
    for round_ in range(args.rounds):
        for quantization in args.quantizations:
            load = os.getloadavg()[0]
            out = subprocess.run(command + ["--worker", quantization], check=True,
                                 capture_output=True, text=True).stdout
            result = json.loads(out.strip().splitlines()[-1])
            result.update(round=round_, load_before=load, load_after=os.getloadavg()[0])
            print(json.dumps({k: round(v, 1) if isinstance(v, float) else v
                              for k, v in result.items()}), flush=True)


if __name__ == "__main__":
    main()
