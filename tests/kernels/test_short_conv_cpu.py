"""The C++ causal-convolution decode step (kernels/cpu/short_conv.cpp) against a float64
reference: a batch of requests whose windows live in scattered pool slots, some fresh,
shifted in place over several steps, the other slots untouched; float32 and bfloat16, with
and without a bias; and against the torch path the model runs otherwise (short_conv)."""

from __future__ import annotations

import pytest
import torch

from folio.executor.models.hybrid.short_conv import causal_conv
from folio.kernels.cpu_recurrent import causal_conv_step_cpu

pytestmark = pytest.mark.usefixtures("cpu_ops_built")

TOLERANCE = {torch.float32: dict(rtol=1e-5, atol=1e-5),
             torch.bfloat16: dict(rtol=2e-2, atol=2e-2)}


def reference_step(x, window, weight, bias):
    """float64: out = bias + taps . (window, x); the window drops its oldest input."""
    joined = torch.cat((window.double(), x.double()[..., None]), dim=-1)   # [B, C, K]
    out = (joined * weight.double()[:, 0]).sum(-1)
    if bias is not None:
        out = out + bias.double()
    return out, joined[..., 1:]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("channels,kernel,with_bias", [(24, 4, False), (100, 3, True),
                                                        (6, 2, True)])
def test_step_shifts_pool_windows_in_place(dtype, channels, kernel, with_bias):
    gen = torch.Generator().manual_seed(channels)
    batch, num_slots = 4, 7
    slots = torch.tensor([5, 1, 6, 3])
    fresh = [True, False, False, True]
    windows = torch.randn(num_slots, channels, kernel - 1, generator=gen).to(dtype)
    weight = torch.randn(channels, 1, kernel, generator=gen).to(dtype)
    bias = torch.randn(channels, generator=gen).to(dtype) if with_bias else None
    before = windows.clone()
    window = before[slots].double()
    window[torch.tensor(fresh)] = 0.0
    for step in range(kernel + 1):      # past a full window's turnover
        x = torch.randn(batch, channels, generator=gen).to(dtype)
        want, window = reference_step(x, window, weight, bias)
        got = causal_conv_step_cpu(x, windows, weight, bias, slots,
                                   fresh if step == 0 else [False] * batch)
        assert got.dtype == dtype and got.shape == (batch, channels)
        torch.testing.assert_close(got.double(), want, **TOLERANCE[dtype])
        # The window holds the inputs themselves, exactly.
        assert torch.equal(windows[slots].double(), window)
    untouched = [s for s in range(num_slots) if s not in slots.tolist()]
    assert torch.equal(windows[untouched], before[untouched])


def test_matches_the_torch_path_on_a_strided_input():
    """A view of a projection's output, as the layers hand it, through both paths."""
    gen = torch.Generator().manual_seed(3)
    channels, kernel = 40, 4
    projected = torch.randn(3, 3 * channels, generator=gen)
    x = projected[:, channels:2 * channels]
    windows = torch.randn(5, channels, kernel - 1, generator=gen)
    weight = torch.randn(channels, 1, kernel, generator=gen)
    slots = torch.tensor([4, 0, 2])
    want, new_window = causal_conv(x.unsqueeze(-1), windows[slots], weight, None)
    got = causal_conv_step_cpu(x, windows, weight, None, slots, [False] * 3)
    torch.testing.assert_close(got, want[..., 0], rtol=1e-6, atol=1e-6)
    assert torch.equal(windows[slots], new_window)


@pytest.mark.parametrize("change,message", [
    (lambda a: a.update(slots=torch.tensor([0, 5])), "slot 5 outside the pool"),
    (lambda a: a.update(slots=torch.tensor([2, 2])), "slot 2 appears twice"),
    (lambda a: a.update(fresh=[]), "fresh must have 2 entries"),
    (lambda a: a.update(weight=a["weight"][:, :, :3].contiguous()), "weight must be"),
    (lambda a: a.update(windows=a["windows"].bfloat16()), "windows has dtype"),
    (lambda a: a.update(bias=torch.zeros(3)), "bias must be a contiguous"),
    (lambda a: a.update(x=a["x"].half(), windows=a["windows"].half(),
                        weight=a["weight"].half()), "x must be float32 or bfloat16"),
])
def test_bad_input_is_refused_by_name(change, message):
    args = dict(x=torch.randn(2, 8), windows=torch.zeros(3, 8, 3),
                weight=torch.randn(8, 1, 4), bias=None, slots=torch.tensor([0, 2]),
                fresh=[False, False])
    change(args)
    with pytest.raises(RuntimeError, match=message):
        causal_conv_step_cpu(**args)
