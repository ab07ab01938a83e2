"""Multi-step decoding through `folio serve` (docs/multi_step.md): with
--num-scheduler-steps 4 a stream's text is the greedy text of one pass per step, its tokens
arrive in groups (fewer chunks than tokens), and /metrics counts the bursts."""

from __future__ import annotations

import httpx
import pytest

from folio import LLM, SamplingParams
from tests.http_server import openai_client, serving

pytestmark = pytest.mark.slow

PROMPTS = ["The quick brown fox", "Once upon a time, in a"]
MAX_TOKENS = 23


def test_streams_match_one_pass_per_step_and_come_in_groups(llama_dir, tmp_path):
    want = [r.outputs[0].text for r in LLM(str(llama_dir), dtype="float32").generate(
        PROMPTS, SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True))]
    with serving(llama_dir, tmp_path, "--dtype", "float32", "--num-kv-blocks", "256",
                 "--num-scheduler-steps", "4") as server:
        client = openai_client(server, "none")
        for prompt, text in zip(PROMPTS, want):
            chunks = [chunk.choices[0].text for chunk in client.completions.create(
                model=client.models.list().data[0].id, prompt=prompt, max_tokens=MAX_TOKENS,
                temperature=0, stream=True, extra_body={"ignore_eos": True})
                if chunk.choices and chunk.choices[0].text]
            assert "".join(chunks) == text
            assert len(chunks) < MAX_TOKENS / 2   # several tokens a chunk
        # A grouped chunk still carries one logprob entry per token.
        entries, pieces = [], []
        for chunk in client.completions.create(
                model=client.models.list().data[0].id, prompt=PROMPTS[0],
                max_tokens=MAX_TOKENS, temperature=0, stream=True, logprobs=2,
                extra_body={"ignore_eos": True}):
            if chunk.choices and chunk.choices[0].logprobs:
                entries += chunk.choices[0].logprobs.tokens
                pieces.append(chunk.choices[0].text)
        assert len(entries) == MAX_TOKENS and "".join(pieces) == want[0]
        metrics = httpx.get(f"{server.base}/metrics").text
    bursts = [line for line in metrics.splitlines()
              if line.startswith("folio:multi_step_bursts_total")]
    assert bursts and float(bursts[0].split()[-1]) > 0
