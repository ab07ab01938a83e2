"""The structured-output fields of a request -> one spec (shared/structured_output.py).

Accepted, each naming the field in a 400 when it is wrong:
  response_format   {"type": "json_object"} | {"type": "json_schema", "json_schema":
                    {"name", "schema", "strict", "description"}}   (both routes)
  structured_outputs  vLLM's: exactly one of json, regex, choice, grammar, json_object
  guided_json, guided_regex, guided_choice, guided_grammar   vLLM's older names
  guided_decoding_backend   only a name for llguidance ("auto", "guidance", "llguidance")
At most one of them may ask for a constraint. Its shape and size are checked here, on the
event loop (cheap); `admit` then compiles and measures it off the loop, within the grammar
budget (frontend/structured_output_admission.py), and refuses a bad, empty or too costly one before
anything is queued.
"""

from __future__ import annotations

import re
from typing import Any

from folio.frontend.openai.errors import ApiError, invalid
from folio.frontend.structured_output_admission import GrammarAdmission
from folio.shared.structured_output import KINDS, check_spec

GUIDED = {"guided_json": "json", "guided_regex": "regex", "guided_choice": "choice",
          "guided_grammar": "grammar"}
BACKENDS = (None, "auto", "guidance", "llguidance")
# vLLM's structured_outputs options Folio does not have (its JSON is always compact).
_STRUCTURED_EXTRAS = {"disable_fallback", "disable_any_whitespace",
                      "disable_additional_properties", "whitespace_pattern", "structural_tag",
                      "backend"}


def _refuse(field: str, message: str) -> ApiError:
    return invalid(f"{field}: {message}", field)


def _from_response_format(value: Any) -> dict[str, Any] | None:
    field = "response_format"
    if value is None:
        return None
    if not isinstance(value, dict) or not isinstance(value.get("type"), str):
        raise _refuse(field, "must be an object with a 'type' (text, json_object or "
                      "json_schema)")
    kind = value["type"]
    if kind == "text":
        return None
    if kind == "json_object":
        return {"json_object": True}
    if kind != "json_schema":
        raise ApiError(400, f"{field}: type {kind!r} is not supported; use text, "
                       "json_object or json_schema", field, "unsupported_value")
    spec = value.get("json_schema")
    if not isinstance(spec, dict):
        raise _refuse(field, "json_schema must be an object with a 'name' and a 'schema'")
    name = spec.get("name")
    if name is not None and (not isinstance(name, str) or not re.fullmatch(
            r"[A-Za-z0-9_-]{1,64}", name)):
        raise _refuse(field, "json_schema.name must be 1 to 64 letters, digits, _ or -")
    if not isinstance(spec.get("strict", False), (bool, type(None))):
        raise _refuse(field, "json_schema.strict must be a boolean")
    schema = spec.get("schema", {"type": "object"})   # OpenAI: no schema, any object
    if not isinstance(schema, dict):
        raise _refuse(field, "json_schema.schema must be an object (a JSON schema)")
    # strict or not, the schema is enforced: the grammar allows nothing else.
    return {"json": schema}


def _from_structured_outputs(value: Any) -> dict[str, Any] | None:
    field = "structured_outputs"
    if value is None:
        return None
    if not isinstance(value, dict):
        raise _refuse(field, f"must be an object with one of {', '.join(KINDS)}")
    extras = sorted(k for k in value if k not in KINDS and value[k] not in (None, False))
    for key in extras:
        if key in _STRUCTURED_EXTRAS:
            if key == "backend" and value[key] in BACKENDS:
                continue
            raise ApiError(400, f"{field}.{key} is not supported by this server (its JSON "
                           "is always compact, through llguidance)", field,
                           "unsupported_parameter")
        raise _refuse(field, f"unknown key {key!r}; expected one of {', '.join(KINDS)}")
    chosen = {k: v for k, v in value.items() if k in KINDS and v is not None
              and v is not False}
    if len(chosen) != 1:
        raise _refuse(field, f"needs exactly one of {', '.join(KINDS)}, got "
                      f"{len(chosen)}")
    return chosen


def structured_spec(body: dict[str, Any]) -> tuple[dict[str, Any], str] | None:
    """The request's one structured-output spec and the field it came from, its shape
    checked (not yet compiled: `admit`), or None when nothing is asked for."""
    backend = body.get("guided_decoding_backend")
    if backend not in BACKENDS:
        raise ApiError(400, f"guided_decoding_backend {backend!r} is not available; this "
                       "server's structured outputs run on llguidance",
                       "guided_decoding_backend", "unsupported_value")
    if body.get("guided_whitespace_pattern") is not None:
        raise ApiError(400, "guided_whitespace_pattern is not supported: JSON output is "
                       "always compact", "guided_whitespace_pattern", "unsupported_parameter")
    found: list[tuple[dict[str, Any], str]] = []
    spec = _from_response_format(body.get("response_format"))
    if spec is not None:
        found.append((spec, "response_format"))
    spec = _from_structured_outputs(body.get("structured_outputs"))
    if spec is not None:
        found.append((spec, "structured_outputs"))
    for field, kind in GUIDED.items():
        if body.get(field) is not None:
            found.append(({kind: body[field]}, field))
    if not found:
        return None
    if len(found) > 1:
        names = " and ".join(field for _, field in found)
        raise invalid(f"{names}: ask for one structured output, not several", found[1][1])
    spec, field = found[0]
    return checked(spec, field), field


def checked(spec: dict[str, Any], field: str) -> dict[str, Any]:
    """The spec's shape and size checked; a 400 naming `field` when either is wrong."""
    try:
        return check_spec(spec)
    except (TypeError, ValueError) as error:
        message = str(error).replace("structured_output ", "", 1)
        raise _refuse(field, message) from None


async def admit(grammars: GrammarAdmission, enforced: tuple[dict[str, Any], str] | None,
                compiled: tuple[tuple[dict[str, Any], str], ...] = ()) -> None:
    """Off the event loop: the enforced spec must compile, match some output and stay
    within the grammar budget; each of `compiled` (tools the answer may call, not
    enforced) must compile. A 400 naming the field otherwise."""
    if compiled:
        error = await grammars.check([spec for spec, _ in compiled], walk=False)
        if error is not None:
            raise _refuse(compiled[0][1], error)
    if enforced is not None:
        spec, field = enforced
        error = await grammars.check([spec])
        if error is not None:
            raise _refuse(field, error)
