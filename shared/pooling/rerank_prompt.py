"""The prompt a decoder reranker reads: Qwen3-Reranker's, from its model card. It asks
whether the document meets the query and instruction, and the answer is scored from the
next token's "yes" and "no" logits (shared/pooling/task.py's score tokens)."""

from __future__ import annotations

DEFAULT_INSTRUCTION = "Given a web search query, retrieve relevant passages that answer the query"
_PREFIX = ("<|im_start|>system\nJudge whether the Document meets the requirements based on "
           "the Query and the Instruct provided. Note that the answer can only be \"yes\" or "
           "\"no\".<|im_end|>\n<|im_start|>user\n")
_SUFFIX = "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"


def rerank_prompt(query: str, document: str, instruction: str | None = None) -> str:
    """The whole prompt for one (query, document) pair; tokenized without special tokens
    added (it carries its own)."""
    return (f"{_PREFIX}<Instruct>: {instruction or DEFAULT_INSTRUCTION}\n<Query>: {query}\n"
            f"<Document>: {document}{_SUFFIX}")
