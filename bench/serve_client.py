"""The serving benchmark's client: a fixed workload sent to any OpenAI-compatible server
(`/v1/completions`, streamed) and its latency report. `bench/serve.py run` is its command;
bench/serve_race.py, bench/serve_variants.py and bench/governor_neighbour.py drive their
servers with it.

Workload (fixed seed): `--num-prompts` prompts of `--input-len` random token ids (sent as
token ids, or as text decoded from them with `--prompt-format text`), each asking for exactly
`--output-len` tokens (`ignore_eos`, a vLLM extension Folio accepts too), greedy. Requests
start at a Poisson `--request-rate` (default: all at once) with at most `--max-concurrency`
in flight. Reports request and output throughput and TTFT, TPOT, ITL and end-to-end latency
(mean, p50, p90, p99, ms) as JSON. Loopback servers only; every request has a timeout and the
whole run a deadline. Servers with prefix caching remember a run's prompts: against a live
server, give each run its own `--seed` (`race` does).
"""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import json
import os
import random
import socket
import time
from pathlib import Path
from urllib.parse import urlparse

MAX_PROMPTS = 10_000


def check_loopback(base_url: str) -> None:
    host = urlparse(base_url).hostname or ""
    addresses = {info[4][0] for info in socket.getaddrinfo(host, None)}
    if not addresses or not all(ipaddress.ip_address(a.split("%")[0]).is_loopback
                                for a in addresses):
        raise SystemExit(f"{base_url}: this benchmark drives loopback servers only")


def make_prompts(num: int, input_len: int, vocab_size: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    # Ids from 3 up: the local tokenizers keep 0-2 for special tokens.
    low = 3 if vocab_size > 16 else 1
    return [[rng.randrange(low, vocab_size) for _ in range(input_len)] for _ in range(num)]


def to_text(prompts: list[list[int]], tokenizer_dir: Path) -> list[str]:
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json"))
    return [tokenizer.decode(p) for p in prompts]


def percentiles(values: list[float]) -> dict[str, float | None]:
    """Mean and p50/p90/p99 (linear interpolation), in the values' unit: the planner's own
    percentile, so that bench/plan_check.py sets measured and predicted side by side."""
    from folio.planner.simulator.run import percentile

    if not values:
        return {"mean": None, "p50": None, "p90": None, "p99": None}
    return {"mean": sum(values) / len(values), "p50": percentile(values, 50),
            "p90": percentile(values, 90), "p99": percentile(values, 99)}


async def one_request(session, url: str, body: dict, timeout: float) -> dict:
    """Streams one completion; times the first token chunk and each one after it."""
    start = time.perf_counter()
    chunks: list[float] = []
    usage = None
    try:
        async with asyncio.timeout(timeout):
            async with session.post(url, json=body) as response:
                if response.status != 200:
                    text = (await response.read()).decode(errors="replace")[:300]
                    return {"ok": False, "error": f"HTTP {response.status}: {text}"}
                async for line in response.content:   # one SSE line at a time
                    if not line.startswith(b"data: "):
                        continue
                    data = line[6:].rstrip()
                    if data == b"[DONE]":
                        break
                    event = json.loads(data)
                    if "error" in event:
                        return {"ok": False, "error": str(event["error"])[:300]}
                    if event.get("usage"):
                        usage = event["usage"]
                    for choice in event.get("choices", []):
                        # A token chunk carries text, or is not the bare finish marker
                        # (Folio ends with an empty-text chunk holding finish_reason).
                        if choice.get("text") or choice.get("finish_reason") is None:
                            chunks.append(time.perf_counter())
    except Exception as error:   # timeouts, HTTP and JSON errors: report, keep going
        return {"ok": False, "error": f"{type(error).__name__}: {error}"[:300]}
    end = time.perf_counter()
    if not chunks:
        return {"ok": False, "error": "no tokens streamed"}
    tokens = usage["completion_tokens"] if usage else len(chunks)
    prompt_tokens = usage["prompt_tokens"] if usage else None
    ttft = chunks[0] - start
    return {"ok": True, "ttft": ttft, "e2e": end - start, "output_tokens": tokens,
            "prompt_tokens": prompt_tokens,
            "tpot": (end - start - ttft) / (tokens - 1) if tokens > 1 else None,
            "itl": [b - a for a, b in zip(chunks, chunks[1:])], "chunks": len(chunks)}


async def _models(session, base_url: str) -> str:
    async with session.get(f"{base_url}/v1/models") as response:
        response.raise_for_status()
        return (await response.json())["data"][0]["id"]


def arrival_gap(rng: random.Random, rate: float, burstiness: float = 1.0) -> float:
    """Seconds to the next arrival: Poisson (exponential gaps) at burstiness 1, gamma gaps
    of the same mean otherwise."""
    if burstiness == 1.0:
        return rng.expovariate(rate)
    return rng.gammavariate(burstiness, 1 / (rate * burstiness))


async def run_benchmark(base_url: str, prompts: list, output_len: int, *, model: str | None,
                        max_concurrency: int | None, request_rate: float, seed: int,
                        request_timeout: float, deadline: float, api_key: str | None = None,
                        burstiness: float = 1.0) -> dict:
    """burstiness: the gaps between arrivals are gamma-distributed with this shape and the
    rate's mean (vLLM's bench serve --burstiness): 1 is Poisson, below 1 burstier."""
    import aiohttp   # its C HTTP parser: the client takes less of the cores it shares

    check_loopback(base_url)
    base_url = base_url.rstrip("/")
    slots = max_concurrency or len(prompts)
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    connector = aiohttp.TCPConnector(limit=slots)
    async with aiohttp.ClientSession(connector=connector, headers=headers, trust_env=False,
                                     timeout=aiohttp.ClientTimeout(total=None),
                                     read_bufsize=2**20) as client:
        model = model or await _models(client, base_url)
        semaphore = asyncio.Semaphore(slots)
        rng = random.Random(seed + 1)

        async def limited(prompt) -> dict:
            async with semaphore:
                body = {"model": model, "prompt": prompt, "max_tokens": output_len,
                        "temperature": 0, "ignore_eos": True, "stream": True,
                        "stream_options": {"include_usage": True}}
                return await one_request(client, f"{base_url}/v1/completions", body,
                                         request_timeout)

        load_before = os.getloadavg()
        start = time.perf_counter()
        tasks = []
        try:
            async with asyncio.timeout(deadline):
                for index, prompt in enumerate(prompts):
                    if index and request_rate != float("inf"):
                        await asyncio.sleep(arrival_gap(rng, request_rate, burstiness))
                    tasks.append(asyncio.create_task(limited(prompt)))
                results = await asyncio.gather(*tasks)
        except TimeoutError:
            for task in tasks:
                task.cancel()
            raise SystemExit(f"the run passed its deadline of {deadline} s") from None
        duration = time.perf_counter() - start
        load_after = os.getloadavg()
    return summarize(results, duration, model=model, base_url=base_url,
                     max_concurrency=max_concurrency, request_rate=request_rate,
                     loadavg=(load_before, load_after))


def summarize(results: list[dict], duration: float, **config) -> dict:
    done = [r for r in results if r["ok"]]
    errors = [r["error"] for r in results if not r["ok"]]
    output = sum(r["output_tokens"] for r in done)
    prompt = sum(r["prompt_tokens"] or 0 for r in done)
    ms = lambda values: {k: (v * 1000 if v is not None else None)   # noqa: E731
                         for k, v in percentiles(values).items()}
    load_before, load_after = config.pop("loadavg")
    rate = config["request_rate"]
    return {**config, "request_rate": None if rate == float("inf") else rate,
            "num_prompts": len(results), "completed": len(done), "failed": len(errors),
            "errors": errors[:5], "duration_s": duration,
            "total_input_tokens": prompt, "total_output_tokens": output,
            "request_throughput": len(done) / duration,
            "output_throughput": output / duration,
            "total_token_throughput": (prompt + output) / duration,
            "ttft_ms": ms([r["ttft"] for r in done]),
            "tpot_ms": ms([r["tpot"] for r in done if r["tpot"] is not None]),
            "itl_ms": ms([x for r in done for x in r["itl"]]),
            "e2e_ms": ms([r["e2e"] for r in done]),
            "loadavg_1m_before": load_before[0], "loadavg_1m_after": load_after[0]}


def _vocab_size(args) -> int:
    if args.vocab_size:
        return args.vocab_size
    if args.model_dir:
        return json.loads((args.model_dir / "config.json").read_text())["vocab_size"]
    raise SystemExit("give --vocab-size or --model-dir (its config.json has the vocabulary)")


def build_workload(args, seed: int | None = None, num: int | None = None) -> list:
    num = args.num_prompts if num is None else num
    if not 1 <= num <= MAX_PROMPTS:
        raise SystemExit(f"--num-prompts must be in [1, {MAX_PROMPTS}]")
    seed = args.seed if seed is None else seed
    prompts = make_prompts(num, args.input_len, _vocab_size(args), seed)
    if args.prompt_format == "text":
        if not args.model_dir:
            raise SystemExit("--prompt-format text needs --model-dir (its tokenizer.json)")
        return to_text(prompts, args.model_dir)
    return prompts


def add_workload_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--input-len", type=int, default=256)
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--num-prompts", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--vocab-size", type=int, default=None)
    parser.add_argument("--model-dir", type=Path, default=None,
                        help="checkpoint: its vocabulary size (and tokenizer, for text)")
    parser.add_argument("--prompt-format", choices=("ids", "text"), default="ids")
    parser.add_argument("--request-timeout", type=float, default=600.0)
    parser.add_argument("--deadline", type=float, default=3600.0,
                        help="seconds the whole run may take")


def add_run_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--base-url", required=True, help="http://127.0.0.1:PORT")
    parser.add_argument("--model", default=None,
                        help="model name (default: /v1/models' first)")
    parser.add_argument("--api-key", default=None)
    parser.add_argument("--label", default=None, help="server name in plots (default: URL)")
    parser.add_argument("--max-concurrency", type=int, default=None)
    parser.add_argument("--request-rate", type=float, default=float("inf"))
    parser.add_argument("-o", "--out", type=Path, default=None, help="JSON report path")
    add_workload_args(parser)


def run(args) -> None:
    """`bench/serve.py run`: one server, one workload, the report printed (and written)."""
    prompts = build_workload(args)
    result = asyncio.run(run_benchmark(
        args.base_url, prompts, args.output_len, model=args.model,
        max_concurrency=args.max_concurrency, request_rate=args.request_rate, seed=args.seed,
        request_timeout=args.request_timeout, deadline=args.deadline, api_key=args.api_key))
    result.update(label=args.label or args.base_url, input_len=args.input_len,
                  output_len=args.output_len, seed=args.seed, prompt_format=args.prompt_format)
    text = json.dumps(result, indent=2)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
    print(text)
