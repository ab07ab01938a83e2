"""Chat tool calling: `tools`, `tool_choice`, `parallel_tool_calls` -> what to render, what
to constrain, and how to read the answer back; OpenAI's message shapes both ways.

  none       tools are not rendered; the answer is text.
  auto       tools rendered through the chat template (its `tools` variable); the answer
             is parsed with the server's --tool-call-parser (frontend/openai/tool_parsers.py).
             On a template that does not render tools, the frontend renders them and the
             grammar holds the answer to one generic format (frontend/openai/generic_tools.py).
  required   the grammar forces a JSON array of one or more {"name", "parameters"} calls
             (exactly one when parallel_tool_calls is false), as vLLM does: every answer
             is a valid call of a declared tool, whatever the model or the parser. An array
             cut short by max_tokens still gives its complete calls.
  {"type": "function", "function": {"name": N}}   the grammar forces N's parameters
             object; the answer is that call's arguments.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from typing import Any

from folio.frontend.openai import generic_tools
from folio.frontend.openai.errors import ApiError, invalid
from folio.frontend.openai.structured_output import checked
from folio.frontend.openai.tool_parsers import PARSERS, Call, parse

_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
MAX_TOOLS = 128
# All tools' JSON together, measured tool by tool on the event loop and refused as soon as
# it passes: what the chat template renders and admission compiles stays bounded.
MAX_TOOLS_CHARS = 262_144
_EMPTY_PARAMETERS = {"type": "object", "properties": {}}


@dataclass(frozen=True)
class ToolPlan:
    mode: str                              # none | auto | required | named
    tools: list[dict[str, Any]] | None     # for the chat template (None: not rendered)
    spec: dict[str, Any] | None            # the grammar that enforces required / named
    named: str | None = None
    # Each tool's parameters, compiled at admission (frontend/openai/structured_output.py admit).
    schemas: tuple[tuple[dict[str, Any], str], ...] = ()
    parser: str | None = None
    parallel: bool = True
    generic: bool = False                  # the frontend renders the tools, not the template

    def messages(self, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The chat messages the template renders."""
        if not self.generic:
            return messages
        return generic_tools.with_tools(messages, self.tools, self.mode, self.named)

    @property
    def template_tools(self) -> list[dict[str, Any]] | None:
        """What goes to the template's `tools` variable."""
        return None if self.generic else self.tools

    def read(self, text: str) -> tuple[str | None, list[Call]]:
        """(content, calls) of a finished answer."""
        if self.mode == "named":
            return None, [(self.named, text)]
        if self.mode == "required":
            calls = _complete_calls(text)
            return (None, calls) if calls else (text, [])
        if self.mode == "auto" and self.generic:
            return generic_tools.parse_auto(text)
        if self.mode == "auto":
            content, calls = parse(self.parser, text)
            return content, calls if self.parallel else calls[:1]
        return text, []

    @property
    def buffers(self) -> bool:
        """Whether streamed text is held until the answer is read whole."""
        return self.mode in ("named", "required") or self.generic


def _complete_calls(text: str) -> list[Call]:
    """The calls of a `required` answer (a JSON array the grammar shaped): every complete
    one, also when max_tokens cut the array short (a model that keeps adding calls)."""
    decoder, calls = json.JSONDecoder(), []
    at = 1 if text.startswith("[") else len(text)
    while at < len(text):
        try:
            value, at = decoder.raw_decode(text, at)
        except ValueError:
            break
        if not isinstance(value, dict) or "name" not in value or "parameters" not in value:
            break
        calls.append((value["name"], json.dumps(value["parameters"], ensure_ascii=False)))
        if text[at:at + 1] != ",":
            break
        at += 1
    return calls


def _tool(value: Any) -> dict[str, Any]:
    if not isinstance(value, dict) or value.get("type", "function") != "function" \
            or not isinstance(value.get("function"), dict):
        raise invalid("tools: each tool must be {\"type\": \"function\", \"function\": "
                      "{...}}", "tools")
    function = value["function"]
    name = function.get("name")
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise invalid("tools: function.name must be 1 to 64 letters, digits, _ or -",
                      "tools")
    if not isinstance(function.get("description", ""), (str, type(None))):
        raise invalid(f"tools: {name}.description must be a string", "tools")
    parameters = function.get("parameters")
    if parameters is None:
        parameters = _EMPTY_PARAMETERS
    if not isinstance(parameters, dict):
        raise invalid(f"tools: {name}.parameters must be a JSON schema object", "tools")
    checked({"json": parameters}, "tools")   # shape and size; compiled at admission
    return {"type": "function", "function": {**function, "parameters": parameters}}


def tool_plan(body: dict[str, Any], parser: str | None, renders_tools: bool = True) -> ToolPlan:
    """`renders_tools`: whether the model's chat template reads `tools`; when it does not,
    the plan renders them itself (generic_tools)."""
    for legacy in ("functions", "function_call"):
        if body.get(legacy) is not None:
            raise ApiError(400, f"{legacy} is the deprecated form of tools / tool_choice; "
                           "send tools and tool_choice", legacy, "unsupported_parameter")
    tools = body.get("tools")
    choice = body.get("tool_choice")
    parallel = body.get("parallel_tool_calls", True)
    if parallel is None:
        parallel = True
    if not isinstance(parallel, bool):
        raise invalid("parallel_tool_calls must be a boolean", "parallel_tool_calls")
    if tools is None:
        if choice not in (None, "none"):
            raise invalid("tool_choice needs tools", "tool_choice")
        return ToolPlan("none", None, None)
    if not isinstance(tools, list) or not tools or len(tools) > MAX_TOOLS:
        raise invalid(f"tools must be a list of 1 to {MAX_TOOLS} tools", "tools")
    size = 0
    for tool in tools:
        size += len(json.dumps(tool))
        if size > MAX_TOOLS_CHARS:
            raise invalid(f"tools: their JSON is longer than {MAX_TOOLS_CHARS} characters in "
                          "all", "tools")
    tools = [_tool(t) for t in tools]
    schemas = tuple(({"json": t["function"]["parameters"]}, "tools") for t in tools)
    names = [t["function"]["name"] for t in tools]
    if len(set(names)) != len(names):
        raise invalid("tools: function names must be distinct", "tools")
    by_name = {t["function"]["name"]: t["function"] for t in tools}
    if choice is None:
        choice = "auto"
    if choice == "none":
        return ToolPlan("none", None, None)
    generic = not renders_tools
    if choice == "auto" and generic:
        return ToolPlan("auto", tools, checked({"json": generic_tools.auto_schema(
            tools, parallel)}, "tools"), parallel=parallel, schemas=schemas, generic=True)
    if choice == "auto":
        if parser is None:
            raise invalid('tool_choice "auto" needs the server started with '
                          f"--tool-call-parser ({' or '.join(PARSERS)})", "tool_choice")
        return ToolPlan("auto", tools, None, parser=parser, parallel=parallel,
                        schemas=schemas)
    if choice == "required":
        calls = [{"type": "object", "properties": {
            "name": {"const": name}, "parameters": by_name[name]["parameters"]},
            "required": ["name", "parameters"], "additionalProperties": False}
            for name in names]
        schema: dict[str, Any] = {"type": "array", "minItems": 1,
                                  "items": calls[0] if len(calls) == 1 else {"anyOf": calls}}
        if not parallel:
            schema["maxItems"] = 1
        return ToolPlan("required", tools, checked({"json": schema}, "tools"),
                        parallel=parallel, schemas=schemas, generic=generic)
    if isinstance(choice, dict) and choice.get("type") == "function" and isinstance(
            choice.get("function"), dict):
        name = choice["function"].get("name")
        if name not in by_name:
            raise invalid(f"tool_choice names the function {name!r}, which is not in tools",
                          "tool_choice")
        return ToolPlan("named", tools, {"json": by_name[name]["parameters"]}, named=name,
                        schemas=schemas, generic=generic)
    raise invalid('tool_choice must be "none", "auto", "required" or {"type": "function", '
                  '"function": {"name": ...}}', "tool_choice")


def openai_calls(calls: list[Call]) -> list[dict[str, Any]]:
    return [{"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
             "function": {"name": name, "arguments": arguments}} for name, arguments in calls]


def message_tool_calls(value: Any) -> list[dict[str, Any]]:
    """An assistant message's tool_calls, for the chat template: arguments as objects
    (templates index them), as vLLM hands them over."""
    if not isinstance(value, list):
        raise invalid("messages: tool_calls must be a list", "messages")
    result = []
    for call in value:
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise invalid("messages: each tool call needs function.name", "messages")
        arguments = function.get("arguments", "{}")
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments) if arguments.strip() else {}
            except ValueError:
                raise invalid("messages: tool call arguments must be JSON text",
                              "messages") from None
        result.append({"id": call.get("id"), "type": "function",
                       "function": {"name": function["name"], "arguments": arguments}})
    return result
