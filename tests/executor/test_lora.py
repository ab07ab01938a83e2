"""LoRA adapters (docs/lora.md): greedy output with each adapter token-identical to
transformers + PEFT in float32, alone and with several adapters and the base model mixed in
one batch, under preemption (recompute and swap) and prefix caching; bad adapters refused
with their cause and nothing kept."""

from __future__ import annotations

import json
import shutil

import pytest

from folio import LLM, SamplingParams
from folio.shared.settings import SettingError
from tests.lora_adapters import ATTENTION, hf_lora_greedy, make_adapter

pytestmark = pytest.mark.parity

# Three prompts: one spans several 16-token blocks, so prefix caching and preemption matter.
PROMPTS = [[5, 6, 7, 8, 9] * 9, [11, 12, 13] * 7, [100, 200, 300]]
MAX_TOKENS = [14, 10, 8]
# name -> (seed, rank, alpha, targets, rsLoRA): every projection, a subset of a fused
# module's slices with rsLoRA, attention only, and the MLP only.
ADAPTERS = {"all": (1, 8, 16, None, False), "qv-down": (2, 4, 8, ["q_proj", "v_proj",
                                                                   "down_proj"], True),
            "attn": (3, 16, 8, ATTENTION, False), "mlp": (4, 2, 4, ["gate_proj", "up_proj",
                                                                     "down_proj"], False)}


@pytest.fixture(scope="module")
def adapters(llama_dir, tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("loras")
    return {name: make_adapter(llama_dir, root / name, seed, rank, alpha, targets, rs)
            for name, (seed, rank, alpha, targets, rs) in ADAPTERS.items()}


@pytest.fixture(scope="module")
def expected(llama_dir, adapters) -> dict:
    refs = {name: hf_lora_greedy(llama_dir, path, PROMPTS, MAX_TOKENS)
            for name, path in adapters.items()}
    refs[None] = hf_lora_greedy(llama_dir, None, PROMPTS, MAX_TOKENS)
    return refs


def _llm(model_dir, adapters, **args) -> LLM:
    return LLM(str(model_dir), dtype="float32", device="cpu", enable_lora=True,
               lora_modules=[f"{n}={p}" for n, p in adapters.items()], **args)


def _run(llm, names, prompts=PROMPTS, max_tokens=MAX_TOKENS):
    """Every prompt with every adapter of `names` (None: the base), all in one generate."""
    jobs = [(name, i) for name in names for i in range(len(prompts))]
    outputs = llm.generate([prompts[i] for _, i in jobs],
                           [SamplingParams(temperature=0.0, max_tokens=max_tokens[i])
                            for _, i in jobs], lora=[name for name, _ in jobs])
    got: dict = {}
    for (name, _), output in zip(jobs, outputs):
        got.setdefault(name, []).append(output.outputs[0].token_ids)
    return got


def _idle(llm) -> None:
    stats = llm.stats()
    assert stats["kv_blocks_free"] == stats["kv_blocks_total"]
    assert stats["num_running"] == stats["num_waiting"] == stats["num_swapped"] == 0


def test_adapters_change_the_output(expected):
    # Otherwise matching transformers + PEFT would prove nothing about the adapters.
    for name in ADAPTERS:
        assert expected[name] != expected[None], name


def test_each_adapter_alone_and_all_mixed_with_the_base(llama_dir, adapters, expected):
    llm = _llm(llama_dir, adapters, max_loras=4)
    for name in ADAPTERS:
        assert _run(llm, [name])[name] == expected[name], name
    got = _run(llm, [*ADAPTERS, None])
    assert got == {name: expected[name] for name in [*ADAPTERS, None]}
    _idle(llm)


def test_fewer_slots_than_adapters_in_the_queue(llama_dir, adapters, expected):
    # max_loras=2: requests of a third adapter wait until one adapter's requests are done.
    llm = _llm(llama_dir, adapters, max_loras=2)
    got = _run(llm, [*ADAPTERS, None])
    assert got == {name: expected[name] for name in [*ADAPTERS, None]}
    _idle(llm)


@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_mixed_under_preemption(llama_dir, adapters, expected, mode):
    llm = _llm(llama_dir, adapters, max_loras=4, num_kv_blocks=10, max_num_batched_tokens=64,
               preemption_mode=mode, num_swap_blocks=64)
    got = _run(llm, [*ADAPTERS, None])
    assert got == {name: expected[name] for name in [*ADAPTERS, None]}
    assert llm.stats()[f"preemptions_{mode}"] > 0
    _idle(llm)


def test_prefix_cache_never_shares_blocks_between_adapters(llama_dir, adapters, expected):
    llm = _llm(llama_dir, adapters, max_loras=4)
    hits = []
    for name in ("all", "attn", None, "all"):
        before = llm.stats()["prefix_cache_hits"]
        assert _run(llm, [name], PROMPTS[:1], MAX_TOKENS[:1])[name] == expected[name][:1]
        hits.append(llm.stats()["prefix_cache_hits"] - before)
    # The same prompt: a second adapter and the base find nothing cached; the first
    # adapter again finds its own blocks.
    assert hits[0] == hits[1] == hits[2] == 0 and hits[3] > 0
    _idle(llm)


def test_load_unload_and_reload_under_the_same_name(llama_dir, adapters, expected):
    llm = LLM(str(llama_dir), dtype="float32", device="cpu", enable_lora=True,
              max_cpu_loras=2)
    llm.load_lora("x", str(adapters["all"]))
    assert _run(llm, ["x"])["x"] == expected["all"]
    llm.unload_lora("x")
    with pytest.raises(ValueError, match="no LoRA adapter named 'x' is loaded"):
        llm.generate(PROMPTS[:1], lora="x")
    # Another adapter under the name: the first one's cached blocks must not be reused.
    llm.load_lora("x", str(adapters["attn"]))
    assert _run(llm, ["x"])["x"] == expected["attn"]
    assert llm.list_loras() == ["x"]
    _idle(llm)


def test_other_architectures(qwen2_dir, tmp_path):
    # Qwen2: biased qkv, one KV head, tied embeddings.
    path = make_adapter(qwen2_dir, tmp_path / "q", seed=5, rank=8)
    want = hf_lora_greedy(qwen2_dir, path, PROMPTS, MAX_TOKENS)
    llm = _llm(qwen2_dir, {"q": path})
    assert _run(llm, ["q"])["q"] == want
    _idle(llm)


# ---- bad adapters ---------------------------------------------------------------------

@pytest.fixture(scope="module")
def bad(llama_dir, mistral_dir, adapters, tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("bad-loras")
    paths = {"missing": root / "nothing-here",
             "rank": make_adapter(llama_dir, root / "rank", 7, rank=32),
             "head": _with_extra_pair(adapters["all"], root / "head", "lm_head", 64, 1024),
             "other-base": make_adapter(mistral_dir, root / "other", 7, rank=4)}
    unreadable = root / "unreadable"
    shutil.copytree(adapters["all"], unreadable)
    (unreadable / "adapter_model.safetensors").write_bytes(b"\x08" + b"\x00" * 7 + b"{}")
    paths["unreadable"] = unreadable
    dora = root / "dora"
    shutil.copytree(adapters["all"], dora)
    config = json.loads((dora / "adapter_config.json").read_text())
    (dora / "adapter_config.json").write_text(json.dumps(config | {"use_dora": True}))
    paths["dora"] = dora
    return paths


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


@pytest.mark.parametrize("case, message", [
    ("missing", "adapter_config.json is missing"),
    ("unreadable", "is not a readable safetensors file"),
    ("rank", "has rank 32, over --max-lora-rank 16"),
    ("head", "target module 'lm_head' is not one the model has for LoRA"),
    ("other-base", r"down_proj. maps 128 -> 96 features; the model.s maps 128 -> 64"),
    ("dora", "DoRA adapters"),
])
def test_bad_adapter_is_refused_with_its_cause(llama_dir, adapters, bad, case, message):
    with pytest.raises(SettingError, match=message):   # at start: nothing runs
        _llm(llama_dir, {"bad": bad[case]})
    llm = _llm(llama_dir, {"all": adapters["all"]}, max_cpu_loras=3)
    with pytest.raises(ValueError, match=message):     # at run time: nothing kept
        llm.load_lora("bad", str(bad[case]))
    assert llm.list_loras() == ["all"]
    assert _run(llm, ["all"])["all"] == _run(llm, ["all"])["all"]


def test_names_and_limits(llama_dir, adapters):
    llm = _llm(llama_dir, {"all": adapters["all"]}, max_cpu_loras=2)
    with pytest.raises(ValueError, match="an adapter named 'all' is already loaded"):
        llm.load_lora("all", str(adapters["attn"]))
    llm.load_lora("attn", str(adapters["attn"]))
    with pytest.raises(ValueError, match=r"the most --max-cpu-loras \(2\) allows"):
        llm.load_lora("mlp", str(adapters["mlp"]))
    assert llm.list_loras() == ["all", "attn"]
    with pytest.raises(ValueError, match="no LoRA adapter named 'nope' is loaded"):
        llm.generate(PROMPTS[:1], lora="nope")
    _idle(llm)
    with pytest.raises(SettingError, match="lora_modules needs --enable-lora"):
        LLM(str(llama_dir), lora_modules=[f"a={adapters['all']}"])
    with pytest.raises(SettingError, match="lora_modules names 'a' twice"):
        LLM(str(llama_dir), enable_lora=True, lora_modules=["a=/x", "a=/y"])
    with pytest.raises(SettingError, match="lora_modules takes NAME=PATH items"):
        LLM(str(llama_dir), enable_lora=True, lora_modules=["nopath"])
    with pytest.raises(ValueError, match="LoRA adapters are off"):
        LLM(str(llama_dir)).generate(PROMPTS[:1], lora="all")
