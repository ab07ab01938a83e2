"""Tensor parallelism: ranks, nodes, the links between them, and how weights are sharded."""
