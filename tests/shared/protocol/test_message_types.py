"""The typed catalogue: decoders give named values, the codes are str enums, and the
encoders that replaced inline pack("type", ...) calls write the very same bytes."""

from __future__ import annotations

import msgpack
import pytest

from folio.shared.protocol import messages as m
from folio.shared.protocol.codes import FinishReason, RefusalCode, refusal_code
from folio.shared.sampling_params import SamplingParams
from folio.shared.protocol.wire import Body, ProtocolError, unpack


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
    request_id, prompt, params, client = m.decode_add(_body(m.encode_add(
        "r", [1, 2], SamplingParams(max_tokens=3), "10.0.0.7")))
    assert (request_id, prompt, params.max_tokens, client) == ("r", [1, 2], 3, "10.0.0.7")
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


def test_the_sdk_decodes_delta_and_final_replies_and_refuses_malformed_ones():
    delta = m.decode_delta(_body(m.encode_delta("c", "hi", [5, 6])))
    assert delta == ("c", "hi", [5, 6], None, 0)
    assert m.decode_delta(_body(m.encode_delta("c", "x", [7], index=2))).index == 2
    samples = [{"index": i, "text": t, "token_ids": ids, "finish_reason": "length",
                "stop_reason": None} for i, t, ids in ((1, "b", [8, 9, 10]), (0, "a", [7]))]
    pair = m.decode_final(_body(m.encode_final("c", "a", [7], "length", 3, samples=samples)))
    assert pair.usage["completion_tokens"] == 4   # every sample's tokens
    assert sorted((s["index"], s["text"]) for s in pair.samples) == [(0, "a"), (1, "b")]
    final = m.decode_final(_body(m.encode_final("c", "hi", [5, 6], "length", 3,
                                                logprobs=[{"token_id": 5}],
                                                stop_reason=None)))
    assert (final.finish_reason, final.usage, final.logprobs, final.prompt_logprobs) == (
        "length", {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5},
        [{"token_id": 5}], None)
    for body in ({"id": "c", "text": "x", "token_ids": ["5"]},   # a token id that is no int
                 {"id": "c", "token_ids": [5]}):                 # no text
        with pytest.raises(ProtocolError):
            m.decode_delta(Body("delta", body))
    bad_usage = unpack(m.encode_final("c", "", [], "stop", 1))[1] | {"usage": {"x": 1}}
    with pytest.raises(ProtocolError, match="usage"):
        m.decode_final(Body("final", bad_usage))


def test_the_sdk_names_a_malformed_final_as_the_servers_fault(tmp_path):
    import asyncio

    import zmq

    from folio.client import AsyncClient
    from folio.errors import FolioError

    address = f"ipc://{tmp_path}/gateway.sock"
    ctx = zmq.Context()
    gateway = ctx.socket(zmq.ROUTER)
    gateway.setsockopt(zmq.LINGER, 0)
    gateway.bind(address)

    def answer_badly() -> None:   # a stand-in gateway: a final whose token ids are text
        identity, data = gateway.recv_multipart()
        wire_id = unpack(data)[1]["id"]
        body = unpack(m.encode_final(wire_id, "x", [1], "stop", 1))[1] | {"token_ids": ["1"]}
        gateway.send_multipart([identity, _packed("final", body)])

    async def run() -> str:
        async with AsyncClient(address) as client:
            answering = asyncio.get_running_loop().run_in_executor(None, answer_badly)
            try:
                await client.generate([1, 2], SamplingParams(max_tokens=1))
            except FolioError as error:
                return str(error)
            finally:
                await answering
        return "no error"

    try:
        message = asyncio.run(run())
    finally:
        gateway.close(0)
        ctx.term()
    assert "the server sent a malformed final" in message and "token_ids" in message


def test_the_sdk_decodes_health_replies_with_and_without_replicas():
    one = m.decode_health(_body(m.encode_health("c", True, False, True, True, "fe",
                                                {"num_running": 1})))
    assert one == ("c", True, False, True, True, "fe", {"num_running": 1}, None)
    two = m.decode_health(_body(m.encode_health("c", False, False, True, False, "fe", {},
                                                [{"replica": 0}, {"replica": 1}])))
    assert not two.ok and [r["replica"] for r in two.replicas] == [0, 1]
    with pytest.raises(ProtocolError, match="stats"):
        m.decode_health(Body("health", {"id": "c", "ok": True, "stats": [1]}))


# ---- every decoder, generated or hand-written, holds to its declaration ---------------------

def _declared_samples():
    """(declaration, a body with every field) for each declaration, from the doc test's full
    samples: the body of its type that has the most of its keys and all its required ones."""
    from folio.shared.protocol.catalogue import DECLARATIONS
    from tests.shared.protocol.test_doc import _samples

    bodies = [unpack(p) for payloads in _samples().values() for p in payloads]
    for declaration in DECLARATIONS:
        keys = {f.key for f in declaration.fields}
        fits = [body for msg_type, body in bodies if msg_type == declaration.type
                and set(body) <= keys
                and all(f.key in body for f in declaration.fields if f.required)]
        assert fits, f"no full sample of {declaration.name}"
        body = max(fits, key=len)
        if declaration.type == "generate":   # one prompt of the three kinds, as it must be
            body = {k: v for k, v in body.items() if k not in ("prompt_token_ids", "messages")}
        yield declaration, body


def _out_of_bounds(kind, value):
    """Values the declared kind refuses, and values at its bounds that it accepts."""
    from folio.shared.protocol.schema import INT64, Bool, Code, Float, Int, Ints, Str

    bad, good = (["x"] if not isinstance(kind, (Str, Code)) else [5]), []
    if isinstance(kind, Int):
        bad += [True, 1.5, kind.high + 1] + ([kind.low - 1] if kind.low > INT64[0] else [])
        good += [kind.low, kind.high]
    elif isinstance(kind, Ints) and value:
        bad += [[kind.high + 1, *value[1:]], [True, *value[1:]]]
        bad += [[kind.low - 1, *value[1:]]] if kind.low > INT64[0] else []
        good += [[kind.high, *value[1:]], [kind.low, *value[1:]]]
    elif isinstance(kind, Float) and kind.high is not None:
        bad += [kind.high * 2 + 1, float("nan")]
    elif isinstance(kind, Str) and kind.max_len <= 1 << 20:
        bad += ["x" * (kind.max_len + 1)]
    elif isinstance(kind, Bool):
        bad += [1]
    elif isinstance(kind, Code) and kind.strict:
        bad += ["from_a_newer_peer"]
    return bad, good


def test_each_decoder_refuses_what_its_declaration_refuses():
    """For every declared field of every message (the hot path's hand-written codecs too):
    missing when required, of the wrong type or past its bounds, the message is refused; at
    its bounds, and with a key nobody declared, it is read."""
    checked = 0
    for declaration, body in _declared_samples():
        declaration.decode(Body(declaration.type, body | {"zz_not_declared": 1}))
        for field in declaration.fields:
            if field.required:
                with pytest.raises(ProtocolError):
                    declaration.decode(Body(declaration.type,
                                            {k: v for k, v in body.items() if k != field.key}))
            bad, good = _out_of_bounds(field.kind, body.get(field.key))
            for value in bad:
                with pytest.raises(ProtocolError):
                    declaration.decode(Body(declaration.type, body | {field.key: value}))
                    pytest.fail(f"{declaration.name}.{field.key} = {value!r} was read")
            for value in good:
                declaration.decode(Body(declaration.type, body | {field.key: value}))
            checked += 1
    assert checked > 60


def test_stats_and_the_page_map_are_checked_and_bounded():
    stats = {"num_running": 3, "kv_slot_utilization": 0.5, "executor_alive": True,
             "executor_ranks": [11, 12], "from_a_newer_scheduler": 1}
    decoded = m.decode_stats(_body(m.encode_stats(stats)))
    assert decoded == {k: v for k, v in stats.items() if k != "from_a_newer_scheduler"}
    for bad in ({"num_running": "3"}, {"num_running": -1}, {"executor_alive": 1},
                {"kv_slot_utilization": 2.0}, {"executor_ranks": list(range(2000))}):
        with pytest.raises(ProtocolError):
            m.decode_stats(_body(m.encode_stats(bad)))
    with pytest.raises(ProtocolError):
        m.decode_health(_body(m.encode_health("c", True, False, True, True, "fe",
                                              {"replicas": [{"num_running": 1}]})))
