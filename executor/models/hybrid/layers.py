"""The layers of the hybrid families, named as their checkpoints name them (hybrid/loader.py
copies tensors by name): Qwen3.5's Gated DeltaNet and gated attention, LFM2's gated short
convolution and attention, their MLPs and norms."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from folio.executor.model_config import ModelConfig
from folio.executor.models.hybrid import gated_delta
from folio.executor.models.hybrid import short_conv
from folio.executor.models.hybrid.short_conv import causal_conv
from folio.executor.models.hybrid.state_pool import StepStates
from folio.executor.ops import AttentionInputs, KernelOps


class Norm(nn.Module):
    """RMSNorm in float32: weight * x (LFM2, rounded to the dtype first) or (1 + weight) * x
    (Qwen3.5, zero-centred, rounded once at the end). `offset` is the 1 of a zero-centred
    norm: 0 where the weight was loaded as the scale itself (a GGUF file stores 1 + weight,
    and weight = scale - 1 is not exact in float32 for every scale)."""

    def __init__(self, size: int, eps: float, zero_centred: bool) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(size) if zero_centred else torch.ones(size))
        self.eps = eps
        self.zero_centred = zero_centred
        self.offset = 1.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        normed = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + self.eps)
        if self.zero_centred:
            return (normed * (self.offset + self.weight.float())).to(x.dtype)
        return self.weight * normed.to(x.dtype)


class GatedNorm(nn.Module):
    """Gated DeltaNet's output norm: RMSNorm(x) * silu(gate), per value head."""

    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        normed = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + self.eps)
        out = self.weight * normed.to(x.dtype)
        return (out * F.silu(gate.float())).to(x.dtype)


class DepthwiseConv(nn.Module):
    """The convolution's parameters, as the checkpoints store them ([C, 1, K])."""

    def __init__(self, channels: int, kernel: int, bias: bool) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(channels, 1, kernel))
        self.bias = nn.Parameter(torch.empty(channels)) if bias else None


def run_conv(x: torch.Tensor, conv: DepthwiseConv, windows: torch.Tensor,
             states: StepStates, native: bool = False) -> torch.Tensor:
    """x [T, C], the step's tokens, through each sequence's causal convolution; each
    sequence's window (windows[slot], [C, K-1]) is read and written back. `native`: the
    decode step runs in C++ on the pool in place (kernels/cpu_recurrent.py)."""
    if states.decode_only and native and x.dtype in short_conv.NATIVE_DTYPES:
        return short_conv.step_in_pool(x, windows, conv.weight, conv.bias, states.slots,
                                       states.fresh)
    if states.decode_only:   # one token each: one batched call
        window = windows[states.slots]
        for i, fresh in enumerate(states.fresh):
            if fresh:
                window[i].zero_()
        out, new = causal_conv(x.unsqueeze(-1), window, conv.weight, conv.bias)
        windows[states.slots] = new.to(windows.dtype)
        return out[..., 0]
    out = torch.empty_like(x)
    for i, slot, a, b, ends in _segments(states):
        window = windows[slot:slot + 1]
        if states.drafted[i]:   # one decode step per token, every window kept
            after = torch.empty((b - a, *windows.shape[1:]), dtype=windows.dtype,
                                device=windows.device)
            in_cpp = native and x.dtype in short_conv.NATIVE_DTYPES   # as decode steps run
            window = window.clone() if in_cpp else window
            first = torch.zeros(1, dtype=torch.int64, device=windows.device)
            for t in range(a, b):
                if in_cpp:
                    out[t] = short_conv.step_in_pool(x[t:t + 1], window, conv.weight,
                                                     conv.bias, first, [False])[0]
                else:
                    y, window = causal_conv(x[t:t + 1].t().unsqueeze(0), window,
                                            conv.weight, conv.bias)
                    out[t] = y[0, :, 0]
                after[t - a] = window[0].to(windows.dtype)
            _hold(windows, i, after, states)
            continue
        if states.fresh[i]:
            window = torch.zeros_like(window)
        for end, checkpoint in ends:   # up to each checkpoint, then the rest
            if end > a:
                y, window = causal_conv(x[a:end].t().unsqueeze(0), window, conv.weight,
                                        conv.bias)
                out[a:end] = y[0].t()
            windows[slot if checkpoint is None else checkpoint] = window[0].to(windows.dtype)
            a = end
    return out


def _hold(pool: torch.Tensor, i: int, after: torch.Tensor, states: StepStates) -> None:
    """A drafted sequence's states after each token: held for the commit after
    verification; a checkpoint (only ever at its verified token) is written now."""
    for offset, checkpoint in states.checkpoints[i]:
        pool[checkpoint] = after[offset - 1]
    states.held.append((pool, i, after))


def _segments(states: StepStates):
    """Per sequence: (index, slot, first token, end, [(segment end, checkpoint slot or None
    for the last)]): a sequence runs in segments ending at its checkpoints."""
    starts = states.starts
    for i, slot in enumerate(states.slots.tolist()):
        a, b = starts[i], starts[i + 1]
        ends = [(a + offset, checkpoint) for offset, checkpoint in states.checkpoints[i]]
        ends.append((b, None))
        yield i, slot, a, b, ends


# The value dtypes the C++ prompt kernel reads (q and k are float32 after prepare_qk).
NATIVE_PROMPT_DTYPES = (torch.float32, torch.bfloat16)


class GatedDeltaNet(nn.Module):
    """Qwen3.5's linear-attention layer (state: a conv window and the delta rule's S).
    `native`: its decode steps and prompts run in C++ (the CPU kernel set,
    kernels/cpu_recurrent.py). `triton`: its prompts run in Triton (the Triton kernel set,
    kernels/triton_gated_delta.py); the decode step runs in Triton wherever the pool is on
    CUDA."""

    def __init__(self, config: ModelConfig, layer: int, native: bool = False,
                 triton: bool = False) -> None:
        super().__init__()
        self.native = native
        self.triton = triton
        spec = config.hybrid
        self.layer = layer
        self.k_heads, self.v_heads = spec.num_k_heads, spec.num_v_heads
        self.k_dim, self.v_dim = spec.k_head_dim, spec.v_head_dim
        key, value = self.k_heads * self.k_dim, self.v_heads * self.v_dim
        self.splits = [key, key, value]
        size = config.hidden_size
        self.in_proj_qkv = nn.Linear(size, 2 * key + value, bias=False)
        self.in_proj_z = nn.Linear(size, value, bias=False)
        self.in_proj_b = nn.Linear(size, self.v_heads, bias=False)
        self.in_proj_a = nn.Linear(size, self.v_heads, bias=False)
        self.conv1d = DepthwiseConv(2 * key + value, spec.conv_kernel, bias=False)
        self.dt_bias = nn.Parameter(torch.empty(self.v_heads))
        self.A_log = nn.Parameter(torch.empty(self.v_heads))
        self.norm = GatedNorm(self.v_dim, config.rms_norm_eps)
        self.out_proj = nn.Linear(value, size, bias=False)

    def forward(self, x: torch.Tensor, pool, states: StepStates) -> torch.Tensor:
        tokens = x.shape[0]
        mixed = F.silu(run_conv(self.in_proj_qkv(x), self.conv1d, pool.conv[self.layer],
                                states, self.native))
        q, k, v = mixed.split(self.splits, dim=-1)
        repeat = self.v_heads // self.k_heads
        q = q.reshape(tokens, self.k_heads, self.k_dim).repeat_interleave(repeat, dim=1)
        k = k.reshape(tokens, self.k_heads, self.k_dim).repeat_interleave(repeat, dim=1)
        v = v.reshape(tokens, self.v_heads, self.v_dim)
        q, k = gated_delta.prepare_qk(q, k)
        beta = self.in_proj_b(x).sigmoid().float()
        g = -self.A_log.float().exp() * F.softplus(self.in_proj_a(x).float() + self.dt_bias)
        out = self._delta_rule(q, k, v, g, beta, pool.delta[self.layer], states, self.native,
                               self.triton)
        out = self.norm(out.to(x.dtype).reshape(-1, self.v_dim),
                        self.in_proj_z(x).reshape(-1, self.v_dim))
        return self.out_proj(out.reshape(tokens, -1))

    @staticmethod
    def _delta_rule(q, k, v, g, beta, matrices: torch.Tensor, states: StepStates,
                    native: bool = False, triton: bool = False):
        if states.decode_only and native:   # C++ on the pool in place
            return gated_delta.recurrent_in_pool(q, k, v, g, beta, matrices, states.slots,
                                                 states.fresh)
        if states.decode_only and matrices.is_cuda:   # one Triton launch, in place
            from folio.kernels.triton_gated_delta import delta_rule_step

            fresh = torch.tensor(states.fresh, dtype=torch.int32, device=matrices.device)
            return delta_rule_step(q.contiguous(), k.contiguous(), v.float().contiguous(),
                                   g.contiguous(), beta.contiguous(), matrices, states.slots,
                                   fresh)
        if states.decode_only:   # the recurrent step, batched over the requests
            state = matrices[states.slots]
            for i, fresh in enumerate(states.fresh):
                if fresh:
                    state[i].zero_()
            out, state = gated_delta.recurrent(q, k, v, g, beta, state)
            matrices[states.slots] = state
            return out
        out = torch.empty(v.shape, dtype=torch.float32, device=v.device)
        for i, slot, a, b, ends in _segments(states):
            if states.drafted[i]:   # one decode step per token, every state kept
                step = gated_delta.recurrent_states_in_cpp if native \
                    else gated_delta.recurrent_states   # the decode steps' own arithmetic
                out[a:b], after = step(q[a:b], k[a:b], v[a:b], g[a:b], beta[a:b],
                                       matrices[slot])
                _hold(matrices, i, after, states)
                continue
            in_pool = gated_delta.chunked_in_pool if native \
                and v.dtype in NATIVE_PROMPT_DTYPES else None   # C++, the slot in place
            if triton:   # Triton, the slot in place
                in_pool = gated_delta.prompt_in_pool_triton
            if in_pool is not None:
                fresh = states.fresh[i]
                for end, checkpoint in ends:   # up to each checkpoint, then the rest
                    if end > a:
                        out[a:end] = in_pool(q[a:end], k[a:end], v[a:end], g[a:end],
                                             beta[a:end], matrices, slot, fresh)
                        fresh = False
                    if checkpoint is not None:   # the state after the first `end` tokens
                        matrices[checkpoint] = matrices[slot]
                    a = end
                continue
            state = torch.zeros_like(matrices[slot]) if states.fresh[i] else matrices[slot]
            # A prompt runs chunked (a one-token prompt too, as transformers does).
            run = gated_delta.recurrent if b - a == 1 and not states.fresh[i] \
                else gated_delta.chunked
            for end, checkpoint in ends:   # up to each checkpoint, then the rest
                if end > a:
                    out[a:end], state = run(q[a:end], k[a:end], v[a:end], g[a:end],
                                            beta[a:end], state)
                matrices[slot if checkpoint is None else checkpoint] = state
                a = end
        return out


class ShortConv(nn.Module):
    """LFM2's gated short convolution: out(C * conv(B * x)) (state: the conv window).
    `native`: its decode step runs in C++ (the CPU kernel set, kernels/cpu_recurrent.py)."""

    def __init__(self, config: ModelConfig, layer: int, native: bool = False) -> None:
        super().__init__()
        self.native = native
        spec = config.hybrid
        size = config.hidden_size
        self.layer = layer
        self.in_proj = nn.Linear(size, 3 * size, bias=spec.conv_bias)
        self.conv = DepthwiseConv(size, spec.conv_kernel, spec.conv_bias)
        self.out_proj = nn.Linear(size, size, bias=spec.conv_bias)

    def forward(self, x: torch.Tensor, pool, states: StepStates) -> torch.Tensor:
        b, c, h = self.in_proj(x).chunk(3, dim=-1)
        y = run_conv(b * h, self.conv, pool.conv[self.layer], states, self.native)
        return self.out_proj(c * y)


class HybridAttention(nn.Module):
    """Attention over the paged KV cache with per-head q/k norms and rotary (partial on
    Qwen3.5); Qwen3.5's q_proj also yields a sigmoid gate on the output."""

    def __init__(self, config: ModelConfig, ops: KernelOps, gated: bool) -> None:
        super().__init__()
        heads, kv_heads, dim = config.num_heads, config.num_kv_heads, config.head_dim
        self.heads, self.kv_heads, self.dim = heads, kv_heads, dim
        self.gated = gated
        size = config.hidden_size
        self.q_proj = nn.Linear(size, heads * dim * (2 if gated else 1), bias=False)
        self.k_proj = nn.Linear(size, kv_heads * dim, bias=False)
        self.v_proj = nn.Linear(size, kv_heads * dim, bias=False)
        out = nn.Linear(heads * dim, size, bias=False)
        if gated:
            self.o_proj = out
            self.q_norm = Norm(dim, config.rms_norm_eps, zero_centred=True)
            self.k_norm = Norm(dim, config.rms_norm_eps, zero_centred=True)
        else:
            self.out_proj = out
            self.q_layernorm = Norm(dim, config.rms_norm_eps, zero_centred=False)
            self.k_layernorm = Norm(dim, config.rms_norm_eps, zero_centred=False)
        self.rotary_dim = config.rotary_dim or dim
        self.scale = dim ** -0.5
        self.ops = ops

    def forward(self, positions, x, cos_sin, kv_cache, inputs: AttentionInputs):
        tokens = x.shape[0]
        q = self.q_proj(x)
        if self.gated:
            q, gate = q.view(tokens, self.heads, 2 * self.dim).chunk(2, dim=-1)
            q_norm, k_norm, out_proj = self.q_norm, self.k_norm, self.o_proj
        else:
            q_norm, k_norm, out_proj = self.q_layernorm, self.k_layernorm, self.out_proj
        q = q_norm(q.reshape(tokens, self.heads, self.dim))
        k = k_norm(self.k_proj(x).view(tokens, self.kv_heads, self.dim))
        v = self.v_proj(x).view(tokens, self.kv_heads, self.dim)
        rot = self.rotary_dim
        q_rot, k_rot = self.ops.rotary(positions, q[..., :rot].contiguous(),
                                       k[..., :rot].contiguous(), cos_sin)
        q = torch.cat((q_rot, q[..., rot:]), dim=-1)
        k = torch.cat((k_rot, k[..., rot:]), dim=-1)
        key_cache, value_cache = kv_cache
        self.ops.reshape_and_cache(k, v, key_cache, value_cache, inputs.slot_mapping)
        out = self.ops.attention(q, key_cache, value_cache, inputs, self.scale)
        out = out.reshape(tokens, self.heads * self.dim)
        if self.gated:
            out = out * torch.sigmoid(gate.reshape(tokens, -1))
        return out_proj(out)


class GatedMlp(nn.Module):
    """down(silu(gate(x)) * up(x)), its three weights under the checkpoint's names:
    Qwen3.5's gate_proj / up_proj / down_proj (the defaults), LFM2's w1 / w3 / w2; a shared
    expert's width (hybrid/moe.py) in place of intermediate_size."""

    def __init__(self, config: ModelConfig, gate: str = "gate_proj", up: str = "up_proj",
                 down: str = "down_proj", intermediate_size: int | None = None) -> None:
        super().__init__()
        size, inter = config.hidden_size, intermediate_size or config.intermediate_size
        self.names = (gate, up, down)
        for name, (inputs, outputs) in zip(self.names, ((size, inter), (size, inter),
                                                        (inter, size))):
            self.add_module(name, nn.Linear(inputs, outputs, bias=False))

    def forward(self, x):
        gate, up, down = (self._modules[name] for name in self.names)
        return down(F.silu(gate(x)) * up(x))
