"""The typed catalogue: decoders give named values, the codes are str enums, and the
encoders that replaced inline pack("type", ...) calls write the very same bytes."""

from __future__ import annotations

import msgpack
import pytest

from shared import messages as m
from shared.codes import FinishReason, RefusalCode, refusal_code
from shared.sampling_params import SamplingParams
from shared.wire import Body, ProtocolError, unpack


def _body(payload: bytes) -> Body:
    return Body(*unpack(payload))


def _packed(msg_type: str, body: dict) -> bytes:
    return msgpack.packb([1, msg_type, body], use_bin_type=True)


@pytest.mark.parametrize("payload, msg_type, body", [
    (m.encode_ping(), "ping", {}),
    (m.encode_reset(), "reset", {}),
    (m.encode_stats_request(), "stats_request", {}),
    (m.encode_kv_map_request(), "kv_map_request", {}),
    (m.encode_frontend_hello("fe-1-abcdef"), "frontend_hello", {"id": "fe-1-abcdef"}),
    (m.encode_abort("w"), "abort", {"id": "w"}),
    (m.encode_health_query("q"), "health", {"id": "q"}),
    (m.encode_kv_map_query("q"), "kv_map", {"id": "q"}),
    (m.encode_health("c", True, False, True, True, "fe", {"n": 1}), "health",
     {"id": "c", "ok": True, "draining": False, "scheduler": True, "executor": True,
      "frontend_id": "fe", "stats": {"n": 1}}),
    (m.encode_health("c", True, False, True, True, "fe", {}, [{"replica": 0}]), "health",
     {"id": "c", "ok": True, "draining": False, "scheduler": True, "executor": True,
      "frontend_id": "fe", "stats": {}, "replicas": [{"replica": 0}]}),
    (m.encode_error("c", RefusalCode.ENGINE_DEAD, "gone"), "error",
     {"id": "c", "code": "engine_dead", "message": "gone"}),
])
def test_encoders_write_the_bytes_of_the_inline_packs_they_replace(payload, msg_type, body):
    assert payload == _packed(msg_type, body)


def test_decoders_give_named_tuples_that_still_unpack():
    request_id, prompt, params = m.decode_add(_body(m.encode_add("r", [1, 2],
                                                                 SamplingParams(max_tokens=3))))
    assert (request_id, prompt, params.max_tokens) == ("r", [1, 2], 3)
    add = m.decode_add(_body(m.encode_add("r", [1], SamplingParams())))
    assert add.request_id == "r" and add.prompt_token_ids == [1]
    dropped = m.decode_frontend_dropped(_body(m.encode_frontend_dropped(["a", "b"], "why")[0]))
    assert dropped == (["a", "b"], "why") and dropped.reason == "why"
    rejected = m.decode_rejected(_body(m.encode_rejected("r", "full", RefusalCode.QUEUE_FULL)))
    assert rejected == ("r", RefusalCode.QUEUE_FULL, "full")
    assert m.decode_executor_error(_body(m.encode_executor_error(4, "E: x"))) == (4, "E: x")
    assert m.decode_frontend_hello(_body(m.encode_frontend_hello("fe"))).frontend_id == "fe"
    assert m.decode_abort(_body(m.encode_abort("r#1"))).request_id == "r#1"
    assert m.decode_heartbeat(_body(m.encode_heartbeat(7))) == (7, None)
    assert m.decode_heartbeat(_body(m.encode_heartbeat(7, "fe"))) == (None, "fe")
    assert m.decode_client_query(_body(m.encode_health_query("q"))).request_id == "q"
    assert m.decode_error(_body(m.encode_error("c", "invalid", "no"))) == ("c", "invalid", "no")
    assert m.decode_stats(_body(m.encode_stats({"num_running": 2}))) == {"num_running": 2}


def test_codes_are_strings_on_the_wire_and_in_comparisons():
    assert FinishReason.STOP == "stop" and f"{FinishReason.LENGTH}" == "length"
    assert repr(FinishReason.ABORT) == "'abort'"   # outputs print as before
    assert msgpack.packb(RefusalCode.QUEUE_FULL) == msgpack.packb("queue_full")
    assert {"stop": 1}[FinishReason.STOP] == 1
    assert m.FINISH_REASONS == ("stop", "length", "abort", "error")
    assert refusal_code("timeout") is RefusalCode.TIMEOUT
    assert refusal_code("from_a_newer_peer") == "from_a_newer_peer"   # kept, not refused


def test_an_unknown_finish_reason_is_refused():
    with pytest.raises(ProtocolError, match="unknown finish reason"):
        m.decode_outputs(Body("outputs", {"o": [["r", [], "later", None]]}))
    out = m.decode_outputs(Body("outputs", {"o": [["r", [], "abort", None]]}))
    assert out.entries[0].finish_reason is FinishReason.ABORT


def test_each_socket_accepts_its_links_types_only():
    assert m.decode(m.encode_ping(), m.SCHEDULER_TO_EXECUTOR)[0] == "ping"
    with pytest.raises(ProtocolError, match="unexpected message type"):
        m.decode(m.encode_ping(), m.FRONTEND_TO_SCHEDULER)
    assert m.CLIENT_TYPES == m.CLIENT_TO_GATEWAY   # the old name still works
