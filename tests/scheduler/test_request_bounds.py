"""Per-request bounds that protect everyone else: plans carry only what the executor reads,
request fields have documented limits, stop strings match in time linear in the text, and
a multi-prompt stream that ends early leaves no prompt running."""

from __future__ import annotations

import asyncio
import random

import pytest

from folio.frontend.http.answers import guarded as _guarded
from folio.frontend.openai.completions import _Job, _stream_completion
from folio.frontend.output_text import OutputText
from folio.frontend.stop_strings import StopMatcher, StopStrings
from folio.shared.protocol import messages as m
from folio.shared.sampling_params import MAX_STOP_CHARS, SamplingParams
from folio.shared.protocol.step import NewRequest, StepPlan
from folio.shared.protocol.wire import Body, unpack

LONG_STOPS = tuple("x" * 59_999 + chr(65 + i) for i in range(16))   # the 960 KB request's


def test_a_plan_carries_no_stop_strings_only_what_the_executor_reads():
    params = SamplingParams(n=3, temperature=0.7, top_k=5, seed=9, stop=LONG_STOPS,
                            stop_token_ids=[7], logprobs=2, logit_bias={3: 1.5},
                            include_stop_str_in_output=True, skip_special_tokens=False)
    plan = StepPlan(step_id=1)
    plan.new_requests = [NewRequest(handle=h, token_ids=[1, 2, 3], prompt_len=3,
                                    num_computed_tokens=0, num_new_tokens=3, block_ids=[h],
                                    sampling=params) for h in range(192)]
    data = m.encode_plan(plan)
    assert len(data) < 192 * 512   # without the stop strings; with them it was > 180 MB
    decoded = m.decode_plan(Body("plan", unpack(data)[1])).new_requests[0].sampling
    assert decoded.stop == () and not decoded.include_stop_str_in_output
    for name in ("n", "temperature", "top_k", "seed", "stop_token_ids", "logprobs",
                 "logit_bias", "min_tokens", "ignore_eos"):
        assert getattr(decoded, name) == getattr(params, name), name
    add = m.encode_add("r-1", [1, 2, 3], params)   # nor does the scheduler's add
    assert len(add) < 512
    assert m.decode_add(Body("add", unpack(add)[1]))[2] == decoded


@pytest.mark.parametrize("kwargs, message", [
    ({"stop": ["x" * (MAX_STOP_CHARS + 1)]}, "stop strings must be at most 65536 characters"),
    ({"stop": ["a"] * 17}, "stop takes at most 16 strings"),
    ({"stop_token_ids": list(range(1025))}, "stop_token_ids takes at most 1024 ids"),
])
def test_request_fields_over_their_documented_bound_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SamplingParams(**kwargs)


def _earliest(text: str, stops: tuple[str, ...]) -> tuple[int, str] | None:
    """A naive search: the occurrence that starts first (the first string on a tie)."""
    best = None
    for stop in stops:
        index = text.find(stop)
        if index >= 0 and (best is None or index < best[0]):
            best = (index, stop)
    return best


def test_the_matcher_finds_what_a_naive_search_finds():
    rng = random.Random(3)
    for _ in range(3000):
        stops = tuple("".join(rng.choice("ab") for _ in range(rng.randint(1, 6)))
                      for _ in range(rng.randint(1, 4)))
        text = "".join(rng.choice("ab") for _ in range(rng.randint(0, 40)))
        matcher, fed, found = StopMatcher(StopStrings(stops)), 0, None
        while fed < len(text) and found is None:   # fed in random chunks
            chunk = text[fed:fed + rng.randint(1, 4)]
            match = matcher.feed(chunk)
            if match is None:
                tail = text[:fed + len(chunk)]
                assert _earliest(tail, stops) is None
                assert matcher.held_back() == max(
                    (k for s in stops for k in range(1, len(s)) if tail.endswith(s[:k])),
                    default=0)
            else:
                found = (fed + match[0], match[1])
            fed += len(chunk)
        assert found == _earliest(text[:fed], stops), (stops, text)


class _CharTokenizer:
    def decode(self, ids, skip_special_tokens=True) -> str:
        return "".join(chr(i) for i in ids)


def test_long_stop_strings_hold_back_only_a_partial_match_and_still_stop():
    stops = LONG_STOPS
    text = OutputText(_CharTokenizer(), SamplingParams(stop=stops), StopStrings(stops))
    streamed = "".join(text.add([ord("x")]) for _ in range(70_000))
    assert streamed == "x" * 10_001   # the rest may still become a stop string
    assert text.add([ord("C")]) == ""    # it did: "x" * 59_999 + "C"
    assert text.stop_string == stops[2] and text.text == streamed


class _Engine:
    def __init__(self) -> None:
        self.aborted: list[str] = []

    def abort(self, request_id: str) -> None:
        self.aborted.append(request_id)


def test_a_stream_ended_by_one_prompts_refusal_aborts_its_siblings():
    """A multi-prompt stream whose second prompt is refused after the first bytes went out:
    the stream ends with the error event, and every prompt of it is aborted."""

    async def run():
        engine, queue = _Engine(), asyncio.Queue()
        job = _Job(engine, queue, ["r-0", "r-1", "r-2"], [[1], [2], [3]], 1)
        queue.put_nowait(("delta", 0, "Hel", [5], None))
        queue.put_nowait(("error", "queue_full", "the queue is full (100 requests waiting)"))
        stream = _stream_completion(job, "cmpl-1", 0, "tiny", False)
        first = await stream.__anext__()
        chunks = [first] + [chunk async for chunk in _guarded(job, stream, first)][1:]
        return engine.aborted, chunks

    aborted, chunks = asyncio.run(run())
    assert '"Hel"' in chunks[0] and "queue_full" in chunks[-1]
    assert aborted == ["r-0", "r-1", "r-2"]


def test_text_too_long_for_the_context_is_refused_before_tokenizing(tokenizer_dir):
    from folio.frontend.prompts import PromptError, check_text_size, max_token_chars
    from folio.shared.hf_tokenizer import load_tokenizer

    tokenizer = load_tokenizer(tokenizer_dir)
    bound = max_token_chars(tokenizer)
    # Sound: no token decodes to more characters than the bound.
    assert all(len(tokenizer.decode([i])) <= bound for i in range(len(tokenizer)))
    check_text_size(2 * 1024 * bound, 1024, bound)   # might fit: left to the tokenizer
    with pytest.raises(PromptError, match="cannot fit .* max_model_len = 1024"):
        check_text_size(2 * 1024 * bound + 1, 1024, bound)


def test_a_burst_over_the_backlog_is_no_slow_reader_but_a_reader_that_stops_is(monkeypatch):
    """Events that arrive at once (a frontend resumed after a stop) exceed the bound before
    the reader had its turn: a reader that then reads is not aborted. A reader that reads
    nothing is aborted after the grace, once, with a slow_reader error at the end."""
    from folio.frontend.openai import completions as openai_api
    monkeypatch.setattr(openai_api, "READER_GRACE_S", 0.05)

    async def run(reads: bool):
        engine, queue = _Engine(), asyncio.Queue()
        backlog = openai_api._Backlog(engine, queue, 4)
        backlog.request_ids.append("r-0")
        for i in range(20):   # one burst, five times the bound
            backlog.put(("delta", 0, "x", [i], None))
        got = []
        if reads:
            while not queue.empty():
                got.append(queue.get_nowait())
        await asyncio.sleep(0.2)
        backlog.put(("final", 0, None))
        while not queue.empty():
            got.append(queue.get_nowait())
        return engine.aborted, got

    aborted, got = asyncio.run(run(reads=True))
    assert aborted == [] and len(got) == 21 and got[-1][0] == "final"
    aborted, got = asyncio.run(run(reads=False))
    assert aborted == ["r-0"] and got[-1][:2] == ("error", "slow_reader") and len(got) == 21
