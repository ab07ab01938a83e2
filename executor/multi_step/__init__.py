"""Multi-step decoding (docs/multi_step.md): a small batch of decode rows runs several
forward passes per plan, so the control processes wake once per burst, not once a token."""
