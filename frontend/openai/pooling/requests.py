"""The pooling endpoints' bodies, parsed once: each field honoured or refused by name."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from folio.frontend.openai.errors import invalid

MAX_INPUTS = 2048   # OpenAI's limit on one embeddings request's inputs (and documents)
ENCODING_FORMATS = ("float", "base64")


def _only(body: dict[str, Any], known: tuple[str, ...], route: str) -> None:
    unknown = sorted(set(body) - set(known))
    if unknown:
        raise invalid(f"{route} does not support the field(s) {', '.join(unknown)}",
                      unknown[0])


def _text(value: Any, name: str) -> str:
    if not isinstance(value, str) or not value:
        raise invalid(f"{name} must be a non-empty string", name)
    return value


def _token_ids(value: list, name: str) -> list[int]:
    if not value or not all(isinstance(t, int) and not isinstance(t, bool) for t in value):
        raise invalid(f"{name} must be a non-empty array of token ids (integers)", name)
    return value


def _inputs(value: Any) -> list[str | list[int]]:
    """OpenAI's `input`: a string, an array of strings, an array of token ids, or an array
    of arrays of token ids; each item is one input."""
    if isinstance(value, str):
        return [_text(value, "input")]
    if not isinstance(value, list) or not value:
        raise invalid("input must be a non-empty string, array of strings, array of token "
                      "ids or array of arrays of token ids", "input")
    if len(value) > MAX_INPUTS:
        raise invalid(f"input takes at most {MAX_INPUTS} items, got {len(value)}", "input")
    if all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        return [value]
    items: list[str | list[int]] = []
    for item in value:
        if isinstance(item, str):
            items.append(_text(item, "input"))
        elif isinstance(item, list):
            items.append(_token_ids(item, "input"))
        else:
            raise invalid("input items must be strings or arrays of token ids", "input")
    return items


@dataclass(frozen=True)
class EmbeddingRequest:
    inputs: list[str | list[int]]
    encoding_format: str
    dimensions: int | None

    @classmethod
    def parse(cls, body: dict[str, Any]) -> "EmbeddingRequest":
        _only(body, ("input", "model", "encoding_format", "dimensions", "user"),
              "/v1/embeddings")
        if "input" not in body:
            raise invalid("input is required", "input")
        encoding = body.get("encoding_format") or "float"
        if encoding not in ENCODING_FORMATS:
            raise invalid(f"encoding_format must be one of {', '.join(ENCODING_FORMATS)}, "
                          f"got {encoding!r:.40}", "encoding_format")
        dimensions = body.get("dimensions")
        if dimensions is not None and (isinstance(dimensions, bool)
                                       or not isinstance(dimensions, int) or dimensions < 1):
            raise invalid("dimensions must be a positive integer", "dimensions")
        if body.get("user") is not None and not isinstance(body["user"], str):
            raise invalid("user must be a string", "user")
        return cls(_inputs(body["input"]), encoding, dimensions)


def _documents(value: Any) -> list[str]:
    """Jina's and Cohere's documents: strings, or objects with a `text` (Cohere's v1)."""
    if not isinstance(value, list) or not value:
        raise invalid("documents must be a non-empty array of strings", "documents")
    if len(value) > MAX_INPUTS:
        raise invalid(f"documents takes at most {MAX_INPUTS} items, got {len(value)}",
                      "documents")
    texts = []
    for item in value:
        if isinstance(item, dict) and set(item) == {"text"}:
            item = item["text"]
        texts.append(_text(item, "documents"))
    return texts


@dataclass(frozen=True)
class RerankRequest:
    query: str
    documents: list[str]
    top_n: int | None
    return_documents: bool
    instruction: str | None

    @classmethod
    def parse(cls, body: dict[str, Any]) -> "RerankRequest":
        _only(body, ("query", "documents", "top_n", "return_documents", "model",
                     "instruction"), "/v1/rerank")
        top_n = body.get("top_n")
        if top_n is not None and (isinstance(top_n, bool) or not isinstance(top_n, int)
                                  or top_n < 1):
            raise invalid("top_n must be a positive integer", "top_n")
        returned = body.get("return_documents", True)
        if not isinstance(returned, bool):
            raise invalid("return_documents must be a boolean", "return_documents")
        instruction = body.get("instruction")
        if instruction is not None:
            _text(instruction, "instruction")
        return cls(_text(body.get("query"), "query"), _documents(body.get("documents")),
                   top_n, returned, instruction)


@dataclass(frozen=True)
class ScoreRequest:
    """vLLM's /v1/score: text_1 against each text_2 (one text_1 and many text_2, or lists
    of the same length, paired in order)."""

    pairs: list[tuple[str, str]]
    instruction: str | None

    @classmethod
    def parse(cls, body: dict[str, Any]) -> "ScoreRequest":
        _only(body, ("text_1", "text_2", "model", "instruction"), "/v1/score")
        first, second = body.get("text_1"), body.get("text_2")
        firsts = [first] if isinstance(first, str) else first
        seconds = [second] if isinstance(second, str) else second
        for name, texts in (("text_1", firsts), ("text_2", seconds)):
            if not isinstance(texts, list) or not texts or len(texts) > MAX_INPUTS:
                raise invalid(f"{name} must be a non-empty string or an array of at most "
                              f"{MAX_INPUTS} strings", name)
            for text in texts:
                _text(text, name)
        if len(firsts) == 1:
            firsts = firsts * len(seconds)
        if len(firsts) != len(seconds):
            raise invalid(f"text_1 has {len(firsts)} texts and text_2 {len(seconds)}: give "
                          "one text_1, or as many as text_2", "text_2")
        instruction = body.get("instruction")
        if instruction is not None:
            _text(instruction, "instruction")
        return cls(list(zip(firsts, seconds)), instruction)
