"""The pooled vectors' fields on the wire (docs/protocol.md): the result's `pl`, the
outputs' `p`, the SDK's final `pooled`; malformed ones refused."""

from __future__ import annotations

import pytest

from folio.shared.outputs import EngineOutput, StepOutputs
from folio.shared.pooling.vectors import from_bytes, to_bytes
from folio.shared.protocol import messages as m
from folio.shared.protocol.step import StepResult
from folio.shared.protocol.wire import Body, ProtocolError, pack, unpack

VECTOR = to_bytes([0.5, -1.25, 3.0])


def _round_trip(payload: bytes, decode):
    kind, body = unpack(payload)
    return decode(Body(kind, body))


def test_result_and_outputs_carry_the_vector():
    result = StepResult(step_id=3, pooled=[(7, VECTOR)])
    back = _round_trip(m.encode_result(result), m.decode_result)
    assert back.pooled == [(7, VECTOR)] and back.handles == []
    outputs = StepOutputs(entries=[EngineOutput("a", [], "stop", pooled=VECTOR),
                                   EngineOutput("b", [4], None)])
    decoded = _round_trip(m.encode_outputs(outputs), m.decode_outputs).entries
    assert [o.pooled for o in decoded] == [VECTOR, None]
    assert from_bytes(decoded[0].pooled).tolist() == [0.5, -1.25, 3.0]


@pytest.mark.parametrize("pooled", [[[7, "text"]], [[7]], [[-1, VECTOR]],
                                    [[7, b"x" * (4 << 17)]]])
def test_a_malformed_result_vector_is_refused(pooled):
    payload = pack("result", {"s": 0, "h": [], "t": [], "pl": pooled})
    with pytest.raises(ProtocolError):
        _round_trip(payload, m.decode_result)


def test_a_malformed_outputs_vector_is_refused():
    payload = pack("outputs", {"o": [["a", [], "stop", None]], "p": {"a": [1.0]}})
    with pytest.raises(ProtocolError):
        _round_trip(payload, m.decode_outputs)
