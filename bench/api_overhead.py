"""What a request costs through OpenAI's Responses API and Anthropic's Messages API against
the same request through chat completions (issue 40's target: within 5%, one user and 16).

    python bench/api_overhead.py                              # the built-in model
    python bench/api_overhead.py --model DIR --concurrency 1 16 --rounds 5 -o overhead.json

Starts one `folio serve` (prefix caching off, so the same prompt costs the same through
each route), then, per concurrency, runs the same fixed-seed prompts through each route
in turn (chat, responses, messages; one unrecorded warm-up run each first, then the order
rotated every round, so no route is always first after another's burst), streamed,
greedy, exactly `--output-len` tokens each (`ignore_eos`). Reports per route and
concurrency the median over rounds of output tok/s, mean end-to-end latency, TTFT p50 and
the frontend's CPU seconds per request (where a translation's cost lands), and each
against chat. Every run's output tokens are checked to be prompts x output-len: the routes
did the same work. Loopback only.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import time
from pathlib import Path

if __package__ in (None, ""):   # run as a script: the repository root on the path
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.serve_client import percentiles  # noqa: E402
from bench.serve_process import children_cpu_s, start  # noqa: E402

ROUTES = ("chat", "responses", "messages")
_WORDS = ("the river stone light morning quiet number garden window letter paper city "
          "train music winter table open green small write answer question simple").split()


def prompts(num: int, words: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(_WORDS) for _ in range(words)) for _ in range(num)]


def request(route: str, model: str, prompt: str, output_len: int) -> tuple[str, dict]:
    """(path, body) of one greedy, streamed request of exactly output_len tokens."""
    common = {"model": model, "temperature": 0, "ignore_eos": True, "stream": True}
    user = [{"role": "user", "content": prompt}]
    if route == "chat":
        return "/v1/chat/completions", {**common, "messages": user, "max_tokens": output_len,
                                        "stream_options": {"include_usage": True}}
    if route == "responses":
        return "/v1/responses", {**common, "input": prompt, "max_output_tokens": output_len}
    return "/v1/messages", {**common, "messages": user, "max_tokens": output_len}


def _read_event(route: str, event: dict) -> tuple[bool, int | None]:
    """(whether it carries text, the output token count it reports, if any)."""
    if route == "chat":
        if "error" in event:
            raise RuntimeError(str(event["error"])[:300])
        text = any(choice["delta"].get("content") for choice in event["choices"])
        usage = event.get("usage")
        return text, usage and usage["completion_tokens"]
    kind = event.get("type")
    if kind == "error":
        raise RuntimeError(str(event)[:300])
    if route == "responses":
        if kind in ("response.completed", "response.incomplete"):
            return False, event["response"]["usage"]["output_tokens"]
        return kind == "response.output_text.delta", None
    if kind == "message_delta":
        return False, event["usage"]["output_tokens"]
    return kind == "content_block_delta", None


async def one(session, base_url: str, route: str, path: str, body: dict) -> dict:
    start_at = time.perf_counter()
    first = None
    tokens = 0
    async with session.post(base_url + path, json=body) as response:
        if response.status != 200:
            raise RuntimeError(f"{route}: HTTP {response.status}: "
                               f"{(await response.read())[:300]!r}")
        async for line in response.content:
            if not line.startswith(b"data: ") or line.startswith(b"data: [DONE]"):
                continue
            text, count = _read_event(route, json.loads(line[6:]))
            if text and first is None:
                first = time.perf_counter()
            if count is not None:
                tokens = count
    end = time.perf_counter()
    return {"ttft": (first or end) - start_at, "e2e": end - start_at, "tokens": tokens}


async def run_route(base_url: str, model: str, route: str, texts: list[str], output_len: int,
                    concurrency: int, timeout: float) -> dict:
    import aiohttp

    gate = asyncio.Semaphore(concurrency)

    async def gated(session, text):
        async with gate:
            path, body = request(route, model, text, output_len)
            return await one(session, base_url, route, path, body)

    client_timeout = aiohttp.ClientTimeout(total=timeout)
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(timeout=client_timeout, connector=connector) as session:
        start_at = time.perf_counter()
        results = await asyncio.gather(*(gated(session, text) for text in texts))
        duration = time.perf_counter() - start_at
    tokens = sum(r["tokens"] for r in results)
    if tokens != len(texts) * output_len:
        raise RuntimeError(f"{route}: {tokens} output tokens, expected "
                           f"{len(texts) * output_len}")
    return {"duration_s": duration, "output_tok_s": tokens / duration,
            "e2e_ms_mean": 1000 * statistics.mean(r["e2e"] for r in results),
            "ttft_ms_p50": 1000 * percentiles([r["ttft"] for r in results])["p50"]}


def _model(base_url: str) -> str:
    import urllib.request

    with urllib.request.urlopen(f"{base_url}/v1/models", timeout=10) as answer:
        return json.loads(answer.read())["data"][0]["id"]


def race(args) -> dict:
    server = start(args.model, ["--no-enable-prefix-caching", *args.serve_flag])
    try:
        model = _model(server.base_url)
        texts = prompts(args.num_prompts, args.input_words, args.seed)
        for route in ROUTES:   # warm-up, not recorded: first-request costs (compiles, caches)
            asyncio.run(run_route(server.base_url, model, route, texts, args.output_len,
                                  max(args.concurrency), args.request_timeout))
        runs = []
        for concurrency in args.concurrency:
            for round_ in range(args.rounds):
                shift = round_ % len(ROUTES)
                for route in ROUTES[shift:] + ROUTES[:shift]:
                    before = children_cpu_s(server.proc.pid, "folio-frontend")
                    report = asyncio.run(run_route(server.base_url, model, route, texts,
                                                   args.output_len, concurrency,
                                                   args.request_timeout))
                    cpu = children_cpu_s(server.proc.pid, "folio-frontend") - before
                    report.update(route=route, concurrency=concurrency, round=round_,
                                  frontend_cpu_ms_per_request=1000 * cpu / len(texts))
                    runs.append(report)
                    print(json.dumps(report), flush=True)
    finally:
        server.stop()
    return {"config": {k: v for k, v in vars(args).items() if k != "out"},
            "runs": runs, "summary": summarize(runs)}


def summarize(runs: list[dict]) -> list[dict]:
    """Per concurrency and route: medians over rounds, and each route against chat."""
    rows = []
    for concurrency in sorted({r["concurrency"] for r in runs}):
        medians = {}
        for route in ROUTES:
            mine = [r for r in runs if r["route"] == route and r["concurrency"] == concurrency]
            medians[route] = {key: statistics.median(r[key] for r in mine) for key in (
                "output_tok_s", "e2e_ms_mean", "ttft_ms_p50", "frontend_cpu_ms_per_request")}
        chat = medians["chat"]
        for route in ROUTES:
            row = {"concurrency": concurrency, "route": route, **medians[route],
                   "tok_s_vs_chat": medians[route]["output_tok_s"] / chat["output_tok_s"],
                   "e2e_vs_chat": medians[route]["e2e_ms_mean"] / chat["e2e_ms_mean"]}
            rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None, help="checkpoint (default: the built-in)")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--num-prompts", type=int, default=32)
    parser.add_argument("--input-words", type=int, default=64)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--request-timeout", type=float, default=600.0)
    parser.add_argument("--serve-flag", action="append", default=[],
                        help="one more `folio serve` flag (repeatable), e.g. "
                        "--serve-flag=--dtype=float32")
    parser.add_argument("-o", "--out", type=Path, default=None)
    args = parser.parse_args(argv)
    if any(c < 1 for c in args.concurrency) or args.rounds < 1 or args.num_prompts < 1:
        raise SystemExit("concurrency, rounds and num-prompts must be >= 1")
    report = race(args)
    for row in report["summary"]:
        print(f"c={row['concurrency']:<3} {row['route']:<10} {row['output_tok_s']:8.1f} tok/s "
              f"({row['tok_s_vs_chat']:.3f}x chat)  e2e {row['e2e_ms_mean']:8.1f} ms "
              f"({row['e2e_vs_chat']:.3f}x)  TTFT p50 {row['ttft_ms_p50']:7.1f} ms  "
              f"frontend {row['frontend_cpu_ms_per_request']:.1f} CPU ms/request")
    if args.out:
        args.out.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
