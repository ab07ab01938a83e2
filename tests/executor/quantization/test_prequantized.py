"""Pre-quantized checkpoints (executor/quantization/prequantized.py): compressed-tensors int8, AWQ int4 and
GPTQ int4/int8 written here from llama_dir's float weights with this file's own quantizers
and packers (written from the formats' descriptions, not from the loader), then served kept
quantized: each layer holds exactly the file's dequantized weight, and the model gives the
logits and greedy tokens of an ordinary float checkpoint holding those dequantized values."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from folio.executor.quantization.prequantized_config import read_quantization_config
from folio.executor.quantization.prequantized import quantized_weight
from folio.executor.quantization.weight_only_linear import WeightOnlyLinear
from folio.shared.sampling_params import SamplingParams
from tests.conftest import TOKENIZER_FILES

PROMPTS = [[5, 6, 7, 8, 9, 10, 11, 12], [300, 12, 999, 4, 77, 1]]
AWQ_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]   # AutoAWQ: nibble i holds column AWQ_ORDER[i] of 8
LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")

# name -> (quantization_config, bits, group or None for per channel)
FORMATS = {
    "awq": ({"quant_method": "awq", "bits": 4, "group_size": 32, "zero_point": True,
             "version": "gemm"}, 4, 32),
    "gptq4": ({"quant_method": "gptq", "bits": 4, "group_size": 64, "desc_act": True,
               "sym": False, "checkpoint_format": "gptq"}, 4, 64),
    "gptq8": ({"quant_method": "gptq", "bits": 8, "group_size": -1, "desc_act": False,
               "sym": True, "checkpoint_format": "gptq"}, 8, None),
    "compressed_int8": ({
        "quant_method": "compressed-tensors", "format": "int-quantized",
        "quantization_status": "compressed", "ignore": ["lm_head"],
        "config_groups": {"group_0": {
            "targets": ["Linear"],
            "weights": {"num_bits": 8, "type": "int", "symmetric": True,
                        "strategy": "channel", "dynamic": False},
            "input_activations": {"num_bits": 8, "type": "int", "symmetric": True,
                                  "strategy": "token", "dynamic": True}}}}, 8, None),
    "compressed_w4a16": ({
        "quant_method": "compressed-tensors", "format": "pack-quantized",
        "config_groups": {"group_0": {"targets": ["Linear"], "weights": {
            "num_bits": 4, "type": "int", "symmetric": True, "strategy": "group",
            "group_size": 32, "actorder": None}}}}, 4, 32),
    "compressed_w8a16": ({
        "quant_method": "compressed-tensors", "format": "pack-quantized",
        "config_groups": {"group_0": {"targets": ["Linear"], "weights": {
            "num_bits": 8, "type": "int", "symmetric": True, "strategy": "channel"}}}}, 8,
        None),
}


# -- the test's own quantizers and packers ---------------------------------------------------

def to_int32(words: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(words.astype(np.uint32).view(np.int32).copy())


def pack_rows(values: np.ndarray, bits: int) -> np.ndarray:
    """[R, C] -> [R, C * bits / 32]: along C, value j of each word at bits * j."""
    per = 32 // bits
    rows, cols = values.shape
    grouped = values.astype(np.uint64).reshape(rows, cols // per, per)
    return sum(grouped[..., j] << (bits * j) for j in range(per))


def quantize_asymmetric(w: np.ndarray, group: int, bits: int):
    """w [N, K] -> (q [N, K], zeros, scales float16 [N, K / group]), per group of K."""
    n, k = w.shape
    top = 2 ** bits - 1
    grouped = w.reshape(n, k // group, group)
    low, high = grouped.min(axis=2), grouped.max(axis=2)
    scales = ((high - low) / top).astype(np.float16)
    zeros = np.clip(np.round(-low / scales.astype(np.float32)), 0, top)
    q = np.clip(np.round(grouped / scales[..., None].astype(np.float32)) + zeros[..., None],
                0, top)
    return q.reshape(n, k).astype(np.int64), zeros.astype(np.int64), scales


def dequantize(q: np.ndarray, zeros: np.ndarray, scales: np.ndarray) -> np.ndarray:
    n, k = q.shape
    groups = scales.shape[1]
    return ((q.reshape(n, groups, -1) - zeros[..., None]).astype(np.float32)
            * scales[..., None].astype(np.float32)).reshape(n, k)


def awq_parts(w: np.ndarray, group: int):
    q, zeros, scales = quantize_asymmetric(w, group, 4)   # [N, K], [N, G]

    def pack(values_kn):   # [R, N] -> [R, N / 8] in AutoAWQ's order
        rows, cols = values_kn.shape
        eights = values_kn.reshape(rows, cols // 8, 8)
        return sum(eights[..., AWQ_ORDER[i]].astype(np.uint64) << (4 * i) for i in range(8))

    parts = {"qweight": to_int32(pack(q.T)), "qzeros": to_int32(pack(zeros.T)),
             "scales": torch.from_numpy(scales.T.copy())}
    return parts, dequantize(q, zeros, scales)


def gptq_parts(w: np.ndarray, group: int | None, bits: int, sym: bool):
    n, k = w.shape
    group = group or k
    if sym:
        scales = (np.abs(w.reshape(n, k // group, group)).max(axis=2)
                  / (2 ** (bits - 1) - 1)).astype(np.float16)
        zeros = np.full(scales.shape, 2 ** (bits - 1), dtype=np.int64)
        q = np.clip(np.round(w.reshape(n, k // group, group)
                             / scales[..., None].astype(np.float32)) + zeros[..., None],
                    0, 2 ** bits - 1).reshape(n, k).astype(np.int64)
    else:
        q, zeros, scales = quantize_asymmetric(w, group, bits)
    stored_zeros = (zeros - 1) & (2 ** bits - 1)          # the classic format's z - 1
    parts = {"qweight": to_int32(pack_rows(q, bits).T),   # along K: [K * bits / 32, N]
             "qzeros": to_int32(pack_rows(stored_zeros.T, bits)),
             "scales": torch.from_numpy(scales.T.copy()),
             "g_idx": torch.arange(k, dtype=torch.int32) // group}
    return parts, dequantize(q, zeros, scales)


def compressed_int8_parts(w: np.ndarray):
    scales = torch.from_numpy(np.abs(w).max(axis=1, keepdims=True) / 127).to(torch.bfloat16)
    q = torch.round(torch.from_numpy(w) / scales.float()).clamp(-127, 127).to(torch.int8)
    parts = {"weight": q, "weight_scale": scales,
             "weight_zero_point": torch.zeros(w.shape[0], 1, dtype=torch.int8)}
    return parts, (q.float() * scales.float()).numpy()


def compressed_packed_parts(w: np.ndarray, bits: int, group: int | None):
    """pack-quantized: symmetric q stored as q + 2 ** (bits - 1), packed along K."""
    n, k = w.shape
    group = group or k
    top = 2 ** (bits - 1) - 1
    grouped = torch.from_numpy(w).reshape(n, k // group, group)
    scales = (grouped.abs().amax(dim=2) / top).to(torch.float16)
    q = torch.round(grouped / scales[..., None].float()).clamp(-top, top).reshape(n, k)
    parts = {"weight_packed": to_int32(pack_rows((q + 2 ** (bits - 1)).long().numpy(), bits)),
             "weight_scale": scales, "weight_shape": torch.tensor([n, k])}
    dequantized = (q.reshape(n, k // group, group) * scales[..., None].float()).reshape(n, k)
    return parts, dequantized.numpy()


def quantize_layer(name: str, w: np.ndarray):
    config, bits, group = FORMATS[name]
    if config.get("format") == "pack-quantized":
        return compressed_packed_parts(w, bits, group)
    if name == "awq":
        return awq_parts(w, group)
    if name.startswith("gptq"):
        return gptq_parts(w, group, bits, sym=config["sym"])
    return compressed_int8_parts(w)


def write_checkpoints(name: str, source: Path, root: Path) -> tuple[Path, Path]:
    """(the pre-quantized checkpoint, an ordinary float one with its dequantized weights)."""
    config = json.loads((source / "config.json").read_text())
    quantized, reference = root / f"{name}-quantized", root / f"{name}-float"
    tensors, floats = {}, {}
    for tensor_name, tensor in load_file(str(source / "model.safetensors")).items():
        module, _, leaf = tensor_name.rpartition(".")
        if leaf == "weight" and module.rpartition(".")[2] in LINEARS:
            parts, dequantized = quantize_layer(name, tensor.float().numpy())
            tensors.update({f"{module}.{part}": value for part, value in parts.items()})
            floats[tensor_name] = torch.from_numpy(np.ascontiguousarray(dequantized))
        else:
            tensors[tensor_name] = floats[tensor_name] = tensor
    for path, weights, extra in ((quantized, tensors, {"quantization_config": FORMATS[name][0]}),
                                 (reference, floats, {})):
        path.mkdir()
        for file in TOKENIZER_FILES:
            if (source / file).exists():
                shutil.copy(source / file, path / file)
        (path / "config.json").write_text(json.dumps({**config, **extra}))
        save_file({k: v.contiguous() for k, v in weights.items()}, str(path / "model.safetensors"))
    return quantized, reference


@pytest.fixture(scope="module")
def checkpoints(llama_dir, qwen2_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("prequantized")
    made = {name: write_checkpoints(name, llama_dir, root) for name in FORMATS}
    # q/k/v biases (kept float beside the packed weights), one KV head, tied embeddings
    (root / "qwen2").mkdir()
    made["awq_qwen2"] = write_checkpoints("awq", qwen2_dir, root / "qwen2")
    return made


# -- tests ------------------------------------------------------------------------------------

def test_packing_round_trips_through_the_loaders_unpacking():
    """unpack(pack(q)) == q for AutoAWQ's column order, GPTQ's order along K and
    compressed-tensors' offset values: the loader's weight dequantizes to exactly this
    file's (q - z) * s."""
    rng = np.random.default_rng(1)
    w = rng.standard_normal((16, 64)).astype(np.float32)
    for parts, expected, scheme in (
            (*awq_parts(w, 32), read_quantization_config({"quantization_config":
                                                          FORMATS["awq"][0]})),
            (*gptq_parts(w, 32, 4, sym=True), read_quantization_config(
                {"quantization_config": {"quant_method": "gptq", "bits": 4,
                                         "group_size": 32}})),
            (*gptq_parts(w, None, 8, sym=True), read_quantization_config(
                {"quantization_config": FORMATS["gptq8"][0]})),
            (*compressed_packed_parts(w, 4, 32), read_quantization_config(
                {"quantization_config": FORMATS["compressed_w4a16"][0]})),
            (*compressed_packed_parts(w, 8, None), read_quantization_config(
                {"quantization_config": FORMATS["compressed_w8a16"][0]}))):
        weight = quantized_weight(parts, scheme)
        assert weight.shape == (16, 64)
        assert torch.equal(weight.dequantize(), torch.from_numpy(expected))


def _serve(path: Path, **engine_args):
    from folio import LLM

    llm = LLM(str(path), dtype="float32", device="cpu", num_kv_blocks=64,
              quantized_activations="float", **engine_args)
    outs = llm.generate(PROMPTS, SamplingParams(max_tokens=4, temperature=0,
                                                prompt_logprobs=5))
    logprobs = [[{token: entry.logprob for token, entry in position.items()}
                 for position in out.prompt_logprobs[1:]] for out in outs]
    tokens = [out.outputs[0].token_ids for out in outs]
    return llm, logprobs, tokens


@pytest.mark.usefixtures("cpu_ops_built")
@pytest.mark.parametrize("name", [*FORMATS, "awq_qwen2"])
def test_prequantized_serves_the_dequantized_model(name, checkpoints):
    quantized_path, reference_path = checkpoints[name]
    _, bits, _ = FORMATS[name.removesuffix("_qwen2")]
    llm, logprobs, tokens = _serve(quantized_path)
    model = llm.engine.executor.model
    kept = {n: m for n, m in model.named_modules() if isinstance(m, WeightOnlyLinear)}
    # every attention and MLP linear is kept, fused q/k/v and gate/up from their parts;
    # the float lm_head stays float
    assert sum(n.endswith(("qkv_proj", "o_proj", "gate_up_proj", "down_proj"))
               for n in kept) == 8
    assert all(m.bits == bits for m in kept.values()) and "lm_head" not in kept
    reference = load_file(str(reference_path / "model.safetensors"))
    layer = kept["layers.0.self_attn.qkv_proj"].quantized_weight().dequantize()
    expected = torch.cat([reference[f"model.layers.0.self_attn.{p}.weight"]
                          for p in ("q_proj", "k_proj", "v_proj")])
    assert torch.equal(layer, expected)
    if name == "awq_qwen2":   # the float biases loaded into the quantized layer
        assert torch.equal(kept["layers.0.self_attn.qkv_proj"].bias, torch.cat(
            [reference[f"model.layers.0.self_attn.{p}.bias"] for p in ("q_proj", "k_proj",
                                                                       "v_proj")]))
    assert torch.equal(kept["layers.1.mlp.down_proj"].quantized_weight().dequantize(),
                       reference["model.layers.1.mlp.down_proj.weight"])

    reference_llm, float_logprobs, float_tokens = _serve(reference_path)
    assert llm.engine.executor.num_params == reference_llm.engine.executor.num_params
    assert tokens == float_tokens
    for got, want in zip([p for prompt in logprobs for p in prompt],
                         [p for prompt in float_logprobs for p in prompt]):
        assert got.keys() == want.keys()
        for token, logprob in want.items():
            assert abs(got[token] - logprob) < 1e-3


def test_no_float_weight_is_allocated_for_quantized_layers(checkpoints):
    from folio.executor.model_loader import load_model
    from folio.executor.models.hf_config import read_model_config
    from folio.executor.ops import select_ops

    path = checkpoints["gptq4"][0]
    cpu = torch.device("cpu")
    model = load_model(path, read_model_config(path), select_ops("torch", cpu), torch.float32,
                       cpu, 64)
    names = [name for name, _ in model.named_parameters()]
    assert "lm_head.weight" in names and "layers.1.input_layernorm.weight" in names
    assert not [name for name in names
                if name.endswith(("qkv_proj.weight", "o_proj.weight", "gate_up_proj.weight",
                                  "down_proj.weight"))]


@pytest.mark.usefixtures("cpu_ops_built")
def test_quantization_flag_quantizes_only_the_float_layers(checkpoints):
    """--quantization int8 with an AWQ checkpoint: its int4 layers stay as in the file, the
    float lm_head goes to int8 (as a GGUF file's float layers do)."""
    llm, _, tokens = _serve(checkpoints["awq"][0], quantization="int8")
    kept = {n: m.bits for n, m in llm.engine.executor.model.named_modules()
            if isinstance(m, WeightOnlyLinear)}
    assert kept.pop("lm_head") == 8
    assert set(kept.values()) == {4} and len(kept) == 8
    assert all(len(t) == 4 for t in tokens)


@pytest.mark.parametrize("quant, cause", [
    ({"quant_method": "gptq", "bits": 3, "group_size": 128}, "3 bits"),
    ({"quant_method": "awq", "bits": 4, "group_size": 48, "zero_point": True}, "48"),
    ({"quant_method": "awq", "bits": 4, "group_size": 128, "version": "gemv"}, "gemv"),
    ({"quant_method": "gptq", "bits": 8, "group_size": 128, "sym": False}, "asymmetric int8"),
    ({"quant_method": "gptq", "bits": 4, "checkpoint_format": "marlin"}, "marlin"),
    ({"quant_method": "compressed-tensors", "format": "float-quantized", "config_groups": {
        "g": {"weights": {"num_bits": 8, "type": "float"}}}}, "fp8"),
    ({"quant_method": "compressed-tensors", "format": "int-quantized", "config_groups": {
        "g": {"weights": {"num_bits": 8, "type": "int", "symmetric": False}}}},
     "asymmetric int8"),
    ({"quant_method": "compressed-tensors", "format": "pack-quantized", "config_groups": {
        "g": {"weights": {"num_bits": 2, "type": "int"}}}}, "2 bits"),
    ({"quant_method": "compressed-tensors", "format": "int-quantized", "config_groups": {
        "g": {"weights": {"num_bits": 8, "type": "int"}}}, "sparsity_config": {"format":
                                                                             "sparse-24"}},
     "sparsity"),
    ({"quant_method": "bitsandbytes"}, "bitsandbytes"),
])
def test_layouts_that_do_not_map_are_refused_by_name(quant, cause):
    with pytest.raises(ValueError, match=cause):
        read_quantization_config({"quantization_config": quant})


def test_refusals_before_any_weight_is_read(checkpoints, tmp_path):
    from folio.preflight import check_engine
    from folio.shared.config import EngineConfig, SettingError

    awq = str(checkpoints["awq"][0])
    with pytest.raises(SettingError, match="CPU executor only") as error:
        check_engine(EngineConfig(model=awq, device="cuda", skip_tokenizer_init=True))
    assert error.value.setting == "device"
    gemv = tmp_path / "gemv"
    shutil.copytree(awq, gemv)
    config = json.loads((gemv / "config.json").read_text())
    config["quantization_config"]["version"] = "gemv"
    (gemv / "config.json").write_text(json.dumps(config))
    with pytest.raises(SettingError, match="AWQ version 'gemv'") as error:
        check_engine(EngineConfig(model=str(gemv), device="cpu", skip_tokenizer_init=True))
    assert error.value.setting == "model"
    # GPTQ act-order whose g_idx is not the trivial order
    reordered = tmp_path / "act-order"
    shutil.copytree(checkpoints["gptq4"][0], reordered)
    tensors = load_file(str(reordered / "model.safetensors"))
    g_idx = tensors["model.layers.0.mlp.down_proj.g_idx"]
    tensors["model.layers.0.mlp.down_proj.g_idx"] = g_idx.flip(0).contiguous()
    save_file(tensors, str(reordered / "model.safetensors"))
    result = subprocess.run([sys.executable, "-m", "folio", "serve", "--model", str(reordered),
                             "--device", "cpu"], capture_output=True, text=True, timeout=120,
                            check=False)
    assert result.returncode == 2, result.stderr
    [line] = result.stderr.strip().splitlines()
    assert "act-order" in line and "g_idx" in line and "down_proj" in line
