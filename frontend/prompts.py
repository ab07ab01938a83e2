"""Text and chat messages to prompt ids, and the text-size bound; frontend/input_processor.py
runs them with the checks."""

from __future__ import annotations

from typing import Any


class PromptError(ValueError):
    """A prompt that cannot be served; the message names the problem and the limit."""


def chat_prompt_ids(tokenizer: Any, messages: list[dict[str, Any]],
                    tools: list[dict[str, Any]] | None = None,
                    template_kwargs: dict[str, Any] | None = None) -> list[int]:
    """`tools` (OpenAI's tool objects) go to the template's `tools` variable; a template that
    never reads it would drop them silently, so that is refused. `template_kwargs`: the
    variables frontend/reasoning/request_fields.py allows (enable_thinking, ...)."""
    template = getattr(tokenizer, "chat_template", None)
    if not template:
        raise PromptError("this model's tokenizer has no chat template; send a prompt")
    if tools and "tools" not in (template if isinstance(template, str) else str(template)):
        raise PromptError("this model's chat template does not render tools")
    try:
        ids = tokenizer.apply_chat_template(messages, tools=tools or None,
                                            add_generation_prompt=True, tokenize=True,
                                            **(template_kwargs or {}))
    except Exception as error:   # template errors come from jinja as many types
        raise PromptError(f"chat template failed: {error}") from None
    if hasattr(ids, "keys"):
        ids = ids["input_ids"]
    return list(ids)


def max_token_chars(tokenizer: Any) -> int:
    """An upper bound on the characters one token decodes to: its longest vocabulary entry
    (byte-level and SentencePiece entries are at least as long as what they decode to)."""
    return max(map(len, tokenizer.get_vocab()), default=1)


def check_text_size(chars: int, max_model_len: int | None, token_chars: int) -> None:
    """Refuse, before tokenizing it, text too long to fit max_model_len however it splits
    (with a factor 2 to spare normalizers that shrink text): a megabyte prompt for a short
    context costs no tokenizer time."""
    if max_model_len is not None and chars > 2 * max_model_len * token_chars:
        raise PromptError(f"prompt of {chars} characters cannot fit this model's maximum "
                          f"context length max_model_len = {max_model_len} tokens (a token "
                          f"here is at most {token_chars} characters)")
