"""Folio: a paged-KV-cache LLM serving engine. One import for users."""

from folio.client import AsyncClient, Client, Completion, Delta
from folio.llm import LLM
from shared.outputs import CompletionOutput, RequestOutput
from shared.sampling_params import SamplingParams

__all__ = ["LLM", "Client", "AsyncClient", "SamplingParams", "RequestOutput",
           "CompletionOutput", "Completion", "Delta"]
