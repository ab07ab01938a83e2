"""Per-step executor time on the throughput workload: prefill steps vs decode steps.

    python bench/step_times.py            # prints prefill tok/s and decode ms/step at peak

Same model and requests as bench/throughput.py (Folio only); reports the first steps, which
are prompt chunks under the 2048-token budget, and the decode steps while all 64 requests run.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.throughput import build_model, workload  # noqa: E402


def main() -> None:
    from folio import LLM, SamplingParams

    model = build_model(Path(".folio-cache/bench-llama-32m"))
    prompts, _ = workload(64, 0)
    llm = LLM(str(model), skip_tokenizer_init=True, dtype="float32")
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
        elif len(plan.running_handles) == 64:
            decode_ms.append(elapsed * 1e3)
    print(f"prefill: {prefill_tokens} tokens in {prefill_s:.2f} s = "
          f"{prefill_tokens / prefill_s:.0f} tok/s (steps mixing prompt chunks and decodes)")
    print(f"decode, 64 running: median {statistics.median(decode_ms):.1f} ms/step over "
          f"{len(decode_ms)} steps = {64e3 / statistics.median(decode_ms):.0f} tok/s")


if __name__ == "__main__":
    main()
