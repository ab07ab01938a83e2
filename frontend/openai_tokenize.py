"""POST /tokenize and /detokenize with vLLM's bodies: the model's own tokenizer (and chat
template) as the completion routes use it, so a client can count tokens before it asks."""

from __future__ import annotations

from typing import Any

from folio.frontend.engine_client import EngineClient
from folio.frontend.openai_fields import DETOKENIZE_FIELDS, TOKENIZE_FIELDS, check_fields
from folio.frontend.openai_protocol import chat_messages, invalid, too_long
from folio.frontend.prompts import PromptError


def _flag(body: dict[str, Any], name: str, default: bool) -> bool:
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise invalid(f"{name} must be a boolean", name)
    return value


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


async def tokenize(engine: EngineClient, body: dict[str, Any]) -> dict[str, Any]:
    check_fields(body, TOKENIZE_FIELDS, "/tokenize")
    tokenizer = engine.tokenizer
    if "prompt" in body and "messages" in body:
        raise invalid("send either prompt or messages, not both", "messages")
    if "messages" in body:
        messages = chat_messages(body["messages"])
        chars = sum(len(message["content"]) for message in messages)
        field = "messages"
        # vLLM's defaults: the template adds the special tokens it wants.
        work = (_chat_ids, tokenizer, messages, _flag(body, "add_generation_prompt", True),
                _flag(body, "add_special_tokens", False))
    else:
        prompt = body.get("prompt")
        if not isinstance(prompt, str):
            raise invalid("prompt must be a string (or send messages)", "prompt")
        if "add_generation_prompt" in body:
            raise invalid("add_generation_prompt applies to messages only",
                          "add_generation_prompt")
        chars, field = len(prompt), "prompt"
        work = (_encode, tokenizer, prompt, _flag(body, "add_special_tokens", True))
    try:
        engine.check_text_size(chars)
    except ValueError as error:
        raise too_long(str(error), field) from None
    try:
        ids = list(await engine.prep.run(chars, *work))
    except PromptError as error:
        raise invalid(str(error), field) from None
    answer: dict[str, Any] = {"count": len(ids), "max_model_len": engine.max_model_len,
                              "tokens": ids}
    if _flag(body, "return_token_strs", False):
        answer["token_strs"] = tokenizer.convert_ids_to_tokens(ids)
    return answer


def _encode(tokenizer: Any, prompt: str, special: bool) -> list[int]:
    return tokenizer.encode(prompt, add_special_tokens=special)


async def detokenize(engine: EngineClient, body: dict[str, Any]) -> dict[str, Any]:
    check_fields(body, DETOKENIZE_FIELDS, "/detokenize")
    tokens = body.get("tokens")
    if not isinstance(tokens, list) or not all(
            isinstance(t, int) and not isinstance(t, bool) for t in tokens):
        raise invalid("tokens must be a list of token ids", "tokens")
    bad = next((t for t in tokens if not 0 <= t < engine.vocab_size), None)
    if bad is not None:
        raise invalid(f"token id {bad} is outside the vocabulary [0, {engine.vocab_size})",
                      "tokens")
    text = await engine.prep.run(len(tokens), engine.tokenizer.decode, tokens)
    return {"prompt": text}
