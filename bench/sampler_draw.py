"""The sampler's random draw at T = 1, per step: inverse CDF (what executor/sampler.py does)
against the exponential race it replaced (argmax of p / Exp(1) noise over every entry).

    python -m bench.sampler_draw [--rows 64] [--vocab 8192 16384] [--reps 30]

One thread, float32 probabilities already softmaxed (both draws start there); best of
--reps, in ms.
"""

from __future__ import annotations

import argparse
import time

import torch

from folio.executor.sampler import _inverse_cdf


def exponential_race(probs: torch.Tensor) -> torch.Tensor:
    return (probs / torch.empty_like(probs).exponential_()).argmax(dim=-1)


def inverse_cdf(probs: torch.Tensor) -> torch.Tensor:
    return _inverse_cdf(probs, torch.empty((probs.shape[0], 1)).uniform_())


def best_ms(fn, reps: int) -> float:
    fn()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--vocab", type=int, nargs="+", default=[8192, 16384])
    parser.add_argument("--reps", type=int, default=30)
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(f"{'vocab':>7} {'rows':>5} {'exponential race ms':>20} {'inverse CDF ms':>15}")
    for vocab in args.vocab:
        probs = torch.softmax(torch.randn(args.rows, vocab), dim=-1)
        race = best_ms(lambda: exponential_race(probs), args.reps)
        cdf = best_ms(lambda: inverse_cdf(probs), args.reps)
        print(f"{vocab:>7} {args.rows:>5} {race:>20.2f} {cdf:>15.2f}")


if __name__ == "__main__":
    main()
