"""Speculative decoding on vs off through `folio serve` (one step in flight), one user:
the copy-heavy and fresh prompts of bench/speculative.py over HTTP (/v1/completions with
the prompt's token ids, greedy, streamed off), each server started in turn, alternated.

    python -m bench.speculative_served --model /tmp/smol/f32 --rounds 2
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request

from bench.speculative import copy_prompt, fresh_prompt

SPEC = json.dumps({"method": "ngram", "num_speculative_tokens": 4})


def _post(port: int, body: dict) -> dict:
    request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions",
                                     data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=600) as response:
        return json.loads(response.read())


def _serve(model: str, port: int, spec: bool) -> subprocess.Popen:
    args = [sys.executable, "-m", "folio", "serve", "--model", model, "--port", str(port),
            "--dtype", "float32"] + (["--speculative-config", SPEC] if spec else [])
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1):
                return proc
        except OSError:
            time.sleep(0.5)
    proc.kill()
    raise TimeoutError("folio serve did not come up")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--port", type=int, default=18431)
    args = parser.parse_args()
    from folio.shared.hf_tokenizer import load_tokenizer

    tokenizer = load_tokenizer(args.model)
    prompts = {"copy": copy_prompt(tokenizer, 1200), "fresh": fresh_prompt(tokenizer)}
    texts: dict[str, str] = {}   # greedy: every mode and round answers the same
    for round_index in range(args.rounds):
        for spec in (False, True) if round_index % 2 == 0 else (True, False):
            proc = _serve(args.model, args.port, spec)
            try:
                name = _post(args.port, {"model": args.model, "prompt": "hi", "max_tokens": 2})
                model = name["model"]
                for workload, prompt in prompts.items():
                    start = time.perf_counter()
                    answer = _post(args.port, {"model": model, "prompt": prompt,
                                               "max_tokens": args.max_tokens,
                                               "temperature": 0, "ignore_eos": True})
                    seconds = time.perf_counter() - start
                    tokens = answer["usage"]["completion_tokens"]
                    text = answer["choices"][0]["text"]
                    assert texts.setdefault(workload, text) == text, "the answer changed"
                    print(json.dumps({"round": round_index, "workload": workload,
                                      "mode": "on" if spec else "off", "tokens": tokens,
                                      "tok_s": round(tokens / seconds, 1),
                                      "load": round(os.getloadavg()[0], 1)}), flush=True)
            finally:
                proc.send_signal(signal.SIGTERM)
                proc.wait(timeout=60)


if __name__ == "__main__":
    main()
