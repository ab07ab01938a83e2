"""POST /tokenize and /detokenize with vLLM's bodies: the model's own tokenizer (and chat
template) as the completion routes use it, so a client can count tokens before it asks."""

from __future__ import annotations

from typing import Any

from folio.frontend.openai.errors import invalid, too_long
from folio.frontend.engine_api import Engine
from folio.frontend.input_processor import InputError
from folio.frontend.openai.requests import DetokenizeRequest, TokenizeRequest
from folio.frontend.prompts import PromptError


def _chat_ids(tokenizer: Any, messages: list[dict[str, str]], generation_prompt: bool,
              special: bool) -> list[int]:
    if not getattr(tokenizer, "chat_template", None):
        raise PromptError("this model's tokenizer has no chat template; send a prompt")
    try:
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=generation_prompt,
                                             tokenize=False)
    except Exception as error:   # template errors come from jinja as many types
        raise PromptError(f"chat template failed: {error}") from None
    return tokenizer.encode(text, add_special_tokens=special)


def _encode(tokenizer: Any, prompt: str, special: bool) -> list[int]:
    return tokenizer.encode(prompt, add_special_tokens=special)


async def tokenize(engine: Engine, request: TokenizeRequest) -> dict[str, Any]:
    tokenizer = engine.tokenizer
    if request.messages is not None:
        work = (_chat_ids, tokenizer, request.messages, request.add_generation_prompt,
                request.add_special_tokens)
    else:
        work = (_encode, tokenizer, request.prompt, request.add_special_tokens)
    try:
        engine.inputs.check_text(request.chars, engine.facts, request.field)
    except InputError as error:
        raise too_long(error.message, error.param) from None
    try:
        ids = list(await engine.prep.run(request.chars, *work))
    except PromptError as error:
        raise invalid(str(error), request.field) from None
    answer: dict[str, Any] = {"count": len(ids), "max_model_len": engine.max_model_len,
                              "tokens": ids}
    if request.return_token_strs:
        answer["token_strs"] = tokenizer.convert_ids_to_tokens(ids)
    return answer


async def detokenize(engine: Engine, request: DetokenizeRequest) -> dict[str, Any]:
    tokens = request.tokens
    bad = next((t for t in tokens if not 0 <= t < engine.vocab_size), None)
    if bad is not None:
        raise invalid(f"token id {bad} is outside the vocabulary [0, {engine.vocab_size})",
                      "tokens")
    text = await engine.prep.run(len(tokens), engine.tokenizer.decode, tokens)
    return {"prompt": text}
