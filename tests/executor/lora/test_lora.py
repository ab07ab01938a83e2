"""LoRA adapters (docs/lora.md): greedy output with each adapter token-identical to
transformers + PEFT in float32, alone and with several adapters and the base model mixed in
one batch, under preemption (recompute and swap) and prefix caching; bad adapters refused
with their cause and nothing kept; every KV block free when idle."""

from __future__ import annotations

import json
import shutil

import pytest

from folio import LLM, SamplingParams
from folio.shared.settings import SettingError
from tests.conftest import TEST_DEVICE
from tests.lora_adapters import (ADAPTERS, ATTENTION, MAX_TOKENS, PROMPTS, greedy_per_adapter,
                                 hf_lora_greedy, make_adapter)

pytestmark = pytest.mark.parity


def _llm(model_dir, adapters, **args) -> LLM:
    args.setdefault("max_model_len", 1024)
    return LLM(str(model_dir), dtype="float32", device=TEST_DEVICE, enable_lora=True,
               lora_modules=[f"{n}={p}" for n, p in adapters.items()], **args)


def _idle(llm) -> None:
    stats = llm.stats()
    assert stats["kv_blocks_free"] == stats["kv_blocks_total"]
    assert stats["num_running"] == stats["num_waiting"] == stats["num_swapped"] == 0


def test_alone_and_all_mixed_with_the_base(long_llama_dir, lora_adapters, lora_expected):
    for name in ADAPTERS:   # otherwise matching transformers + PEFT would prove nothing
        assert lora_expected[name] != lora_expected[None], name
    llm = _llm(long_llama_dir, lora_adapters, max_loras=4)
    for name in ("all", "qv-down"):
        assert greedy_per_adapter(llm, [name])[name] == lora_expected[name], name
    names = [*ADAPTERS, None]
    assert greedy_per_adapter(llm, names) == {name: lora_expected[name] for name in names}
    _idle(llm)


@pytest.mark.parametrize("mode, max_loras", [("recompute", 2), ("swap", 3)])
def test_mixed_under_preemption_with_fewer_slots(long_llama_dir, lora_adapters,
                                                 lora_expected, mode, max_loras):
    # max_loras below the adapters queued: a request for another adapter waits until one
    # running adapter's requests are done. A small pool preempts running ones.
    names = ["all", "attn", "mlp", None]
    llm = _llm(long_llama_dir, {n: lora_adapters[n] for n in names if n}, max_loras=max_loras,
               num_kv_blocks=10, max_num_batched_tokens=64, preemption_mode=mode,
               num_swap_blocks=64)
    assert greedy_per_adapter(llm, names) == {name: lora_expected[name] for name in names}
    assert llm.stats()[f"preemptions_{mode}"] > 0
    _idle(llm)


def test_prefix_cache_never_shares_blocks_between_adapters(long_llama_dir, lora_adapters,
                                                           lora_expected):
    llm = _llm(long_llama_dir, lora_adapters, max_loras=2)
    hits = []
    for name in ("all", "attn", None, "all"):
        before = llm.stats()["prefix_cache_hits"]
        assert greedy_per_adapter(llm, [name], PROMPTS[:1], MAX_TOKENS[:1])[name] == lora_expected[name][:1]
        hits.append(llm.stats()["prefix_cache_hits"] - before)
    # The same prompt: a second adapter and the base find nothing cached; the first
    # adapter again finds its own blocks.
    assert hits[0] == hits[1] == hits[2] == 0 and hits[3] > 0
    # Another adapter loaded under a name: the first one's cached blocks are not reused.
    llm.unload_lora("all")
    with pytest.raises(ValueError, match="no LoRA adapter named 'all' is loaded"):
        llm.generate(PROMPTS[:1], lora="all")
    llm.load_lora("all", str(lora_adapters["attn"]))
    assert greedy_per_adapter(llm, ["all"])["all"] == lora_expected["attn"]
    assert llm.list_loras() == ["qv-down", "attn", "mlp", "all"]
    _idle(llm)


def test_unload_is_refused_while_requests_use_the_adapter(long_llama_dir, lora_adapters):
    llm = _llm(long_llama_dir, {"all": lora_adapters["all"]})
    llm.engine.add_request("r", PROMPTS[0], SamplingParams(max_tokens=50, lora="all"))
    llm.engine.step()
    with pytest.raises(ValueError, match=r"adapter 'all' has 1 unfinished request\(s\)"):
        llm.unload_lora("all")
    # The stats and the page map name the adapter of each request (none for the base).
    llm.engine.add_request("base", PROMPTS[1], SamplingParams(max_tokens=5))
    stats = llm.stats()
    assert stats["lora_running"] == {"all": 1} and stats["lora_waiting"] == {}
    entries = {r["id"]: r for r in llm.engine.scheduler.kv_map()["requests"]}
    assert entries["r"]["lora"] == "all" and "lora" not in entries["base"]
    from folio.shared.protocol import messages as m
    _, body = m.decode(m.encode_kv_map(llm.engine.scheduler.kv_map()), m.SCHEDULER_TO_FRONTEND)
    assert {r["id"]: r.get("lora") for r in m.decode_kv_map(body)["requests"]} == \
        {"r": "all", "base": None}
    llm.engine.abort_request("base")
    llm.engine.abort_request("r")
    llm.engine.step()
    llm.unload_lora("all")
    assert llm.list_loras() == []
    _idle(llm)


# Other architectures: fused qkv_proj / gate_up_proj in the checkpoint (Phi-3), a
# mixture-of-experts model's attention with QK norms and one KV head (Qwen3-MoE; an adapter
# on its experts is refused).
OTHERS = {
    "phi3": (dict(arch="phi3", num_layers=1), ["qkv_proj", "o_proj", "gate_up_proj",
                                               "down_proj"]),
    "qwen3_moe": (dict(arch="qwen3_moe", num_experts=4, num_experts_per_tok=2,
                       moe_intermediate_size=32, mlp_only_layers=[1], num_kv_heads=1),
                  ATTENTION),
}


@pytest.mark.parametrize("arch", OTHERS)
def test_other_architectures(arch, tmp_path_factory, tokenizer_dir):
    from tests.conftest import _model_dir

    checkpoint, targets = OTHERS[arch]
    model_dir = _model_dir(tmp_path_factory, tokenizer_dir, f"lora-{arch}", **checkpoint)
    path = make_adapter(model_dir, tmp_path_factory.mktemp("adapter") / arch, seed=5,
                        rank=8, targets=targets)
    want = hf_lora_greedy(model_dir, path, PROMPTS, MAX_TOKENS)
    base = hf_lora_greedy(model_dir, None, PROMPTS, MAX_TOKENS)
    assert want != base
    if arch == "qwen3_moe":   # PEFT's adapter on every projection reaches the experts
        experts = make_adapter(model_dir, tmp_path_factory.mktemp("experts") / arch, seed=6)
        with pytest.raises(SettingError, match=r"mlp.experts' is not one the model has"):
            _llm(model_dir, {"e": experts})
    llm = _llm(model_dir, {"x": path})
    assert greedy_per_adapter(llm, ["x", None]) == {"x": want, None: base}
    _idle(llm)


def test_a_longrope_model_recomputes_each_crossing_sequence_with_its_adapter(
        tmp_path_factory, tokenizer_dir):
    """Phi-3's longrope switch recomputes a crossing sequence's cached KV with the long
    factors (executor/models/longrope.py); with LoRA that pass runs the sequence's adapter,
    so a prompt that crosses the original 64 tokens while decoding still matches PEFT."""
    import random

    from tests.conftest import _model_dir
    from tests.executor.test_models_parity import ARCHS

    model_dir = _model_dir(tmp_path_factory, tokenizer_dir, "lora-phi3-longrope",
                           **ARCHS["phi3"])
    path = make_adapter(model_dir, tmp_path_factory.mktemp("adapter") / "longrope", seed=7,
                        rank=8, targets=["qkv_proj", "o_proj", "gate_up_proj", "down_proj"])
    rng = random.Random(11)
    prompts = [[rng.randrange(3, 1024) for _ in range(n)] for n in (60, 70, 20)]
    max_tokens = [12, 6, 8]   # 60 + 12 crosses 64 while decoding; 70 starts long
    want = hf_lora_greedy(model_dir, path, prompts, max_tokens)
    assert want != hf_lora_greedy(model_dir, None, prompts, max_tokens)
    llm = _llm(model_dir, {"x": path}, max_model_len=128)
    assert greedy_per_adapter(llm, ["x"], prompts, max_tokens)["x"] == want
    _idle(llm)


# ---- bad adapters ---------------------------------------------------------------------

def _with_extra_pair(source, out, module, in_size, out_size):
    """`source` plus a LoRA pair for `module` (one the model has none for)."""
    import torch
    from safetensors.torch import load_file, save_file

    shutil.copytree(source, out)
    file = out / "adapter_model.safetensors"
    tensors = load_file(str(file))
    tensors[f"base_model.model.{module}.lora_A.weight"] = torch.ones(4, in_size)
    tensors[f"base_model.model.{module}.lora_B.weight"] = torch.ones(out_size, 4)
    save_file(tensors, str(file))
    return out


def _bad_adapters(model_dir, other_dir, good, root) -> dict:
    unreadable, dora = root / "unreadable", root / "dora"
    shutil.copytree(good, unreadable)
    (unreadable / "adapter_model.safetensors").write_bytes(b"\x08" + b"\x00" * 7 + b"{}")
    shutil.copytree(good, dora)
    config = json.loads((dora / "adapter_config.json").read_text())
    (dora / "adapter_config.json").write_text(json.dumps(config | {"use_dora": True}))
    return {
        "adapter_config.json is missing": root / "nothing-here",
        "is not a readable safetensors file": unreadable,
        "has rank 32, over --max-lora-rank 16": make_adapter(model_dir, root / "rank", 7,
                                                             rank=32, targets=["q_proj"]),
        "target module 'lm_head' is not one the model has for LoRA":
            _with_extra_pair(good, root / "head", "lm_head", 64, 1024),
        "down_proj' maps 128 -> 96 features; the model's maps 128 -> 64":
            make_adapter(other_dir, root / "other", 7, rank=4, targets=["down_proj"]),
        "DoRA adapters": dora,
    }


def test_bad_adapters_are_refused_and_good_ones_past_max_cpu_loras_page_in(
        long_llama_dir, mistral_dir, lora_adapters, lora_expected, tmp_path):
    bad = _bad_adapters(long_llama_dir, mistral_dir, lora_adapters["all"], tmp_path)
    llm = _llm(long_llama_dir, {"all": lora_adapters["all"]}, max_cpu_loras=2)
    for message, path in bad.items():
        with pytest.raises(SettingError, match=message):   # at start: nothing runs
            _llm(long_llama_dir, {"bad": path})
        with pytest.raises(ValueError, match=message):     # at run time: nothing kept
            llm.load_lora("bad", str(path))
        assert llm.list_loras() == ["all"]
    assert greedy_per_adapter(llm, ["all"], PROMPTS[:1], MAX_TOKENS[:1]) == \
        greedy_per_adapter(llm, ["all"], PROMPTS[:1], MAX_TOKENS[:1])
    with pytest.raises(ValueError, match="an adapter named 'all' is already loaded"):
        llm.load_lora("all", str(lora_adapters["attn"]))
    llm.load_lora("attn", str(lora_adapters["attn"]))
    # Past --max-cpu-loras (2) every good adapter still loads; host memory holds two and
    # the device one (max_loras 1): each request pages its adapter in (read from disk
    # again once dropped) and answers as transformers + PEFT does with it.
    for name in ("qv-down", "mlp"):
        llm.load_lora(name, str(lora_adapters[name]))
    assert llm.list_loras() == ["all", "attn", "qv-down", "mlp"]
    registry = llm.engine.executor.lora
    for name in ["all", "attn", "qv-down", "mlp", "mlp", "qv-down", "attn", "all"]:
        assert greedy_per_adapter(llm, [name], PROMPTS[:1], MAX_TOKENS[:1])[name] == \
            lora_expected[name][:1], name
        assert len(registry.host) <= 2 and list(registry.resident) == [name]
    broken = tmp_path / "broken"   # a broken one is still refused at loading
    shutil.copytree(lora_adapters["mlp"], broken)
    (broken / "adapter_model.safetensors").write_bytes(b"not safetensors")
    with pytest.raises(ValueError, match="not a readable safetensors file"):
        llm.load_lora("broken", str(broken))
    assert llm.list_loras() == ["all", "attn", "qv-down", "mlp"]
    with pytest.raises(ValueError, match="no LoRA adapter named 'nope' is loaded"):
        llm.generate(PROMPTS[:1], lora="nope")
    _idle(llm)


def test_settings_are_checked_at_start(long_llama_dir, lora_adapters):
    path = lora_adapters["all"]
    with pytest.raises(SettingError, match="lora_modules needs --enable-lora"):
        LLM(str(long_llama_dir), lora_modules=[f"a={path}"])
    with pytest.raises(SettingError, match="lora_modules names 'a' twice"):
        LLM(str(long_llama_dir), enable_lora=True, lora_modules=[f"a={path}", f"a={path}"])
    with pytest.raises(SettingError, match="lora_modules takes NAME=PATH items"):
        LLM(str(long_llama_dir), enable_lora=True, lora_modules=["nopath"])
    with pytest.raises(SettingError, match=r"max_cpu_loras \(1\) must be >= max_loras \(2\)"):
        LLM(str(long_llama_dir), enable_lora=True, max_loras=2, max_cpu_loras=1)
    with pytest.raises(ValueError, match="LoRA adapters are off"):
        LLM(str(long_llama_dir), max_model_len=64).generate(PROMPTS[:1], lora="all")


def test_speculative_decoding_and_structured_outputs_with_an_adapter(long_llama_dir,
                                                                     lora_adapters,
                                                                     lora_expected):
    llm = _llm(long_llama_dir, {"all": lora_adapters["all"]}, speculative_config=(
        '{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1}'))
    # Drafts are verified by the same forward pass, the adapter applied to their rows.
    assert greedy_per_adapter(llm, ["all"]) == {"all": lora_expected["all"]}
    assert llm.stats()["spec_decode_num_draft_tokens"] > 0
    # A grammar masks the adapter's logits as the base's.
    choice = llm.generate(PROMPTS[:1], SamplingParams(
        temperature=0.0, max_tokens=8, structured_output={"choice": ["yes", "no"]}),
        lora="all")[0].outputs[0].text
    assert choice in ("yes", "no")
    _idle(llm)
