"""The columnar `outputs` message: plain tokens as two lists, the rest as entries."""

from __future__ import annotations

import pytest

from folio.shared.protocol import messages as m
from folio.shared.outputs import EngineOutput, StepOutputs
from folio.shared.protocol.wire import ProtocolError, pack


def _roundtrip(outputs) -> StepOutputs:
    return m.decode_outputs(m.decode(m.encode_outputs(outputs), frozenset({"outputs"}))[1])


def test_plain_tokens_travel_as_columns_and_entries_apart():
    first = EngineOutput("b", [7], queued_s=0.5)
    done = EngineOutput("c#1", [9], "length")
    got = _roundtrip(StepOutputs(["a", "d#0"], [3, 4], [first, done]))
    assert (got.ids, got.tokens) == (["a", "d#0"], [3, 4])
    assert [(o.request_id, o.new_token_ids, o.finish_reason, o.queued_s)
            for o in got.entries] == [("b", [7], None, 0.5), ("c#1", [9], "length", None)]
    # Iterating yields entries first, then one output per plain token.
    assert [(o.request_id, o.new_token_ids) for o in got] == [
        ("b", [7]), ("c#1", [9]), ("a", [3]), ("d#0", [4])]


def test_a_plain_list_of_outputs_still_encodes():
    got = _roundtrip([EngineOutput("x", [], "abort")])
    assert got.ids == [] and [o.finish_reason for o in got.entries] == ["abort"]


@pytest.mark.parametrize("body", [
    {"o": [], "i": ["a", "b"], "t": [1]},             # lengths differ
    {"o": [], "i": [1], "t": [1]},                     # an id that is not a string
    {"o": [], "i": ["x" * 300], "t": [1]},             # an id too long
    {"o": [], "i": ["a"], "t": [-1]},                  # a token id out of range
])
def test_bad_columns_are_refused(body):
    with pytest.raises(ProtocolError):
        m.decode_outputs(m.decode(pack("outputs", body), frozenset({"outputs"}))[1])


def test_the_scheduler_reports_a_running_request_in_the_columns(llama_dir):
    from folio.llm import LLM
    from folio.shared.sampling_params import SamplingParams

    engine = LLM(model=str(llama_dir), num_kv_blocks=64).engine
    engine.add_request("r", [5, 6, 7], SamplingParams(temperature=0, max_tokens=4))
    steps = [engine.step() for _ in range(4)]
    assert [len(s.ids) for s in steps] == [0, 1, 1, 0]   # first token and finish are entries
    assert steps[0].entries[0].queued_s is not None
    assert steps[3].entries[0].finish_reason == "length"
