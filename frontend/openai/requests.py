"""OpenAI request bodies as typed requests, each parsed and checked once, at the edge.

`CompletionRequest.parse` and `ChatRequest.parse` (and the /tokenize and /detokenize
bodies) take the JSON object a client sent and either refuse it with a 400 naming the
field (frontend/openai/errors.py) or return a frozen request whose fields the rest of the
HTTP path reads: every field is honoured or refused by name (frontend/openai/route_fields.py).
The engine's SamplingParams are built here too (`params`: vLLM's `to_sampling_params()`),
since building them is what checks their values.

What only the engine knows is checked later, in frontend/openai/completions.py: the prompt's
tokens against the model and its limits (frontend/input_processor.py), and a structured
output's grammar, compiled off the event loop within the grammar budget.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from folio.frontend.openai.errors import invalid
from folio.frontend.openai.route_fields import (CHAT_FIELDS, COMPLETION_FIELDS, DETOKENIZE_FIELDS,
                                          TOKENIZE_FIELDS, check_fields)
from folio.frontend.openai.field_parsers import (StreamOptions, chat_messages, completion_prompts,
                                            sampling_params, stream_options)
from folio.frontend.openai.structured_output import structured_spec
from folio.frontend.openai.tool_calls import ToolPlan, tool_plan
from folio.frontend.reasoning.parsers import keeps_special_tokens
from folio.frontend.reasoning.request_fields import template_kwargs
from folio.shared.sampling_params import SamplingParams

MAX_DEADLINE_S = 86400
# A structured-output spec and the request field it came from (named in its errors).
Constraint = tuple[dict[str, Any], str]


@dataclass(frozen=True)
class ServerTerms:
    """What parsing a body needs from the server: the engine's max_logprobs (from the
    scheduler's engine_info), the --tool-call-parser and whether the chat template renders
    tools (else the frontend does, frontend/openai/generic_tools.py), the
    --reasoning-parser."""

    max_logprobs: int
    tool_parser: str | None = None
    renders_tools: bool = True
    reasoning_parser: str | None = None   # --reasoning-parser (frontend/reasoning/)


@dataclass(frozen=True)
class CompletionRequest:
    """POST /v1/completions. `score_only`: max_tokens 0 with echo, scored and sent on as
    max_tokens 1 (`params`), its one sampled token dropped."""

    prompts: list[str | list[int]]
    params: SamplingParams          # structured output and prompt log-probs included
    stream: StreamOptions
    echo: bool
    logprobs: int | None
    score_only: bool
    constraint: Constraint | None   # to admit (compile, measure) before anything is queued
    deadline: float | None
    client: str | None = None       # who sent it (frontend/http/access.py client_of)

    @property
    def generated_tokens(self) -> int:
        """At most how many tokens each choice brings back."""
        return 0 if self.score_only else self.params.max_tokens

    @classmethod
    def parse(cls, body: dict[str, Any], terms: ServerTerms) -> CompletionRequest:
        check_fields(body, COMPLETION_FIELDS, "/v1/completions")
        stream = stream_options(body)
        logprobs = body.get("logprobs")
        if logprobs is not None and (isinstance(logprobs, bool)
                                     or not isinstance(logprobs, int)
                                     or not 0 <= logprobs <= terms.max_logprobs):
            raise invalid(f"logprobs must be an integer in [0, {terms.max_logprobs}]",
                          "logprobs")
        echo = body.get("echo", False)
        if not isinstance(echo, bool):
            raise invalid("echo must be a boolean", "echo")
        if echo and stream.stream:
            raise invalid("echo is not supported with stream", "echo")
        score_only = _score_only(body, echo)
        # Scoring runs as max_tokens 1 and drops the sampled token: prompt log-probs come
        # from the prefill's raw logits, which the sampled token cannot change.
        params = sampling_params({**body, "max_tokens": 1} if score_only else body,
                                 "max_tokens", logprobs)
        if echo and logprobs is not None:
            params = replace(params, prompt_logprobs=logprobs)
        constraint = structured_spec(body)
        if constraint is not None:
            if score_only:
                raise invalid("max_tokens 0 generates nothing to constrain; drop "
                              f"{constraint[1]} or ask for tokens", constraint[1])
            params = replace(params, structured_output=constraint[0])
        return cls(completion_prompts(body.get("prompt")), params, stream, echo, logprobs,
                   score_only, constraint, _deadline(body))


@dataclass(frozen=True)
class ChatRequest:
    """POST /v1/chat/completions. `constraint`: what the answer is held to, a required or
    named tool call's grammar or a structured output (never both)."""

    messages: list[dict[str, Any]]
    params: SamplingParams          # structured output included
    stream: StreamOptions
    tools: ToolPlan
    constraint: Constraint | None
    deadline: float | None
    client: str | None = None       # who sent it (frontend/http/access.py client_of)
    # The parser that splits the answer (None: no reasoning read: no --reasoning-parser, or
    # a grammar holds the whole answer) and the template variables it asked for.
    reasoning_parser: str | None = None
    template_kwargs: dict[str, Any] = field(default_factory=dict)

    @property
    def chars(self) -> int:
        return sum(len(message["content"]) + len(message.get("reasoning_content") or "")
                   for message in self.messages)

    @classmethod
    def parse(cls, body: dict[str, Any], terms: ServerTerms) -> ChatRequest:
        check_fields(body, CHAT_FIELDS, "/v1/chat/completions")
        stream = stream_options(body)
        want_logprobs = body.get("logprobs", False)
        if not isinstance(want_logprobs, bool):
            raise invalid("logprobs must be a boolean", "logprobs")
        top = body.get("top_logprobs")
        if top is not None:
            if isinstance(top, bool) or not isinstance(top, int) \
                    or not 0 <= top <= terms.max_logprobs:
                raise invalid(f"top_logprobs must be an integer in [0, {terms.max_logprobs}]",
                              "top_logprobs")
            if not want_logprobs:
                raise invalid("top_logprobs needs logprobs set to true", "top_logprobs")
        params = sampling_params(body, "max_completion_tokens",
                                 (top or 0) if want_logprobs else None)
        _check_tool_choice(body.get("tool_choice"))
        tools = tool_plan(body, terms.tool_parser, terms.renders_tools)
        structured = structured_spec(body)
        if tools.spec is not None and structured is not None:
            raise invalid(f"{structured[1]}: tool_choice {tools.mode} already constrains the "
                          "answer (to tool calls); send one or the other", structured[1])
        constraint = (tools.spec, "tools") if tools.spec is not None else structured
        if constraint is not None:
            params = replace(params, structured_output=constraint[0])
        parser = terms.reasoning_parser
        kwargs = template_kwargs(body, parser, constraint and constraint[1])
        if constraint is not None:
            parser = None   # the grammar's answer is the answer, whole
        if keeps_special_tokens(parser):
            params = replace(params, skip_special_tokens=False)
        return cls(chat_messages(body.get("messages")), params, stream, tools, constraint,
                   _deadline(body), reasoning_parser=parser, template_kwargs=kwargs)


@dataclass(frozen=True)
class TokenizeRequest:
    """POST /tokenize, vLLM's body: a prompt, or chat messages through the template."""

    prompt: str | None
    messages: list[dict[str, Any]] | None
    add_special_tokens: bool
    add_generation_prompt: bool
    return_token_strs: bool

    @property
    def field(self) -> str:
        return "prompt" if self.messages is None else "messages"

    @property
    def chars(self) -> int:
        if self.messages is None:
            return len(self.prompt or "")
        return sum(len(message["content"]) + len(message.get("reasoning_content") or "")
                   for message in self.messages)

    @classmethod
    def parse(cls, body: dict[str, Any]) -> TokenizeRequest:
        check_fields(body, TOKENIZE_FIELDS, "/tokenize")
        if "prompt" in body and "messages" in body:
            raise invalid("send either prompt or messages, not both", "messages")
        if "messages" in body:
            messages = chat_messages(body["messages"])
            # vLLM's defaults: the template adds the special tokens it wants.
            generation_prompt = _flag(body, "add_generation_prompt", True)
            return cls(None, messages, _flag(body, "add_special_tokens", False),
                       generation_prompt, _flag(body, "return_token_strs", False))
        prompt = body.get("prompt")
        if not isinstance(prompt, str):
            raise invalid("prompt must be a string (or send messages)", "prompt")
        if "add_generation_prompt" in body:
            raise invalid("add_generation_prompt applies to messages only",
                          "add_generation_prompt")
        return cls(prompt, None, _flag(body, "add_special_tokens", True), False,
                   _flag(body, "return_token_strs", False))


@dataclass(frozen=True)
class DetokenizeRequest:
    """POST /detokenize: token ids back to text."""

    tokens: list[int]

    @classmethod
    def parse(cls, body: dict[str, Any]) -> DetokenizeRequest:
        check_fields(body, DETOKENIZE_FIELDS, "/detokenize")
        tokens = body.get("tokens")
        if not isinstance(tokens, list) or not all(
                isinstance(t, int) and not isinstance(t, bool) for t in tokens):
            raise invalid("tokens must be a list of token ids", "tokens")
        return cls(tokens)


def _score_only(body: dict[str, Any], echo: bool) -> bool:
    """max_tokens 0 (with echo): score the prompt, generate nothing, as vLLM does."""
    if type(body.get("max_tokens")) is not int or body["max_tokens"] != 0:
        return False
    if not echo:
        raise invalid("max_tokens must be >= 1; 0 is allowed with echo (score the prompt "
                      "only)", "max_tokens")
    if body.get("min_tokens"):
        raise invalid("min_tokens must be 0 when max_tokens is 0", "min_tokens")
    return True


def _deadline(body: dict[str, Any]) -> float | None:
    """Folio's extra body field: seconds after which the server aborts the request."""
    value = body.get("deadline")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
            0 < value <= MAX_DEADLINE_S):
        raise invalid(f"deadline must be a number of seconds in (0, {MAX_DEADLINE_S}]",
                      "deadline")
    return float(value)


def _check_tool_choice(choice: Any) -> None:
    """The named form's name is a string before tool_plan looks it up (a list there is
    unhashable: a TypeError, not the 400 it deserves)."""
    if isinstance(choice, dict) and isinstance(choice.get("function"), dict) \
            and not isinstance(choice["function"].get("name"), str):
        raise invalid("tool_choice.function.name must be a string (a function in tools)",
                      "tool_choice")


def _flag(body: dict[str, Any], name: str, default: bool) -> bool:
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise invalid(f"{name} must be a boolean", name)
    return value
