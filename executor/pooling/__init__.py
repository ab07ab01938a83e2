"""The executor's side of pooling requests (shared/pooling/): their hidden states pooled,
or two token logits scored, instead of a sampled token."""
