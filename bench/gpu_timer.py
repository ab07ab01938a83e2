"""The GPU benches' timer (bench/gpu_attention.py, bench/moe_gpu.py): the median time of a
call in microseconds, by CUDA events with L2 flushed before every rep; by the wall clock on
CPU, where their --dry-run checks the scripts through triton's interpreter."""

from __future__ import annotations

import statistics
import time
from typing import Any, Callable


class Timer:
    def __init__(self, torch_module, reps: int, device: str) -> None:
        self.torch = torch_module   # imported by the caller: after TRITON_INTERPRET is set
        self.reps = reps
        self.device = device
        flush_bytes = (256 << 20) if device == "cuda" else 1 << 20
        self.flush = torch_module.empty(flush_bytes, dtype=torch_module.uint8, device=device)

    def __call__(self, fn: Callable[[], Any], reps: int | None = None) -> float:
        torch = self.torch
        reps = reps or self.reps
        fn()                                   # compile / warm up
        if self.device != "cuda":              # --dry-run: wall clock
            times = []
            for _ in range(reps):
                began = time.perf_counter()
                fn()
                times.append(time.perf_counter() - began)
            return statistics.median(times) * 1e6
        torch.cuda.synchronize()
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                  for _ in range(reps)]
        for start, end in events:
            self.flush.zero_()                 # also hides the launch latency of fn
            start.record()
            fn()
            end.record()
        torch.cuda.synchronize()
        return statistics.median(start.elapsed_time(end) for start, end in events) * 1e3
