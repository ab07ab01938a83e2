"""The output processor alone (frontend/output_processor.py): text, stop strings, logprobs,
finish reasons and n samples, fed step by step as the engine reports them."""

from __future__ import annotations

import pytest

from folio.frontend.output_processor import RequestState, SampleState, vllm_logprob, wire_logprob
from folio.shared.outputs import EngineOutput, Logprob
from folio.shared.sampling_params import SamplingParams

TEXT = "The while statement repeats a block of code as long as a condition holds."


@pytest.fixture(scope="module")
def tokenizer(tokenizer_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tokenizer_dir))


def _state(tokenizer, fmt=wire_logprob, prompt=(1, 2, 3), **params) -> RequestState:
    return RequestState(tokenizer, SamplingParams(**params), list(prompt), fmt)


def _feed(sample: SampleState, ids: list[int], finish: str | None = None) -> str:
    """One token per step, as the columnar path gives them; the last step may finish."""
    streamed = ""
    for i, token_id in enumerate(ids):
        last = i == len(ids) - 1
        streamed += sample.add([token_id], None, finish if last else None)
        if sample.finished:
            break
    return streamed


def _boundary_stop(tokenizer, ids: list[int]) -> str:
    """A stop string that spans two tokens: the last char of one and the first of the next."""
    pieces = [tokenizer.decode([t]) for t in ids]
    k = next(i for i in range(1, len(ids)) if len(pieces[i - 1]) and len(pieces[i])
             and pieces[i - 1][-1:].isalpha() and pieces[i][:1].isalpha())
    return pieces[k - 1][-1:] + pieces[k][:1]


def test_plain_tokens_stream_the_decoded_text_and_finish(tokenizer):
    ids = tokenizer.encode(TEXT)
    sample = _state(tokenizer).samples[0]
    streamed = _feed(sample, ids, "length")
    assert streamed == sample.text == tokenizer.decode(ids)
    assert sample.token_ids == ids
    assert (sample.finish_reason, sample.stop_reason, sample.abort_engine) == \
        ("length", None, False)
    assert sample.logprobs is None and sample.new_logprobs is None
    assert sample.add([ids[0]]) == "" and sample.token_ids == ids   # finished: takes nothing


def test_a_stop_string_across_a_token_boundary_ends_the_sample(tokenizer):
    ids = tokenizer.encode(TEXT)
    stop = _boundary_stop(tokenizer, ids)
    full = tokenizer.decode(ids)
    for include, end in ((False, full.index(stop)), (True, full.index(stop) + len(stop))):
        sample = _state(tokenizer, stop=[stop], include_stop_str_in_output=include).samples[0]
        streamed = _feed(sample, ids)
        assert streamed == sample.text == full[:end]
        assert (sample.finish_reason, sample.stop_reason) == ("stop", stop)
        assert sample.abort_engine   # the engine still runs it: the caller aborts it
        assert len(sample.token_ids) < len(ids)


def test_a_stop_string_in_the_engines_last_step_needs_no_abort(tokenizer):
    ids = tokenizer.encode("a block")
    sample = _state(tokenizer, stop=["block"]).samples[0]
    assert sample.add(ids, None, "length") == "a "
    assert (sample.finish_reason, sample.stop_reason, sample.abort_engine) == \
        ("stop", "block", False)


def test_a_stop_string_before_min_tokens_is_passed_over(tokenizer):
    ids = tokenizer.encode("a block and a block")
    sample = _state(tokenizer, stop=["block"], min_tokens=len(ids)).samples[0]
    assert _feed(sample, ids, "length") == "a block and a block"
    assert sample.finish_reason == "length"


def test_special_tokens_are_skipped_unless_asked_for(tokenizer):
    eos = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    ids = tokenizer.encode("hello") + [eos]
    skipped = _state(tokenizer).samples[0]
    kept = _state(tokenizer, skip_special_tokens=False).samples[0]
    assert _feed(skipped, ids, "stop") == "hello"
    assert _feed(kept, ids, "stop") == "hello<|endoftext|>"
    assert skipped.token_ids == kept.token_ids == ids


def test_logprobs_in_the_frontends_shape(tokenizer):
    ids = tokenizer.encode("while True")
    raw = [(-0.5 * (i + 1), i + 1, [ids[0], 7], [-0.1, -2.0]) for i in range(len(ids))]
    state = _state(tokenizer, logprobs=2)
    sample = state.samples[0]
    state.add(sample, EngineOutput("r", ids[:1], logprobs=raw[:1]))
    first = {"token_id": ids[0], "logprob": -0.5, "rank": 1,
             "decoded_token": tokenizer.decode([ids[0]]),
             "top": [[ids[0], -0.1, tokenizer.decode([ids[0]])], [7, -2.0,
                                                                 tokenizer.decode([7])]]}
    assert sample.new_logprobs == [first]
    state.add(sample, EngineOutput("r", ids[1:], "length", logprobs=raw[1:]))
    assert len(sample.new_logprobs) == len(ids) - 1
    assert sample.logprobs[0] == first and len(sample.logprobs) == len(ids)
    assert sample.cumulative_logprob == pytest.approx(sum(entry[0] for entry in raw))


def test_logprobs_in_vllms_shape_and_only_when_asked(tokenizer):
    entry = (-1.5, 3, [5, 6], [-0.2, -0.9])
    assert vllm_logprob(tokenizer, 9, entry) == {
        5: Logprob(-0.2, 1, tokenizer.decode([5])), 6: Logprob(-0.9, 2, tokenizer.decode([6])),
        9: Logprob(-1.5, 3, tokenizer.decode([9]))}
    assert vllm_logprob(None, 5, entry) == {5: Logprob(-0.2, 1, None), 6: Logprob(-0.9, 2, None)}
    sample = _state(tokenizer, fmt=vllm_logprob).samples[0]   # logprobs not asked for
    sample.add([9], [entry])
    assert sample.logprobs is None and sample.new_logprobs is None
    assert sample.cumulative_logprob is None


def test_prompt_logprobs_start_at_the_second_prompt_token(tokenizer):
    prompt = [11, 12, 13, 14]
    state = _state(tokenizer, prompt=prompt, prompt_logprobs=0)
    sample = state.samples[0]
    raw = [(-1.0 * i, 1, [], []) for i in range(1, 4)]
    state.add(sample, EngineOutput("r", [], prompt_logprobs=raw[:2]))   # a chunked prompt
    state.add(sample, EngineOutput("r", [5], prompt_logprobs=raw[2:]))
    assert [e["token_id"] for e in state.prompt_logprobs] == prompt[1:]
    assert [e["logprob"] for e in state.prompt_logprobs] == [-1.0, -2.0, -3.0]
    assert _state(tokenizer).prompt_logprobs is None


def test_n_samples_are_independent_and_the_request_ends_with_the_last(tokenizer):
    ids = tokenizer.encode("a block of code")
    state = _state(tokenizer, n=3, stop=["code"])
    assert [s.index for s in state.samples] == [0, 1, 2]
    first, second, third = state.samples
    _feed(first, ids)   # ends on its stop string
    assert first.finished and not state.finished
    state.add(second, EngineOutput("r#1", ids[:2], "length"))
    assert not state.finished
    state.add(third, EngineOutput("r#2", [], "abort"))
    assert state.finished
    assert [(s.text, s.finish_reason, s.stop_reason) for s in state.samples] == [
        ("a block of ", "stop", "code"), (tokenizer.decode(ids[:2]), "length", None),
        ("", "abort", None)]
    assert state.add(first, EngineOutput("r#0", [7], "stop")) == ""   # ended: ignored


def test_without_a_tokenizer_only_token_ids(tokenizer):
    state = RequestState(None, SamplingParams(logprobs=0), [1, 2], vllm_logprob)
    sample = state.samples[0]
    assert state.add(sample, EngineOutput("r", [4, 5], "length",
                                          logprobs=[(-1.0, 1, [], []), (-2.0, 2, [], [])])) == ""
    assert (sample.text, sample.token_ids, sample.finish_reason) == ("", [4, 5], "length")
    assert sample.logprobs == [{4: Logprob(-1.0, 1, None)}, {5: Logprob(-2.0, 2, None)}]
    assert sample.cumulative_logprob == -3.0


def test_the_engine_client_aborts_a_sample_its_stop_string_ended(tokenizer):
    """The served path: plain tokens for the samples of n=2; a stop string frees one sample
    at the scheduler, the final result comes once both ended, in index order."""
    import zmq.asyncio

    from folio.frontend.engine_client import EngineClient
    from folio.shared.protocol import messages as m
    class Sink:
        def __init__(self) -> None:
            self.deltas, self.finals = [], []

        def delta(self, index, text, token_ids, logprobs) -> None:
            self.deltas.append((index, text, token_ids))

        def final(self, result) -> None:
            self.finals.append(result)

        def error(self, code, message) -> None:
            raise AssertionError(message)

    ctx = zmq.asyncio.Context()
    client = EngineClient(tokenizer, "ipc:///nonexistent/folio-test.sock", ctx)
    sent: list[bytes] = []
    client._send = lambda payload: sent.append(payload) or True   # sent: True
    try:
        sink = Sink()
        ids = tokenizer.encode("a block of code")
        request_id = client.submit([1, 2], SamplingParams(n=2, stop=["code"]), sink)
        for token_id in ids:
            client.outputs.on_token(f"{request_id}#1", token_id)
        assert sent[-1] == m.encode_abort(f"{request_id}#1")
        client.outputs.on_output(EngineOutput(f"{request_id}#1", [], "abort"))   # ignored: ended
        client.outputs.on_output(EngineOutput(f"{request_id}#0", ids[:2], "length"))
        [result] = sink.finals
        assert [(s.index, s.text, s.finish_reason, s.stop_reason) for s in result.samples] == [
            (0, tokenizer.decode(ids[:2]), "length", None), (1, "a block of ", "stop", "code")]
        assert "".join(text for index, text, _ in sink.deltas if index == 1) == "a block of "
        assert not client.requests and not client.outputs.samples   # nothing kept for it
    finally:
        client.close()
        ctx.term()
