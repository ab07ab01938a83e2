"""AWQ checkpoints made by AutoAWQ itself (PyPI `autoawq`, its GEMM layout), quantized on the
CPU from a tiny random Llama with token-id calibration samples (no dataset download), and the
library's own dequantization of what it wrote (awq.utils.packing_utils.dequantize_gemm)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from tests.conftest import TOKENIZER_FILES

GROUP = 32
QUANT_CONFIG = {"zero_point": True, "q_group_size": GROUP, "w_bit": 4, "version": "GEMM"}
# AutoAWQ's clipping search takes output channels 64 at a time: every projection here has a
# multiple of 64 rows (hidden 128, two KV heads of 32).
SHAPE = {"hidden_size": 128, "intermediate_size": 256, "num_heads": 4, "num_kv_heads": 2}
CALIBRATION = [[(7 * i + 3 * j) % 1000 + 1 for j in range(32)] for i in range(4)]


def _awq():
    # imported on use: the package warns at import that it is archived (see docs/models.md)
    from awq import AutoAWQForCausalLM
    from awq.utils.packing_utils import dequantize_gemm
    return AutoAWQForCausalLM, dequantize_gemm


def make_checkpoint(source: Path, out: Path) -> Path:
    """`source` (a float Llama of SHAPE) quantized by AutoAWQ into `out`."""
    auto_awq, _ = _awq()
    model = auto_awq.from_pretrained(str(source), device_map="cpu")
    model.quantize(None, quant_config=QUANT_CONFIG, calib_data=CALIBRATION,
                   max_calib_samples=len(CALIBRATION), max_calib_seq_len=32)
    model.save_quantized(str(out))
    for file in TOKENIZER_FILES:
        if (source / file).exists():
            shutil.copy(source / file, out / file)
    return out


def library_dequantized(path: Path, dtype: torch.dtype | None = None
                        ) -> dict[str, torch.Tensor]:
    """"<module>.weight" [N, K] -> AutoAWQ's dequantize_gemm of that layer. With dtype
    float32 the float16 scales are widened first (the same values), so that (q - z) * s is
    not rounded to float16 as the library gives it from the file as written."""
    _, dequantize_gemm = _awq()
    tensors = load_file(str(path / "model.safetensors"))
    weights = {}
    for name in tensors:
        if name.endswith(".qweight"):
            module = name.removesuffix(".qweight")
            scales = tensors[f"{module}.scales"]
            weights[f"{module}.weight"] = dequantize_gemm(
                tensors[name], tensors[f"{module}.qzeros"],
                scales if dtype is None else scales.to(dtype), 4, GROUP).T.contiguous()
    return weights


def write_dequantized(path: Path, out: Path) -> Path:
    """An ordinary float32 checkpoint of the AWQ one: its float tensors (the norms AutoAWQ
    rescaled, embeddings, lm_head) and, for each quantized layer, the library's float32
    dequantization."""
    shutil.copytree(path, out)
    tensors = {name: tensor.float() for name, tensor in
               load_file(str(path / "model.safetensors")).items()
               if not name.endswith((".qweight", ".qzeros", ".scales"))}
    tensors.update(library_dequantized(path, torch.float32))
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads((out / "config.json").read_text())
    config.pop("quantization_config")
    config["torch_dtype"] = config["dtype"] = "float32"
    (out / "config.json").write_text(json.dumps(config))
    return out
