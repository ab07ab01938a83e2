"""Llama, Mistral and Qwen2 are the shared decoder with no extra options."""

from folio.executor.models.decoder import CausalLM as LlamaForCausalLM

__all__ = ["LlamaForCausalLM"]
