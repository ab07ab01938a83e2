"""Speculative decoding on the executor: drafts proposed, verified, accepted."""
