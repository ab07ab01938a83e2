"""Decode step time of a hybrid model (Qwen3.5-style: 3 Gated DeltaNet layers per gated
attention layer) against a full-attention model (Llama) of about the same parameter count,
for one user and many, with the recurrent layers' decode steps in torch and in C++
(kernels/cpu/gated_delta.cpp, short_conv.cpp), and every layer in one C++ call (the native
step, kernels/cpu/hybrid_step.cpp). Target (issue 39): hybrid <= 1.2x full.

    python bench/hybrid_step.py                         # SmolLM2-135M-like widths, CPU
    python bench/hybrid_step.py --users 1,64 --context 1024 --dtype bfloat16 --steps 30
    python bench/hybrid_step.py --tiny --steps 3        # only checks that it runs

Both checkpoints are random, made by transformers and saved in a temporary directory
(Llama: hidden 576, 30 layers, 9 heads / 3 KV heads, MLP 1536, vocab 49152, tied
embeddings; the hybrid: the same widths, 28 layers, every 4th full attention, linear
attention with 2 key / 4 value heads of 128, which gives about the same parameters; both
counts are printed). Each is loaded by Folio's own loader with the C++ CPU kernel set
(executor/ops.py's "cpu") and runs as the executor runs it: its default linear layers, and
the full-attention model's native decode step where it applies (steps of up to 16 tokens);
every user has --context tokens of KV cache (random values) and a random recurrent state,
and one step is the forward pass of one new token per user plus its logits, timed --steps
times after --warmup steps: the median is printed. "torch" rows run the hybrid's layers in
Python with the recurrent decode steps in torch (the path taken when the C++ library is not
built), "C++" rows the layers in Python with the C++ recurrent operators, "native" rows
(up to 16 users) the hybrid's native decode step (what the executor runs there); the
full-attention model is the same in all.
The figures that count come from a quiet machine; on a shared one they only show it runs.

`--prefill LENGTH` times the hybrid's prompts instead (issue 39, the delta rule's prompt
form): --users fresh prompts of LENGTH tokens in one step (forward pass, last tokens'
logits), the Gated DeltaNet prompts in torch (`gated_delta.chunked`) and in C++
(kernels/cpu/gated_delta_chunk.cpp), alternated, best of --steps each; and the delta rule
alone at the model's shape (one prompt of LENGTH tokens, one layer), best of --steps, with
the load average beside them:

    python bench/hybrid_step.py --prefill 512 --users 4 --steps 3
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

BLOCK_SIZE = 16
SMOLLM2 = dict(hidden_size=576, intermediate_size=1536, num_heads=9, num_kv_heads=3,
               vocab_size=49152, tie_word_embeddings=True, max_position_embeddings=8192)
TINY = dict(hidden_size=64, intermediate_size=128, num_heads=4, num_kv_heads=2,
            vocab_size=1024, tie_word_embeddings=True, max_position_embeddings=2048)


def make_checkpoints(directory: Path, tiny: bool) -> tuple[Path, Path]:
    """(full-attention dir, hybrid dir): random weights saved by transformers."""
    from folio.tiny_models import make_random_checkpoint

    widths = TINY if tiny else SMOLLM2
    full_layers, hybrid_layers = (4, 4) if tiny else (30, 28)
    head = widths["hidden_size"] // widths["num_heads"]
    linear_dim = 16 if tiny else 128
    full, hybrid = directory / "llama", directory / "qwen3_5"
    make_random_checkpoint(full, arch="llama", num_layers=full_layers, head_dim=head,
                           initializer_range=0.02, **widths)
    make_random_checkpoint(
        hybrid, arch="qwen3_5", num_layers=hybrid_layers, head_dim=head,
        initializer_range=0.02, linear_num_key_heads=2, linear_num_value_heads=4,
        linear_key_head_dim=linear_dim, linear_value_head_dim=linear_dim,
        linear_conv_kernel_dim=4,
        layer_types=["full_attention" if i % 4 == 3 else "linear_attention"
                     for i in range(hybrid_layers)],
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                         "partial_rotary_factor": 0.25}, **widths)
    return full, hybrid


class DecodeStep:
    """One model, loaded as the executor loads it, with `users` requests of `context` tokens
    already cached: `run()` is one decode step (forward pass and logits)."""

    def __init__(self, model_dir: Path, users: int, context: int, dtype: torch.dtype) -> None:
        from folio.executor.kv_cache import allocate_kv_cache
        from folio.executor.model_loader import load_model
        from folio.executor.models.hf_config import read_model_config
        from folio.executor.models.hybrid.state_pool import StatePool
        from folio.executor.ops import AttentionInputs, cpu_ops
        from folio.executor.native_step.select import MAX_TOKENS, select_decode_step
        from folio.executor.quantization.weight_formats import apply_weight_format
        from folio.shared.config import EngineConfig

        device = torch.device("cpu")
        config = read_model_config(model_dir)
        self.ops = cpu_ops()
        self.model = load_model(model_dir, config, self.ops, dtype, device, context + 64)
        self.num_params = sum(p.numel() for p in self.model.parameters())
        # As the executor runs it: the default linear layers, and the native decode step
        # where it applies (steps of up to 16 tokens).
        self.linear = apply_weight_format(self.model, EngineConfig(model=str(model_dir)),
                                          config, device, dtype).linear_backend
        self.step = select_decode_step(self.model, "auto", self.ops, device, dtype)
        self.model.native_step = self.step
        self.native = self.step is not None and users <= MAX_TOKENS
        blocks = -(-(context + 1) // BLOCK_SIZE)
        self.kv = allocate_kv_cache(config, users * blocks, BLOCK_SIZE, dtype, device)
        for key, value in self.kv:
            key.normal_(0, 0.5)
            value.normal_(0, 0.5)
        tables = torch.arange(users * blocks, dtype=torch.int32).reshape(users, blocks)
        slot = tables[:, context // BLOCK_SIZE].long() * BLOCK_SIZE + context % BLOCK_SIZE
        inputs = AttentionInputs(slot, tables, torch.full((users,), context + 1, dtype=torch.int32),
                                 torch.arange(users + 1, dtype=torch.int32))
        self.inputs = self.ops.prepare(inputs, BLOCK_SIZE)
        self.ids = torch.randint(0, config.vocab_size, (users,))
        self.positions = torch.full((users,), context, dtype=torch.long)
        self.extra = {}
        if config.hybrid is not None:
            pool = StatePool(config.hybrid, users, dtype, device)
            for tensors in (pool.conv, pool.delta):
                for tensor in tensors.values():
                    tensor.normal_(0, 0.1)
            self.model.attach_states(pool)
            self.extra["states"] = pool.step(list(range(users)), [context] * users,
                                             list(range(users + 1)))

    def use(self, label: str) -> None:
        """The hybrid's decode step: "torch" (the layers in Python, the recurrent steps in
        torch), "C++" (the layers in Python, the recurrent steps in C++) or "native" (every
        layer in one C++ call)."""
        for module in self.model.modules():
            if hasattr(module, "native"):
                module.native = label != "torch"
        self.model.native_step = self.step if label == "native" else None

    @torch.inference_mode()
    def run(self) -> None:
        hidden = self.model(self.ids, self.positions, self.kv, self.inputs, **self.extra)
        self.model.compute_logits(hidden)


class PrefillStep:
    """The hybrid with `users` fresh prompts of `length` tokens in one step: `run()` is
    their forward pass and the last tokens' logits (the executor's first step for them)."""

    def __init__(self, model_dir: Path, users: int, length: int, dtype: torch.dtype) -> None:
        from folio.executor.kv_cache import allocate_kv_cache
        from folio.executor.model_loader import load_model
        from folio.executor.models.hf_config import read_model_config
        from folio.executor.models.hybrid.state_pool import StatePool
        from folio.executor.ops import AttentionInputs, cpu_ops
        from folio.executor.quantization.weight_formats import apply_weight_format
        from folio.shared.config import EngineConfig

        device = torch.device("cpu")
        self.config = config = read_model_config(model_dir)
        ops = cpu_ops()
        self.model = load_model(model_dir, config, ops, dtype, device, length + 64)
        apply_weight_format(self.model, EngineConfig(model=str(model_dir)), config, device,
                            dtype)
        blocks = -(-length // BLOCK_SIZE)
        self.kv = allocate_kv_cache(config, users * blocks, BLOCK_SIZE, dtype, device)
        tables = torch.arange(users * blocks, dtype=torch.int32).reshape(users, blocks)
        position = torch.arange(length)
        slots = (tables[:, position // BLOCK_SIZE].long() * BLOCK_SIZE
                 + position % BLOCK_SIZE).reshape(-1)
        starts = [u * length for u in range(users + 1)]
        inputs = AttentionInputs(slots, tables, torch.full((users,), length, dtype=torch.int32),
                                 torch.tensor(starts, dtype=torch.int32))
        self.inputs = ops.prepare(inputs, BLOCK_SIZE)
        self.ids = torch.randint(0, config.vocab_size, (users * length,))
        self.positions = position.repeat(users)
        self.last = torch.tensor(starts[1:]) - 1
        pool = StatePool(config.hybrid, users, dtype, device)
        self.model.attach_states(pool)
        self.states = pool.step(list(range(users)), [0] * users, starts)

    def use(self, label: str) -> None:
        """The Gated DeltaNet prompts in "torch" or "C++"."""
        for module in self.model.modules():
            if hasattr(module, "native"):
                module.native = label != "torch"

    @torch.inference_mode()
    def run(self) -> None:
        hidden = self.model(self.ids, self.positions, self.kv, self.inputs,
                            states=self.states)
        self.model.compute_logits(hidden[self.last])


def delta_rule_ms(config, length: int, steps: int) -> dict[str, float]:
    """The delta rule alone, one prompt of `length` fresh tokens at one layer's shape
    (value heads x key dim x value dim): best of `steps` ms, torch chunked and C++."""
    from folio.executor.models.hybrid import gated_delta

    spec = config.hybrid
    heads, k_dim, v_dim = spec.num_v_heads, spec.k_head_dim, spec.v_head_dim
    q, k = gated_delta.prepare_qk(torch.randn(length, heads, k_dim),
                                  torch.randn(length, heads, k_dim))
    v, g, beta = (torch.randn(length, heads, v_dim), -torch.rand(length, heads),
                  torch.rand(length, heads))
    pool = torch.zeros(1, heads, k_dim, v_dim)
    runs = {"torch": lambda: gated_delta.chunked(q, k, v, g, beta, pool[0]),
            "C++": lambda: gated_delta.chunked_in_pool(q, k, v, g, beta, pool, 0, True)}
    return {label: best_ms(run, steps) for label, run in runs.items()}


def best_ms(run, steps: int) -> float:
    run()   # warm
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return min(times) * 1e3


def prefill(args, dtype: torch.dtype) -> None:
    import os

    users = int(args.users.split(",")[0])
    with tempfile.TemporaryDirectory() as tmp:
        _, hybrid_dir = make_checkpoints(Path(tmp), args.tiny)
        step = PrefillStep(hybrid_dir, users, args.prefill, dtype)
        labels = ("torch", "C++")
        times = {label: [] for label in labels}
        for round in range(args.steps + 1):   # alternated, so a neighbour's load hits both
            for label in labels:
                step.use(label)
                start = time.perf_counter()
                step.run()
                if round:   # the first round warms
                    times[label].append((time.perf_counter() - start) * 1e3)
        rows = [(label, min(times[label])) for label in labels]
        alone = delta_rule_ms(step.config, args.prefill, args.steps)
    spec = step.config.hybrid
    print(f"prefill, {args.dtype}, {users} prompts x {args.prefill} tokens, "
          f"{torch.get_num_threads()} threads, best of {args.steps}; delta rule: "
          f"{spec.num_v_heads} heads x {spec.k_head_dim} x {spec.v_head_dim}; load average "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(f"{'prompts':>9}  {'step ms':>8}  {'delta rule ms (1 prompt, 1 layer)':>33}")
    for label, ms in rows:
        print(f"{label:>9}  {ms:>8.1f}  {alone[label]:>33.2f}")
    print(f"torch / C++: step {rows[0][1] / rows[1][1]:.2f}x, delta rule "
          f"{alone['torch'] / alone['C++']:.2f}x")


def median_ms(step: DecodeStep, warmup: int, steps: int) -> float:
    for _ in range(warmup):
        step.run()
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        step.run()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--users", default="1,64", help="comma-separated batch sizes")
    parser.add_argument("--context", type=int, default=512, help="tokens cached per user")
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None, help="torch threads")
    parser.add_argument("--tiny", action="store_true", help="tiny widths: a smoke test")
    parser.add_argument("--prefill", type=int, default=None, metavar="LENGTH",
                        help="time --users prompts of LENGTH tokens (the first of --users) "
                             "instead of decode steps: the delta rule's prompts in torch "
                             "and in C++, best of --steps")
    args = parser.parse_args(argv)
    from folio.kernels import cpu_attention

    status = cpu_attention.load()
    if not status.ok:
        raise SystemExit(f"the C++ CPU operators are not built: {status.detail}")
    if args.threads:
        torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    if args.prefill:
        return prefill(args, dtype)
    users = [int(n) for n in args.users.split(",")]
    rows, native = [], []
    with tempfile.TemporaryDirectory() as tmp:
        full_dir, hybrid_dir = make_checkpoints(Path(tmp), args.tiny)
        for n in users:
            full = DecodeStep(full_dir, n, args.context, dtype)
            full_ms = median_ms(full, args.warmup, args.steps)
            hybrid = DecodeStep(hybrid_dir, n, args.context, dtype)
            labels = ("torch", "C++") + (("native",) if hybrid.native else ())
            for label in labels:
                hybrid.use(label)
                hybrid_ms = median_ms(hybrid, args.warmup, args.steps)
                rows.append((n, label, full_ms, hybrid_ms))
            params = (full.num_params, hybrid.num_params)
            linear = full.linear
            native += [n] if full.native else []
            del full, hybrid
    print(f"decode step, {args.dtype}, {args.context} tokens cached per user, "
          f"{torch.get_num_threads()} threads, median of {args.steps}; parameters: full "
          f"{params[0] / 1e6:.1f}M, hybrid {params[1] / 1e6:.1f}M; {linear} linear layers; "
          f"the full model's native decode step at users "
          f"{native or 'none'}")
    print(f"{'users':>5}  {'recurrent':>9}  {'full ms':>8}  {'hybrid ms':>9}  "
          f"{'hybrid/full':>11}  {'target':>6}")
    for n, label, full_ms, hybrid_ms in rows:
        ratio = hybrid_ms / full_ms
        print(f"{n:>5}  {label:>9}  {full_ms:>8.2f}  {hybrid_ms:>9.2f}  {ratio:>11.2f}  "
              f"{'met' if ratio <= 1.2 else 'missed':>6}")


if __name__ == "__main__":
    main()
