"""The one input processor: what a client sent (text, token ids or chat messages) and its
sampling parameters, checked against the model and the limits, before a request is queued.

Used by the HTTP API (frontend/openai/completions.py), the SDK gateway (frontend/zmq_gateway.py)
and the offline API (folio/llm.py), so a bad prompt is refused with the same words whichever
door it came through. The wording of "does not fit" and "outside the vocabulary" is
shared/request_limits.py's, which the scheduler uses for its own check too (it does not
trust its peers, and knows the KV pool, which may hold less than max_model_len).

API:
- `ModelFacts(vocab_size, max_model_len, max_logprobs, max_n)`: what a request is checked
  against. An engine client's `facts` (they come with the scheduler's engine_info);
  `folio.LLM` builds its own.
- `InputError(message, param, context_length=False)`: the one error, a ValueError (a
  `PromptError`). `param` names the offending field ("prompt", "messages", "n",
  "logprobs", ...); `context_length` is True for "does not fit max_model_len" (HTTP: 400
  `context_length_exceeded`; otherwise 400 `invalid_value` with `param`). The SDK gateway
  answers it as an `invalid` error; `folio.LLM` lets it raise as the ValueError it is.
- `InputProcessor(tokenizer)`; the tokenizer may be None (`LLM(skip_tokenizer_init=True)`):
  token ids only, no stop strings. Its steps, in the order `process` runs them:
  - `check_text(chars, facts, param)`: text too long to fit max_model_len however it splits,
    refused before tokenizing (cheap: run it on the event loop first); `check_count(count,
    facts, param)` is its twin for a list of ids, before they are read one by one;
  - `tokenize(prompt=..., token_ids=..., messages=..., tools=..., param=...)`: prompt ids
    (text encoded with special tokens; chat messages through the chat template);
  - `check_prompt(ids, params, facts, param, score_only=False)`: not empty, prompt (+
    max_tokens) within max_model_len, every id in the vocabulary. `score_only`: a
    max_tokens 0 scoring request, sent on as max_tokens 1 (params.max_tokens == 1);
  - `check_params(params, facts)`: n, logprobs, stop and bias ids against the model; stop
    strings need a tokenizer;
  - `stop_tables(params)`: params.stop's matching tables (None without stops), built once
    per client request and shared by its prompts and samples.
  - `process(params, facts, *, prompt|token_ids|messages, tools, score_only, param)` runs
    them all for one prompt and returns a `ProcessedPrompt(ids, stops)`. Heavy (tokenizing,
    templates, long stops): callers with an event loop run it in the preparation pool
    (frontend/prep.py) when the input is large.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from folio.frontend.prompts import (PromptError, chat_prompt_ids, check_text_size,
                                    max_token_chars)
from folio.frontend.stop_strings import StopStrings
from folio.shared.request_limits import ids_problem, length_problem
from folio.shared.sampling_params import SamplingParams, check_against_model


@dataclass(frozen=True)
class ModelFacts:
    """What a request is checked against: the model's vocabulary and context, the engine's
    limits (as the scheduler enforces them)."""

    vocab_size: int
    max_model_len: int | None
    max_logprobs: int
    max_n: int


class InputError(PromptError):
    """A prompt or parameter that cannot be served: the message, and the field it is in."""

    def __init__(self, message: str, param: str, context_length: bool = False) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.context_length = context_length   # "does not fit max_model_len"


@dataclass(frozen=True)
class ProcessedPrompt:
    ids: list[int]
    stops: StopStrings | None   # params.stop's tables; None without stop strings


class InputProcessor:
    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        # The longest vocabulary entry, for the text-size pre-check (no tokenizer: no text).
        self.token_chars = None if tokenizer is None else max_token_chars(tokenizer)

    def check_text(self, chars: int, facts: ModelFacts, param: str = "prompt") -> None:
        """Refuse, before tokenizing it, text of `chars` characters that cannot fit."""
        if self.token_chars is None:
            return
        try:
            check_text_size(chars, facts.max_model_len, self.token_chars)
        except PromptError as error:
            raise InputError(str(error), param, context_length=True) from None

    @staticmethod
    def check_count(count: int, facts: ModelFacts, param: str = "prompt") -> None:
        """Refuse `count` prompt ids more than max_model_len before looking at each (a
        message of millions of ids costs no more than its length)."""
        if facts.max_model_len is not None and count > facts.max_model_len:
            raise InputError(length_problem(count, None, facts.max_model_len), param,
                             context_length=True)

    def tokenize(self, *, prompt: str | None = None, token_ids: list[int] | None = None,
                 messages: list[dict[str, Any]] | None = None,
                 tools: list[dict[str, Any]] | None = None, param: str | None = None,
                 template_kwargs: dict[str, Any] | None = None) -> list[int]:
        """The prompt ids of one prompt: chat messages (through the template, with `tools`),
        else text (special tokens added), else the ids as given."""
        param = param or ("messages" if messages is not None else "prompt")
        if messages is not None or prompt is not None:
            if self.tokenizer is None:
                raise InputError("text prompts need a tokenizer; this engine has none "
                                 "(skip_tokenizer_init=True), so pass token ids", param)
            if messages is not None:
                try:
                    return chat_prompt_ids(self.tokenizer, messages, tools, template_kwargs)
                except PromptError as error:
                    raise InputError(str(error), param) from None
            return self.tokenizer.encode(prompt, add_special_tokens=True)
        return list(token_ids or [])

    def check_prompt(self, ids: list[int], params: SamplingParams, facts: ModelFacts,
                     param: str = "prompt", score_only: bool = False) -> None:
        """Prompt ids that can run: not empty, within max_model_len with room for
        params.max_tokens (a score-only request's one position), ids in the vocabulary."""
        if not ids:
            raise InputError(ids_problem(ids, facts.vocab_size), param)
        problem = length_problem(len(ids), params.max_tokens, facts.max_model_len,
                                 score_only=score_only)
        if problem is not None:
            raise InputError(problem, param, context_length=True)
        problem = ids_problem(ids, facts.vocab_size)
        if problem is not None:
            raise InputError(problem, param)

    def check_params(self, params: SamplingParams, facts: ModelFacts) -> None:
        """Parameters the model bounds (n, logprobs, stop and bias ids); stop strings need
        a tokenizer to be matched."""
        try:
            check_against_model(params, facts.vocab_size, facts.max_logprobs, facts.max_n)
        except ValueError as error:
            # Its messages start with the parameter's name.
            raise InputError(str(error), str(error).split(" ", 1)[0]) from None
        if params.stop and self.tokenizer is None:
            raise InputError("stop strings need a tokenizer; this engine has none "
                             "(skip_tokenizer_init=True)", "stop")

    @staticmethod
    def stop_tables(params: SamplingParams) -> StopStrings | None:
        return StopStrings(params.stop) if params.stop else None

    def process(self, params: SamplingParams, facts: ModelFacts, *, prompt: str | None = None,
                token_ids: list[int] | None = None,
                messages: list[dict[str, Any]] | None = None,
                tools: list[dict[str, Any]] | None = None, score_only: bool = False,
                param: str | None = None) -> ProcessedPrompt:
        """One prompt, every check, in order; InputError names what is wrong."""
        param = param or ("messages" if messages is not None else "prompt")
        chars = len(prompt or "") + sum(len(message.get("content") or "")
                                        for message in messages or ())
        self.check_text(chars, facts, param)
        ids = self.tokenize(prompt=prompt, token_ids=token_ids, messages=messages,
                            tools=tools, param=param)
        self.check_prompt(ids, params, facts, param, score_only)
        self.check_params(params, facts)
        return ProcessedPrompt(ids, self.stop_tables(params))
