"""docs/protocol.md names every message type, every field, every code the code puts on the
wire. The lists come from the catalogue itself (shared/catalogue.py, shared/codes.py and the
encoders of shared/messages.py run on full samples), so a message, field or code added
without its documentation fails here."""

from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path

import pytest

from folio.shared import messages as m
from folio.shared.codes import FinishReason, RefusalCode
from folio.shared.config import ExecutorCapacity
from folio.shared.outputs import EngineOutput, StepOutputs
from folio.shared.sampling_params import SamplingParams
from folio.shared.step import NewRequest, StepPlan, StepResult
from folio.shared.wire import unpack

ROOT = Path(__file__).resolve().parents[2]
# Packages whose code sends messages: a pack("type", ...) there must name a catalogued type.
SENDERS = ("shared", "frontend", "scheduler", "executor", "folio")
# Values documented in tables of their own, not as message fields: the scheduler's counters
# (§5 stats), the page map (§5), sampling parameters (§3, test below), a replica's health
# (§4), and the frontend's per-token logprobs maps (§4 final).
OPAQUE = frozenset({"stats", "map", "params", "sp", "replicas", "logprobs", "prompt_logprobs"})

_LP = (-0.5, 1, [7, 8], [-0.5, -1.5])
_FRONTEND_LP = [{"token_id": 7, "logprob": -0.5, "rank": 1, "decoded_token": "a",
                 "top": [[7, -0.5, "a"]]}]


def _capacity() -> ExecutorCapacity:
    return ExecutorCapacity(num_kv_blocks=64, block_size=16, max_model_len=256,
                            vocab_size=1000, eos_token_ids=(2,), num_swap_blocks=8,
                            bytes_per_block=4096, prefill_tokens_per_s=1e4,
                            swap_bytes_per_s=1e9, sliding_window=64, rewrites_kv=True)


def _plan() -> StepPlan:
    new = NewRequest(handle=3, token_ids=[1, 2, 3], prompt_len=3, num_computed_tokens=0,
                     num_new_tokens=3, block_ids=[5], sampling=SamplingParams(logprobs=2))
    return StepPlan(step_id=9, new_requests=[new], running_handles=[0], running_num_tokens=[1],
                    new_block_ids={0: [6]}, dropped_handles=[1], swap_out=[(4, 0)],
                    swap_in=[(1, 4)], copies=[(2, 7)])


def _samples() -> dict[str, list[bytes]]:
    """Each encoder of the catalogue with every optional field set."""
    params = SamplingParams(max_tokens=4)
    entry = EngineOutput("b", [7], FinishReason.STOP, None, [_LP], [_LP], 0.5)
    return {
        "encode_hello_executor": [m.encode_hello_executor(_capacity(), 42)],
        "encode_plan": [m.encode_plan(_plan())],
        "encode_result": [m.encode_result(StepResult(9, [0], [7], [_LP], [(3, 1, [_LP])],
                                                     0.8))],
        "encode_executor_error": [m.encode_executor_error(9, "RuntimeError: boom")],
        "encode_ping": [m.encode_ping()],
        "encode_reset": [m.encode_reset()],
        "EngineInfo.encode": [m.EngineInfo(256, 1000, 64, 16, (2,)).encode()],
        "encode_add": [m.encode_add("r", [1, 2], params)],
        "encode_abort": [m.encode_abort("r")],
        "encode_frontend_hello": [m.encode_frontend_hello("fe-1-abcdef")],
        "encode_stats_request": [m.encode_stats_request()],
        "encode_kv_map_request": [m.encode_kv_map_request()],
        "encode_rejected": [m.encode_rejected("r", "full", RefusalCode.QUEUE_FULL)],
        "encode_outputs": [m.encode_outputs(StepOutputs(["a"], [3], [entry]))],
        "encode_stats": [m.encode_stats({"num_running": 1})],
        "encode_kv_map": [m.encode_kv_map(None), m.encode_kv_map({"step": 1}, "c1")],
        "encode_frontend_dropped": m.encode_frontend_dropped(["r"], "gone"),
        "encode_heartbeat": [m.encode_heartbeat(42), m.encode_heartbeat(42, "fe-1-abcdef")],
        "encode_generate": [m.encode_generate("c1", params, True, prompt="hi",
                                              prompt_token_ids=[1], deadline=5.0,
                                              messages=[{"role": "user", "content": "hi"}])],
        "encode_delta": [m.encode_delta("c1", "a", [7], _FRONTEND_LP)],
        "encode_final": [m.encode_final("c1", "a", [7], FinishReason.STOP, 2, _FRONTEND_LP,
                                        "stop", _FRONTEND_LP)],
        "encode_error": [m.encode_error("c1", RefusalCode.INVALID, "bad")],
        "encode_health": [m.encode_health("c1", True, False, True, True, "fe-1-abcdef", {},
                                          replicas=[])],
        "encode_health_query": [m.encode_health_query("c1")],
        "encode_kv_map_query": [m.encode_kv_map_query("c1")],
    }


def _encoders() -> set[str]:
    return ({name for name, value in vars(m).items()
             if name.startswith("encode_") and inspect.isfunction(value)} | {"EngineInfo.encode"})


def _documented(text: str | None = None) -> set[str]:
    text = (ROOT / "docs/protocol.md").read_text() if text is None else text
    return set(re.findall(r"`([^`\s]+)`", text))


def _keys(value) -> set[str]:
    """Every map key in a body, at any depth, except inside OPAQUE values."""
    if isinstance(value, dict):
        return {k for k in value} | {key for k, v in value.items() if k not in OPAQUE
                                     for key in _keys(v)}
    if isinstance(value, list):
        return {key for item in value for key in _keys(item)}
    return set()


def _wire_fields() -> dict[str, set[str]]:
    """Per message type: the keys its encoders write."""
    fields: dict[str, set[str]] = {}
    for payloads in _samples().values():
        for payload in payloads:
            msg_type, body = unpack(payload)
            fields.setdefault(msg_type, set()).update(_keys(body))
    return fields


def _inline_packs() -> set[str]:
    """Every literal type of a pack("type", ...) call in the sending packages."""
    found = set()
    for package in SENDERS:
        for path in (ROOT / package).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if (isinstance(node, ast.Call) and len(node.args) >= 1
                        and getattr(node.func, "id", getattr(node.func, "attr", None)) == "pack"
                        and isinstance(node.args[0], ast.Constant)
                        and isinstance(node.args[0].value, str)):
                    found.add(node.args[0].value)
    return found


def test_every_encoder_has_a_sample_here():
    assert set(_samples()) == _encoders(), "add a full sample of the new encoder to _samples"


def test_the_links_and_the_message_types_are_one_list():
    assert m.ALL_TYPES == frozenset(m.MessageType)
    sent = {unpack(p)[0] for payloads in _samples().values() for p in payloads}
    assert sent <= m.ALL_TYPES, f"encoded but on no link: {sorted(sent - m.ALL_TYPES)}"
    unsent = m.ALL_TYPES - sent
    assert not unsent, f"catalogued without an encoder: {sorted(unsent)}"
    stray = _inline_packs() - m.ALL_TYPES
    assert not stray, f"packed by name but not in shared/catalogue.py: {sorted(stray)}"


def test_every_message_type_is_documented():
    missing = sorted(m.ALL_TYPES - _documented())
    assert not missing, f"message types not in docs/protocol.md: {missing}"


def test_every_field_on_the_wire_is_documented():
    fields = _wire_fields()
    assert {"s", "h", "k", "n", "so", "cp"} <= fields["plan"]                 # the scan works
    documented = _documented()
    missing = {t: sorted(keys - documented) for t, keys in fields.items() if keys - documented}
    assert not missing, f"fields not in docs/protocol.md: {missing}"


def test_every_code_is_documented():
    values = {code.value for code in RefusalCode} | {reason.value for reason in FinishReason}
    missing = sorted(values - _documented())
    assert not missing, f"refusal codes or finish reasons not in docs/protocol.md: {missing}"


def test_every_sampling_parameter_is_documented():
    from dataclasses import fields

    names = {field.name for field in fields(SamplingParams)}
    assert {"temperature", "logprobs"} <= names
    missing = sorted(names - _documented())
    assert not missing, f"SamplingParams fields not in docs/protocol.md §3: {missing}"


@pytest.mark.parametrize("name", ["frontend_dropped", "cp", "queue_full", "slow_reader"])
def test_a_name_taken_out_of_the_doc_is_missed(name):
    """The checks above see a removal: the doc without every `name` lacks it."""
    text = (ROOT / "docs/protocol.md").read_text().replace(f"`{name}`", name)
    wanted = (m.ALL_TYPES | {c.value for c in RefusalCode}
              | set().union(*_wire_fields().values()))
    assert name in wanted and name not in _documented(text)
