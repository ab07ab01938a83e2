"""One user cannot hurt another: huge stop strings, long stop-string streams and huge chat
prompts are handled off the loop while others are served."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from folio import SamplingParams
from folio.client import AsyncClient
from folio.errors import FolioError
from tests.pipeline import start_streams
from tests.processes.cluster import ENDLESS, GREEDY, PROBE_PROMPT, value_or_error

pytestmark = pytest.mark.slow


LONG_STOPS = ["x" * 59_999 + chr(65 + i) for i in range(16)]   # 960 KB, every limit kept


async def _bystander(client: AsyncClient):
    return await value_or_error(client.generate(
        PROBE_PROMPT, SamplingParams(max_tokens=8, **GREEDY), timeout=60))


async def _bystanders_while(client: AsyncClient, job: asyncio.Task) -> list:
    """Bystanders one after another for as long as `job` runs (at least one): some are
    served beside it at any engine speed, with no guess at how long it takes."""
    served = [await _bystander(client)]
    while not job.done() and len(served) < 1000:
        served.append(await _bystander(client))
    return served


def test_a_960_kb_stop_string_request_hurts_no_one(healthy):
    """64 prompts, n = 3, 16 stop strings of 60,000 characters: it is served, and a
    bystander's request beside it gets its normal answer (no plan grows with stop strings)."""
    executor = healthy.procs["executor"]
    body = {"prompt": [[3 + i] * 5 for i in range(64)], "n": 3, "max_tokens": 4,
            "stop": LONG_STOPS, **GREEDY}

    async def run():
        async with AsyncClient(healthy.client_addresses[1]) as client, \
                httpx.AsyncClient(base_url=healthy.base, timeout=120) as http:
            big = asyncio.create_task(http.post("/v1/completions", json=body))
            return await _bystanders_while(client, big), await big

    bystanders, response = asyncio.run(run())
    assert response.status_code == 200, response.text[:300]
    choices = response.json()["choices"]
    assert sorted(c["index"] for c in choices) == list(range(192))
    assert {c["finish_reason"] for c in choices} == {"length"}
    for bystander in bystanders:
        assert not isinstance(bystander, FolioError), bystander
        assert bystander.token_ids == healthy.reference
    assert executor.poll() is None and healthy.procs["executor"] is executor   # no restart
    healthy.assert_serving(0)


def test_a_stream_with_long_stop_strings_does_not_stall_a_bystander(healthy):
    """Matching 16 stop strings of 60,000 characters costs each token its own characters:
    the stream gives the same text as without them, and bystanders are served meanwhile."""
    request = {"prompt": [9] * 20, "max_tokens": 300, **GREEDY}

    async def run():
        async with AsyncClient(healthy.client_addresses[0]) as client, \
                httpx.AsyncClient(base_url=healthy.base, timeout=60) as http:
            plain = (await http.post("/v1/completions", json=request)).json()

            first = asyncio.Event()

            async def stream():
                texts = []
                async with http.stream("POST", "/v1/completions", json={
                        **request, "stream": True, "stop": LONG_STOPS}) as response:
                    async for line in response.aiter_lines():
                        if line.startswith("data: {"):
                            texts.append(json.loads(line[6:])["choices"][0])
                            first.set()
                return texts

            streaming = asyncio.create_task(stream())
            await asyncio.wait_for(first.wait(), 60)   # streaming: now the bystanders
            bystanders = [await _bystander(client) for _ in range(3)]
            return plain, await asyncio.wait_for(streaming, 60), bystanders

    plain, chunks, bystanders = asyncio.run(run())
    assert "".join(c["text"] for c in chunks) == plain["choices"][0]["text"]
    assert chunks[-1]["finish_reason"] == "length"
    for bystander in bystanders:
        assert not isinstance(bystander, FolioError), bystander
        assert bystander.token_ids == healthy.reference


def test_a_huge_chat_prompt_is_prepared_off_the_loop_while_others_are_served(long_cluster):
    """A chat of one 7.5 M-character message is templated and tokenized beside the event
    loop: a stream running meanwhile goes on unharmed, requests sent meanwhile are served,
    and the huge one is refused alone (longer than max_model_len). The stream is an ENDLESS
    one on a cluster of its own, so it still runs while the huge one is prepared at any
    engine speed; it is aborted at the end."""
    healthy = long_cluster

    async def run():
        async with AsyncClient(healthy.client_addresses[0]) as client:
            (running,) = await start_streams(client, [7] * 20, SamplingParams(
                max_tokens=ENDLESS, **GREEDY))
            huge = asyncio.create_task(value_or_error(client.chat(
                [{"role": "user", "content": "The for statement. " * 390_000}],
                SamplingParams(max_tokens=4), timeout=120)))
            during = await _bystanders_while(client, huge)
            huge = await huge
            if running.done():   # an engine fast enough to finish it: it finished normally
                return await value_or_error(running), during, huge
            running.cancel()   # still streaming, nothing failed it: end it (an abort)
            await asyncio.gather(running, return_exceptions=True)
            return "running", during, huge

    running, during, huge = asyncio.run(run())
    assert running == "running" or (running.finish_reason == "length" and
                                    len(running.token_ids) == ENDLESS), running
    for bystander in during:
        assert not isinstance(bystander, FolioError), bystander
        assert bystander.token_ids == healthy.reference
    assert isinstance(huge, FolioError) and "max_model_len" in str(huge), huge
    healthy.assert_serving(0)


