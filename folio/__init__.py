"""Folio: a paged-KV-cache LLM serving engine. One import for users."""

from folio.llm import LLM
from shared.outputs import CompletionOutput, RequestOutput
from shared.sampling_params import SamplingParams

__all__ = ["LLM", "SamplingParams", "RequestOutput", "CompletionOutput"]
