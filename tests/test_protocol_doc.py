"""docs/protocol.md names every message type and every field the code puts on the wire:
a message or field added without its documentation fails here."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ENCODERS = ("shared/messages.py", "shared/step.py", "shared/outputs.py")
TYPE_SETS = ("shared/messages.py", "frontend/engine_client.py", "scheduler/service.py",
             "executor/service.py")


def _documented() -> set[str]:
    return set(re.findall(r"`([^`\s]+)`", (ROOT / "docs/protocol.md").read_text()))


def _wire_types() -> set[str]:
    """Every name in a *_TYPES frozenset (what each socket accepts) and every pack("type")."""
    found: set[str] = set()
    for rel in TYPE_SETS + ENCODERS:
        for node in ast.walk(ast.parse((ROOT / rel).read_text())):
            if isinstance(node, ast.Assign) and any(
                    isinstance(t, ast.Name) and t.id.endswith("_TYPES") for t in node.targets):
                found |= {c.value for c in ast.walk(node.value)
                          if isinstance(c, ast.Constant) and isinstance(c.value, str)}
            if _is_pack(node) and isinstance(node.args[0], ast.Constant):
                found.add(node.args[0].value)
    return found


def _is_pack(node: ast.AST) -> bool:
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
            and node.func.id == "pack" and len(node.args) >= 1)


def _wire_fields() -> dict[str, set[str]]:
    """Per encoder function: the string keys of the dict literals it builds."""
    fields: dict[str, set[str]] = {}
    for rel in ENCODERS:
        for fn in ast.walk(ast.parse((ROOT / rel).read_text())):
            if not isinstance(fn, ast.FunctionDef) or not (
                    fn.name.startswith("encode") or any(_is_pack(n) for n in ast.walk(fn))):
                continue
            keys = {k.value for d in ast.walk(fn) if isinstance(d, ast.Dict)
                    for k in d.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)}
            keys |= {s.slice.value for s in ast.walk(fn) if isinstance(s, ast.Subscript)
                     and isinstance(s.ctx, ast.Store) and isinstance(s.slice, ast.Constant)
                     and isinstance(s.slice.value, str)}
            if keys:
                fields[f"{rel}:{fn.name}"] = keys
    return fields


def test_every_message_type_is_documented():
    types = _wire_types()
    assert {"plan", "result", "add", "outputs", "generate", "final"} <= types   # the scan works
    missing = sorted(types - _documented())
    assert not missing, f"message types not in docs/protocol.md: {missing}"


def test_every_field_on_the_wire_is_documented():
    fields = _wire_fields()
    assert any("encode_plan" in where for where in fields)                      # the scan works
    documented = _documented()
    missing = {where: sorted(keys - documented) for where, keys in fields.items()
               if keys - documented}
    assert not missing, f"fields not in docs/protocol.md: {missing}"


def test_every_sampling_parameter_is_documented():
    from dataclasses import fields

    from shared.sampling_params import SamplingParams

    names = {field.name for field in fields(SamplingParams)}
    assert {"temperature", "logprobs"} <= names
    missing = sorted(names - _documented())
    assert not missing, f"SamplingParams fields not in docs/protocol.md §3: {missing}"
