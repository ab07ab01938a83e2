"""Tensor parallelism inside one executor: the torch.distributed group, each weight's
sharding rule, and the model's communication points.

Every rank builds the model from its share of the config (executor/parallel/rules.py) and loads
only its slice of each checkpoint tensor as it streams in (`shard`). The communication
points are added to the shared decoder from outside (`parallelize`): an all-reduce after
each attention block (o_proj is row-parallel) and each MLP (down_proj), a vocab-parallel
embedding (each rank looks up its rows, one all-reduce) and a vocab-parallel lm_head (each
rank computes its logits, one all-gather). Row-parallel biases are added once: rank 0
holds them, the others zeros.

Every rank runs the same step on the same plan (executor/parallel/group.py hands rank 0's plans
to the others) and gets the same full logits, so each samples the same tokens (the
sampler's generators are seeded alike) and their persistent batches stay in step without a
token broadcast; rank 0 alone replies to the scheduler.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from folio.executor.model_config import ModelConfig
from folio.executor.parallel.rules import kv_heads_of, shard_config, vocab_rows

# Ranks wait for the next plan inside a collective for as long as the server is idle.
IDLE_TIMEOUT = datetime.timedelta(days=365)
_ROW_PARALLEL = (".self_attn.o_proj.", ".mlp.down_proj.")


def row_parallel(param_name: str) -> bool:
    """Whether the parameter is split by input columns (o and down; the rest of the
    attention and MLP by output rows)."""
    return any(key in param_name for key in _ROW_PARALLEL)


@dataclass(frozen=True)
class TPConfig:
    size: int
    rank: int
    init_address: str        # tcp://host:port of rank 0's rendezvous
    backend: str             # "gloo" (CPU) or "nccl" (CUDA)
    local_rank: int = 0      # the rank's place on its node: its GPU


class TensorParallel:
    def __init__(self, config: TPConfig) -> None:
        self.config = config
        self.size, self.rank = config.size, config.rank
        if config.backend == "nccl":
            torch.cuda.set_device(config.local_rank)
        dist.init_process_group(config.backend, init_method=config.init_address,
                                rank=config.rank, world_size=config.size,
                                timeout=IDLE_TIMEOUT)
        # Counts agreed at start-up travel on the CPU: a gloo group beside NCCL's.
        self.control = None if config.backend == "gloo" else dist.new_group(
            backend="gloo", timeout=IDLE_TIMEOUT)
        self.full: ModelConfig | None = None

    def close(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()

    # ---- config and weights -------------------------------------------------------------

    def shard_config(self, config: ModelConfig) -> ModelConfig:
        self.full = config
        return shard_config(config, self.size)

    def agree(self, count: int) -> int:
        """The smallest of every rank's `count` (KV blocks: what the smallest rank holds)."""
        value = torch.tensor([count], dtype=torch.int64)
        dist.all_reduce(value, op=dist.ReduceOp.MIN, group=self.control)
        return int(value.item())

    def shard(self, param_name: str, part: int | None, tensor: torch.Tensor) -> torch.Tensor:
        """This rank's slice of the checkpoint tensor bound for `param_name` (`part`: its
        slice of a fused qkv / gate_up parameter; None with the fused tensor whole)."""
        full = self.full
        if param_name in ("embed_tokens.weight", "lm_head.weight"):
            start, rows, padded = vocab_rows(self.rank, self.size, full.vocab_size)
            out = tensor.new_zeros((padded, *tensor.shape[1:]))
            out[:rows] = tensor[start:start + rows]
            return out
        if ".self_attn.qkv_proj." in param_name:
            q, kv = full.num_heads * full.head_dim, full.num_kv_heads * full.head_dim
            if part is None:   # fused in the checkpoint (Phi-3)
                pieces = tensor.split([q, kv, kv])
                return torch.cat([self._qkv_part(i, p) for i, p in enumerate(pieces)])
            return self._qkv_part(part, tensor)
        if ".mlp.gate_up_proj." in param_name:
            if part is None:
                return torch.cat([self._rows(p, self.size) for p in tensor.chunk(2)])
            return self._rows(tensor, self.size)
        if row_parallel(param_name):
            if param_name.endswith(".bias"):
                return tensor if self.rank == 0 else torch.zeros_like(tensor)
            share = tensor.shape[1] // self.size
            return tensor[:, self.rank * share:(self.rank + 1) * share]
        return tensor   # norms and everything else: whole on every rank

    def _qkv_part(self, part: int, tensor: torch.Tensor) -> torch.Tensor:
        if part == 0:
            return self._rows(tensor, self.size)
        dim = self.full.head_dim
        heads = kv_heads_of(self.rank, self.size, self.full.num_kv_heads)
        return tensor[heads.start * dim:heads.stop * dim]

    def _rows(self, tensor: torch.Tensor, parts: int) -> torch.Tensor:
        share = tensor.shape[0] // parts
        return tensor[self.rank * share:(self.rank + 1) * share]

    # ---- the model's communication points -----------------------------------------------

    def parallelize(self, model: nn.Module) -> nn.Module:
        """Add the all-reduces and vocab-parallel layers to a model built from the sharded
        config (before its weights are loaded)."""
        full = self.full
        model.embed_tokens = VocabParallelEmbedding(full.vocab_size, full.hidden_size, self)
        model.lm_head = VocabParallelHead(full.vocab_size, full.hidden_size, self)
        for layer in model.layers:
            layer.self_attn.register_forward_hook(self._reduce_output)
            layer.mlp.register_forward_hook(self._reduce_output)
        return model

    def _reduce_output(self, module: nn.Module, args, output: torch.Tensor) -> torch.Tensor:
        dist.all_reduce(output)
        return output

    def gather_last(self, local: torch.Tensor) -> torch.Tensor:
        parts = [torch.empty_like(local) for _ in range(self.size)]
        dist.all_gather(parts, local.contiguous())
        return torch.cat(parts, dim=-1)


class VocabParallelEmbedding(nn.Module):
    """Rows [start, start + rows) of the vocabulary; other ids look up zeros, and one
    all-reduce sums the ranks' lookups into every id's embedding."""

    def __init__(self, vocab_size: int, hidden_size: int, tp: TensorParallel) -> None:
        super().__init__()
        self.start, self.rows, padded = vocab_rows(tp.rank, tp.size, vocab_size)
        self.weight = nn.Parameter(torch.empty(padded, hidden_size))

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        local = input_ids - self.start
        outside = (local < 0) | (local >= self.rows)
        out = F.embedding(local.masked_fill(outside, 0), self.weight)
        out.masked_fill_(outside.unsqueeze(-1), 0)
        dist.all_reduce(out)
        return out


class VocabParallelHead(nn.Module):
    """This rank's vocabulary rows of the logits, gathered into the whole vocabulary on
    every rank (the padding rows cut off)."""

    def __init__(self, vocab_size: int, hidden_size: int, tp: TensorParallel) -> None:
        super().__init__()
        self.vocab_size = vocab_size
        self.tp = tp
        self.weight = nn.Parameter(torch.empty(vocab_rows(tp.rank, tp.size, vocab_size)[2],
                                                hidden_size))

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.tp.gather_last(F.linear(hidden, self.weight))[..., :self.vocab_size]
