"""Tool calls parsed out of a model's text, in the formats vLLM's --tool-call-parser names.

  hermes        Hermes / Qwen: <tool_call>{"name": ..., "arguments": {...}}</tool_call>,
                any number of them, after optional free text.
  llama3_json   Llama 3.x: the whole answer is {"name": ..., "parameters": {...}}
                (optionally after <|python_tag|>), several separated by ';'.

Each parser returns (content, calls): the free text left (None when there is none) and
the calls as (name, arguments JSON text). Text that does not parse stays content, as vLLM
leaves it: a model that meant to answer in words is never turned into an error.
"""

from __future__ import annotations

import json
import re
from typing import Any

from folio.shared.service_settings import TOOL_CALL_PARSERS

Call = tuple[str, str]
PARSERS = TOOL_CALL_PARSERS   # the formats read here; --tool-call-parser's choices

HERMES_START, HERMES_END = "<tool_call>", "</tool_call>"
_HERMES_BLOCK = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|\Z)", re.DOTALL)
PYTHON_TAG = "<|python_tag|>"


def _call(value: Any, arguments_keys: tuple[str, ...]) -> Call | None:
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        return None
    arguments = next((value[k] for k in arguments_keys if k in value), {})
    if isinstance(arguments, str):   # some models write the arguments as JSON text
        return value["name"], arguments
    return value["name"], json.dumps(arguments, ensure_ascii=False)


def parse_hermes(text: str) -> tuple[str | None, list[Call]]:
    start = text.find(HERMES_START)
    if start < 0:
        return text, []
    calls = []
    for match in _HERMES_BLOCK.finditer(text, start):
        try:
            call = _call(json.loads(match.group(1)), ("arguments", "parameters"))
        except ValueError:
            call = None
        if call is None:
            return text, []   # a malformed block: the whole answer stays text
        calls.append(call)
    content = text[:start].strip()
    return content or None, calls


def parse_llama3_json(text: str) -> tuple[str | None, list[Call]]:
    body = text.strip()
    if body.startswith(PYTHON_TAG):
        body = body[len(PYTHON_TAG):].lstrip()
    if not body.startswith("{"):
        return text, []
    decoder, calls, at = json.JSONDecoder(), [], 0
    while at < len(body):
        try:
            value, at = decoder.raw_decode(body, at)
        except ValueError:
            return text, []
        call = _call(value, ("parameters", "arguments"))
        if call is None:
            return text, []
        calls.append(call)
        while at < len(body) and body[at] in " \t\r\n;":
            at += 1
    return None, calls


def parse(parser: str, text: str) -> tuple[str | None, list[Call]]:
    return {"hermes": parse_hermes, "llama3_json": parse_llama3_json}[parser](text)


def stream_holdback(parser: str, text: str) -> int:
    """Where streamed content must stop for now: the start of a (possible) tool call.
    Returns the index up to which `text` is surely content."""
    if parser == "hermes":
        start = text.find(HERMES_START)
        if start >= 0:
            return start
        # Hold back a tail that could be the beginning of "<tool_call>".
        for keep in range(min(len(HERMES_START) - 1, len(text)), 0, -1):
            if HERMES_START.startswith(text[-keep:]):
                return len(text) - keep
        return len(text)
    stripped = text.lstrip()
    if not stripped:
        return 0
    if stripped.startswith("{") or PYTHON_TAG.startswith(stripped[:len(PYTHON_TAG)]):
        return 0   # the answer is (or may be) a call: nothing streams as content
    return len(text)
