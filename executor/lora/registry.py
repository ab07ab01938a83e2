"""The executor's LoRA adapters: registered by name and path (any number), held in host
memory as they are used (at most --max-cpu-loras; past that the least recently used one is
dropped there and read from its files again when a request names it), copied to the device
for the steps that use them (at most --max-loras there at once, the least recently used one
dropped first), and grouped per step for the wrapped layers (executor/lora/layers.py;
docs/lora.md). With `segmented` (CUDA) the device copies are slots of the kernel's pools
(executor/lora/slot_pools.py) rather than one tensor pair per module and adapter; with
`native` (CPU, the C++ operators built) they are slots of host pools for the C++ segmented
operator (executor/lora/cpu_pools.py). With
`shard` (a tensor-parallel rank) each adapter is read against the whole model's `config`
and cut to this rank's share as it is read (executor/lora/tensor_parallel.py)."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable

import torch

from folio.executor.lora.adapter import LoraWeights, read_adapter
from folio.executor.lora.cpu_pools import LoraCpuPools
from folio.executor.lora.files import LoraError, lora_name_problem, target_shapes
from folio.executor.lora.layers import LoraStep, wrap_lora_targets
from folio.executor.lora.slot_pools import LoraSlotPools
from folio.executor.model_config import ModelConfig
from folio.executor.models.weight_names import WeightNames


class LoraRegistry:
    def __init__(self, model: torch.nn.Module, config: ModelConfig, names: WeightNames,
                 device: torch.device, dtype: torch.dtype, max_loras: int, max_rank: int,
                 capacity: int, segmented: bool = False, native: bool = False,
                 shard: Callable[[LoraWeights], LoraWeights] | None = None) -> None:
        self.config, self.names = config, names
        self.device, self.dtype = device, dtype
        self.max_loras, self.max_rank, self.capacity = max_loras, max_rank, capacity
        self.shard = shard
        self.paths: dict[str, str] = {}   # every registered adapter, in load order
        self.host: OrderedDict[str, LoraWeights] = OrderedDict()   # least recently used first
        # On the device: the weights (grouped path), or the slot they sit in (segmented).
        self.resident: OrderedDict[str, LoraWeights | int] = OrderedDict()
        self.pools = LoraSlotPools(target_shapes(model.config), max_loras, max_rank, device,
                                   dtype) if segmented else None
        self.cpu_pools = LoraCpuPools(max_loras, max_rank, dtype) if native else None
        self.step = LoraStep()
        wrap_lora_targets(model, self.step)
        model.lora_step = self.step   # the native decode step yields its adapter rows' steps

    def load(self, name: str, path: str) -> LoraWeights:
        """Register an adapter, read whole (every check runs: a missing or broken one
        raises LoraError naming why, and nothing of it is kept) into host memory."""
        problem = lora_name_problem(name)
        if problem is not None:
            raise LoraError(problem)
        if name in self.paths:
            raise LoraError(f"an adapter named {name!r} is already loaded")
        weights = self._read(name, path)
        self.paths[name] = str(path)
        self._hold(weights)
        return weights

    def unload(self, name: str) -> None:
        if self.paths.pop(name, None) is None:
            raise LoraError(f"no adapter named {name!r} is loaded")
        self.host.pop(name, None)
        self.resident.pop(name, None)

    def _read(self, name: str, path: str) -> LoraWeights:
        weights = read_adapter(name, path, self.config, self.names, self.max_rank, self.dtype)
        return weights if self.shard is None else self.shard(weights)

    def names_loaded(self) -> list[str]:
        return list(self.paths)

    def _hold(self, weights: LoraWeights) -> None:
        """Keep `weights` in host memory, dropping the least recently used past capacity
        (it stays registered: its files are read again when a request names it)."""
        self.host[weights.name] = weights
        self.host.move_to_end(weights.name)
        while len(self.host) > self.capacity:
            self.host.popitem(last=False)

    def _in_host(self, name: str) -> LoraWeights:
        weights = self.host.get(name)
        if weights is not None:
            self.host.move_to_end(name)
            return weights
        path = self.paths.get(name)
        if path is None:   # the scheduler admits only loaded adapters' requests
            raise LoraError(f"a request names adapter {name!r}, which is not loaded")
        weights = self._read(name, path)
        self._hold(weights)
        return weights

    def begin_step(self, scheduled) -> None:
        """Group the step's token rows by adapter; `scheduled`: (request, tokens) in the
        order of the flattened batch. No adapter row: no group, so no extra op."""
        groups: dict[str, list[tuple[int, int]]] = {}
        start = 0
        for request, count in scheduled:
            name = request.sampling.lora
            if name is not None:
                ranges = groups.setdefault(name, [])
                if ranges and ranges[-1][1] == start:
                    ranges[-1] = (ranges[-1][0], start + count)
                else:
                    ranges.append((start, start + count))
            start += count
        adapters = [self._on_device(name) for name in groups]
        if self.pools is not None and groups:
            self._segments(groups, adapters)
            return
        if self.cpu_pools is not None and groups:
            self._cpu_segments(groups, adapters)
            return
        if all(len(ranges) == 1 for ranges in groups.values()):
            self.step.rows = None
            self.step.groups = [(w, slice(*ranges[0]))
                                for w, ranges in zip(adapters, groups.values())]
            return
        order, slices, at = [], [], 0
        for ranges in groups.values():
            count = sum(b - a for a, b in ranges)
            order.extend(torch.arange(a, b) for a, b in ranges)
            slices.append(slice(at, at + count))
            at += count
        self.step.rows = torch.cat(order).to(self.device)
        self.step.groups = list(zip(adapters, slices))

    def _segments(self, groups: dict[str, list[tuple[int, int]]], slots: list[int]) -> None:
        """The segmented kernel's view of the step: rows grouped by slot, cut in blocks."""
        from folio.kernels.triton_lora import BLOCK_M, segment_blocks

        rows = [row for ranges in groups.values() for a, b in ranges for row in range(a, b)]
        counts = [(slot, sum(b - a for a, b in ranges))
                  for slot, ranges in zip(slots, groups.values())]
        self.step.segments = (torch.tensor(rows, dtype=torch.int32).to(self.device),
                              segment_blocks(counts, BLOCK_M, self.device), self.pools)
        self.step.groups = [(None, slice(0, len(rows)))]   # the layers' "any adapter row"

    def _cpu_segments(self, groups: dict[str, list[tuple[int, int]]], slots: list[int]) -> None:
        """The C++ operator's view of the step: rows grouped by slot, one group per slot."""
        rows: list[int] = []
        table: list[tuple[int, int, int]] = []
        for slot, ranges in zip(slots, groups.values()):
            start = len(rows)
            for a, b in ranges:
                rows.extend(range(a, b))
            table.append((slot, start, len(rows) - start))
        self.step.cpu_segments = (torch.tensor(rows, dtype=torch.int64),
                                  torch.tensor(table, dtype=torch.int64), self.cpu_pools)
        self.step.groups = [(None, slice(0, len(rows)))]   # the layers' "any adapter row"

    def end_step(self) -> None:
        self.step.groups = []
        self.step.rows = None
        self.step.segments = None
        self.step.cpu_segments = None

    def _on_device(self, name: str) -> LoraWeights | int:
        """The adapter on the device (read in if need be, the least recently used one
        making room): its weights, or with the segmented kernel its slot."""
        resident = self.resident.get(name)
        if resident is not None:
            self.resident.move_to_end(name)
            return resident
        host = self._in_host(name)
        while len(self.resident) >= self.max_loras:
            self.resident.popitem(last=False)
        pools = self.pools if self.pools is not None else self.cpu_pools
        if pools is None:
            resident = self.resident[name] = host.to(self.device)
            return resident
        slot = min(set(range(self.max_loras)) - set(self.resident.values()))   # a free one
        pools.put(slot, host)
        self.resident[name] = slot
        return slot
