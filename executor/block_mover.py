"""Applies a plan's block moves: fork copies inside the device pool, swap-out to the CPU
swap pool, swap-in back. Each direction is one gather and one batched copy per layer.
A hybrid model's state slots swap the same way between its device state pool and a host
one (executor/models/hybrid/state_pool.py), each right after the blocks' move of the same
direction.

Order matters and is part of the protocol: copies, then swap-out, then swap-in, all before
the forward pass (a block or slot freed by one move may be the destination of a later one).
"""

from __future__ import annotations

import time

import torch

from folio.executor.kv_cache import KVCaches
from folio.kernels.kv_quant import as_bytes


class BlockMover:
    def __init__(self, device_caches: KVCaches, swap_caches: KVCaches,
                 device_states: list[torch.Tensor] = (),
                 swap_states: list[torch.Tensor] = ()) -> None:
        """`device_states`, `swap_states`: a hybrid's state pools (StatePool.tensors) on
        the device and on the host, the same layers in the same order."""
        # Whole rows move, whatever they hold (int8 rows carry their scales): float8 caches
        # move as bytes, since torch's CPU index_copy_ has no float8.
        self.device_caches = [(as_bytes(k), as_bytes(v)) for k, v in device_caches]
        self.swap_caches = [(as_bytes(k), as_bytes(v)) for k, v in swap_caches]
        self.states = list(zip(device_states, swap_states))

    def apply(self, copies, swap_out, swap_in, state_out=(), state_in=()) -> None:
        if copies:
            src, dst = self._indices(copies, self._device, self._device)
            for key, value in self.device_caches:
                key.index_copy_(0, dst, key.index_select(0, src))
                value.index_copy_(0, dst, value.index_select(0, src))
        if swap_out:
            src, dst = self._indices(swap_out, self._device, torch.device("cpu"))
            for (key, value), (cpu_key, cpu_value) in zip(self.device_caches, self.swap_caches):
                cpu_key.index_copy_(0, dst, key.index_select(0, src).to("cpu"))
                cpu_value.index_copy_(0, dst, value.index_select(0, src).to("cpu"))
        if state_out:
            src, dst = self._indices(state_out, self._device, torch.device("cpu"))
            for pool, host in self.states:
                host.index_copy_(0, dst, pool.index_select(0, src).to("cpu"))
        if swap_in:
            src, dst = self._indices(swap_in, torch.device("cpu"), self._device)
            for (key, value), (cpu_key, cpu_value) in zip(self.device_caches, self.swap_caches):
                key.index_copy_(0, dst, cpu_key.index_select(0, src).to(
                    key.device, non_blocking=True))
                value.index_copy_(0, dst, cpu_value.index_select(0, src).to(
                    value.device, non_blocking=True))
        if state_in:
            src, dst = self._indices(state_in, torch.device("cpu"), self._device)
            for pool, host in self.states:
                pool.index_copy_(0, dst, host.index_select(0, src).to(pool.device))

    @property
    def _device(self) -> torch.device:
        return self.device_caches[0][0].device

    @staticmethod
    def _indices(pairs, src_device, dst_device):
        src = torch.tensor([p[0] for p in pairs], dtype=torch.long, device=src_device)
        dst = torch.tensor([p[1] for p in pairs], dtype=torch.long, device=dst_device)
        return src, dst


def measure_swap_bytes_per_s(cache: torch.Tensor, num_blocks: int = 64) -> float:
    """Device -> host copy bandwidth over a few blocks of the real cache."""
    blocks = min(num_blocks, cache.shape[0])
    sample = cache[:blocks]
    sample.to("cpu")   # warm-up
    if cache.is_cuda:
        torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(3):
        sample.to("cpu")
    if cache.is_cuda:
        torch.cuda.synchronize()
    elapsed = max(time.perf_counter() - start, 1e-9)
    return 3 * sample.numel() * sample.element_size() / elapsed
