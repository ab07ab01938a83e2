"""Owns tensors: weights, the paged KV cache and the forward pass. Decides nothing."""
