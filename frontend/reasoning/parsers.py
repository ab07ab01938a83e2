"""--reasoning-parser NAME: which reader splits a request's answer, and how it starts.

  qwen3         <think>…</think>; reasoning when the answer opens <think>, or when the
                generation prompt already did (Qwen3 thinking templates, SmolLM3)
  deepseek_r1   <think>…</think>; every answer is reasoning until </think> (DeepSeek-R1's
                templates open <think> in the prompt; a model that writes it is read alike)
  gpt_oss       harmony channels: analysis is the reasoning, final the answer

No parser is picked from the chat template: a template that mentions <think> does not say
the model writes it, so the server reads reasoning only when told to (as vLLM does). The
name is checked at start against the tokenizer: its marker must be one token of the
vocabulary, or the model cannot be the kind the parser reads.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from folio.frontend.reasoning.harmony import HarmonyReader
from folio.frontend.reasoning.think import END, START, ThinkReader
from folio.shared.service_settings import REASONING_PARSERS
from folio.shared.settings import SettingError

# The token each parser's model has in its vocabulary (checked at start).
_MARKERS = {"qwen3": END, "deepseek_r1": END, "gpt_oss": "<|channel|>"}
_TAIL_TOKENS = 8   # the prompt's last tokens: where a template opens <think>


def check_parser(name: str | None, tokenizer: Any) -> None:
    """Refuse (a SettingError naming --reasoning-parser, before the frontend serves) a parser
    that is unknown or whose marker this model's tokenizer lacks."""
    if name is None:
        return
    if name not in REASONING_PARSERS:
        raise SettingError("reasoning_parser", f"{name!r} is unknown; the parsers are "
                           f"{', '.join(REASONING_PARSERS)}")
    if tokenizer is None or _MARKERS[name] not in tokenizer.get_vocab():
        raise SettingError("reasoning_parser", f"{name}: this model's tokenizer has no "
                           f"{_MARKERS[name]} token, so the model does not write the "
                           "reasoning that parser reads")


def keeps_special_tokens(name: str | None) -> bool:
    """Harmony's markers are special tokens: its requests keep them in their text."""
    return name == "gpt_oss"


def prompt_opens(name: str, prompt_tail: str) -> bool:
    """Whether a generation prompt ending in `prompt_tail` left the reasoning open."""
    return name != "gpt_oss" and prompt_tail.rstrip().endswith(START)


@dataclass(frozen=True)
class Reasoning:
    """How one request's answer is split: the parser, and whether its prompt opened the
    reasoning."""

    parser: str
    opened: bool = False

    def reader(self) -> ThinkReader | HarmonyReader:
        if self.parser == "gpt_oss":
            return HarmonyReader()
        return ThinkReader(inside=self.opened or self.parser == "deepseek_r1")

    def split(self, text: str) -> tuple[str | None, str]:
        """(the reasoning, None when the answer has none; the answer) of a whole text."""
        reader = self.reader()
        first, answer = reader.feed(text)
        rest, tail = reader.finish()
        return (first + rest if reader.reasoned else None), answer + tail


def request_reasoning(parser: str | None, tokenizer: Any, prompt_ids: list[int]
                      ) -> Reasoning | None:
    """The split for a request with these prompt ids (None: its answer is read whole)."""
    if parser is None:
        return None
    tail = tokenizer.decode(prompt_ids[-_TAIL_TOKENS:], skip_special_tokens=False)
    return Reasoning(parser, prompt_opens(parser, tail))
