"""docs/protocol.md is the declarations: its marked tables render them (shared/protocol/doc.py),
it names every message type, field and code, and its §2 table of what each socket accepts is
the catalogue's. The encoders, run on full samples, write only declared fields. A message,
field, bound or code changed or added without its documentation fails here."""

from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path

import pytest

from folio.shared.protocol import messages as m
from folio.shared.protocol import doc as protocol_doc
from folio.shared.protocol.catalogue import DECLARATIONS
from folio.shared.protocol.codes import FinishReason, RefusalCode
from folio.shared.config import ExecutorCapacity
from folio.shared.outputs import EngineOutput, StepOutputs
from folio.shared.sampling_params import SamplingParams
from folio.shared.protocol.schema import Items, ListOf, MapOf, Nil, Shape
from folio.shared.protocol.step import NewRequest, StepPlan, StepResult
from folio.shared.protocol.wire import unpack

ROOT = Path(__file__).resolve().parents[3]
# Packages whose code sends messages: a pack("type", ...) there must name a catalogued type.
SENDERS = ("shared", "frontend", "scheduler", "executor", "folio")
# Maps whose keys are not message fields: sampling parameters (§3, test below) and the
# frontend's per-token logprobs maps (§4 final), passed to the SDK as they are.
OPAQUE = frozenset({"params", "sp", "logprobs", "prompt_logprobs"})

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


TOTALS = ("total", "used", "cached", "free", "shared", "slots_filled", "slot_utilization",
          "swap_total", "swap_used", "running", "swapped", "waiting", "requests")
CONTIGUOUS = ("reserve_tokens", "blocks_per_request", "requests", "blocks_needed", "fits",
              "slots_filled", "slot_utilization")


def _page_map() -> dict:
    request = {"id": "r", "state": "running", "blocks": [0, 1], "swap_blocks": [],
               "computed": 20, "tokens": 21, "prompt_tokens": 20, "max_tokens": None,
               "preemptions": 0, "wait_s": 0.0, "age_s": 0.5}
    return {"block_size": 16, "num_blocks": 2, "max_model_len": 256, "step": 3,
            "requests": [request], "running": [0], "swapped": [], "waiting": [],
            "shared": [[0, [0]]], "totals": dict.fromkeys(TOTALS, 1),
            "contiguous": dict.fromkeys(CONTIGUOUS, 1), "blocks": {"state": "UU", "ref": [1, 1],
                                                  "fill": [16, 5], "owner": [0, 0]},
            "swap": {"state": "F", "fill": [0], "owner": [-1]}, "replica": 0}


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
        "encode_lora_update": [m.encode_lora_update("u", "adapter", "/adapters/a")],
        "encode_lora_updated": [m.encode_lora_updated("u", "adapter", "no such adapter")],
        "encode_rejected": [m.encode_rejected("r", "full", RefusalCode.QUEUE_FULL)],
        "encode_outputs": [m.encode_outputs(StepOutputs(["a"], [3], [entry]))],
        "encode_stats": [m.encode_stats({"num_running": 1, "executor_ranks": [4]})],
        "encode_kv_map": [m.encode_kv_map(None), m.encode_kv_map(_page_map(), "c1")],
        "encode_frontend_dropped": m.encode_frontend_dropped(["r"], "gone"),
        "encode_heartbeat": [m.encode_heartbeat(42), m.encode_heartbeat(42, "fe-1-abcdef")],
        "encode_generate": [m.encode_generate("c1", params, True, prompt="hi",
                                              prompt_token_ids=[1], deadline=5.0,
                                              messages=[{"role": "user", "content": "hi"}])],
        "encode_delta": [m.encode_delta("c1", "a", [7], _FRONTEND_LP)],
        "encode_final": [m.encode_final("c1", "a", [7], FinishReason.STOP, 2, _FRONTEND_LP,
                                        "stop", _FRONTEND_LP)],
        "encode_error": [m.encode_error("c1", RefusalCode.INVALID, "bad")],
        "encode_health": [m.encode_health(
            "c1", True, False, True, True, "fe-1-abcdef",
            {"num_running": 1, "replicas": [{"replica": 0, "num_running": 1}]},
            replicas=[{"replica": 0, "address": "ipc://x", "status": "unhealthy",
                       "reason": "gone", "in_flight": 0, "routed": 3,
                       "ranks": [{"rank": 0, "pid": 9, "status": "unhealthy"}]}])],
        "encode_health_query": [m.encode_health_query("c1")],
        "encode_kv_map_query": [m.encode_kv_map_query("c1")],
    }


def _encoders() -> set[str]:
    return ({name for name, value in vars(m).items()
             if name.startswith("encode_") and inspect.isfunction(value)} | {"EngineInfo.encode"})


def _documented(text: str | None = None) -> set[str]:
    text = (ROOT / "docs/protocol.md").read_text() if text is None else text
    return set(re.findall(r"`([^`\s]+)`", text))


def _declared_keys(kinds) -> set[str]:
    """Every map key the declarations name, at any depth (array positions are not keys)."""
    keys: set[str] = set()
    for kind in kinds:
        while isinstance(kind, (ListOf, Nil, MapOf)):
            kind = kind.value if isinstance(kind, MapOf) else getattr(kind, "item", None) \
                if isinstance(kind, ListOf) else kind.kind
        if isinstance(kind, Shape):
            keys |= {f.key for f in kind.fields} | _declared_keys(f.kind for f in kind.fields)
        elif isinstance(kind, Items):
            keys |= _declared_keys(f.kind for f in kind.fields)
    return keys


def _all_declared_keys() -> set[str]:
    return ({f.key for d in DECLARATIONS for f in d.fields}
            | _declared_keys(f.kind for d in DECLARATIONS for f in d.fields))


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
    assert m.ALL_TYPES == {d.type for d in DECLARATIONS}
    sent = {unpack(p)[0] for payloads in _samples().values() for p in payloads}
    assert sent <= m.ALL_TYPES, f"encoded but on no link: {sorted(sent - m.ALL_TYPES)}"
    unsent = m.ALL_TYPES - sent
    assert not unsent, f"catalogued without an encoder: {sorted(unsent)}"
    stray = _inline_packs() - m.ALL_TYPES
    assert not stray, f"packed by name but not declared: {sorted(stray)}"


def test_the_doc_tables_are_the_declarations():
    """Every marked table's Type, Range and Presence columns are what the declarations say
    (python -m folio.shared.protocol.doc rewrites them), and every row has its prose."""
    text = (ROOT / "docs/protocol.md").read_text()
    assert protocol_doc.problems(text) == []
    assert protocol_doc.rewrite(text) == text


@pytest.mark.parametrize("edit, problem", [
    (lambda t: t.replace("| `cp` | list of int |", "| `cq` | list of int |"), "'cp'"),
    (lambda t: t.replace("| `block_size` | int | [1, 2¹⁶] |", "| `block_size` | int | ≥ 1 |",
                         1), "block_size"),
    (lambda t: t.replace("<!-- fields: plan.n -->", ""), "plan.n"),
    (lambda t: t.replace("<!-- messages: scheduler -> executor -->", ""), "scheduler -> exec"),
])
def test_a_doc_table_that_differs_from_its_declaration_is_reported(edit, problem):
    text = (ROOT / "docs/protocol.md").read_text()
    found = protocol_doc.problems(edit(text))
    assert found and any(problem in p for p in found), found


def test_the_socket_table_is_the_catalogue():
    """§2's receivers table: each row's first set (`NAME`) accepts exactly the listed types."""
    text = (ROOT / "docs/protocol.md").read_text()
    checked = set()
    for line in text.split("\n"):
        match = re.match(r"\| [^|(]*\(`([A-Z_0-9]+)`[^|]*\| ([^|]*) \|", line)
        if match:
            name, listed = match.groups()
            assert set(re.findall(r"`([a-z_]+)`", listed)) == set(getattr(m, name)), name
            checked.add(name)
    assert checked == {name for name, value in vars(m).items() if name.isupper()
                       and isinstance(value, frozenset) and value <= m.ALL_TYPES
                       and name not in ("ALL_TYPES", "CLIENT_TYPES", "KV_MAP_STATES",
                                        "RANK0_TO_RANKS", "SCHEDULER_TO_FRONTEND_HEARTBEAT")}


def test_every_message_type_is_documented():
    missing = sorted(m.ALL_TYPES - _documented())
    assert not missing, f"message types not in docs/protocol.md: {missing}"


def test_the_encoders_write_declared_fields_only():
    fields = _wire_fields()
    assert {"s", "h", "k", "n", "so", "cp"} <= fields["plan"]                 # the scan works
    declared = _all_declared_keys()
    stray = {t: sorted(keys - declared) for t, keys in fields.items() if keys - declared}
    assert not stray, f"written but not declared: {stray}"


def test_every_declared_field_is_documented():
    missing = sorted(_all_declared_keys() - _documented())
    assert not missing, f"declared fields not in docs/protocol.md: {missing}"


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
    wanted = (m.ALL_TYPES | {c.value for c in RefusalCode} | _all_declared_keys())
    assert name in wanted and name not in _documented(text)
