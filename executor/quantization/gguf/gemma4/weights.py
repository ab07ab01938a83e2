"""A Gemma 4 GGUF file's tensors under the Hugging Face checkpoint's names, dequantized to
float32 one at a time; executor/models/gemma4/loader.py then places them as it places a
checkpoint's (skipping the k/v tensors of KV-shared layers, as it does there).

The converter transposes nothing and shifts no norm: a tensor's values are the
checkpoint's, its stacked experts already [experts, out, in] as the model holds them. A
layer without layer_output_scale (llama.cpp's is optional) gets the scalar 1 it stands
for."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

from folio.executor.quantization.gguf.file import field
from folio.executor.quantization.gguf.gemma4.names import CONFIG_TENSORS, gemma4_hf_name


def iterate_gemma4_weights(reader: Any, arch: str) -> Iterator[tuple[str, torch.Tensor]]:
    from gguf.quants import dequantize

    names = set()
    for tensor in reader.tensors:
        if tensor.name in CONFIG_TENSORS:
            continue
        name = gemma4_hf_name(tensor.name)
        if name is None:   # refused already by open_gguf's checks (gemma4/validate.py)
            raise ValueError(f"GGUF tensor {tensor.name!r} has no place in Folio's {arch}")
        names.add(name)
        values = dequantize(tensor.data, tensor.tensor_type).astype(np.float32, copy=False)
        values = np.ascontiguousarray(values)
        if not values.flags.writeable:   # an F32 tensor is a view of the read-only map
            values = values.copy()
        yield name, torch.from_numpy(values)
    for layer in range(field(reader, f"{arch}.block_count")):
        name = f"model.layers.{layer}.layer_scalar"
        if name not in names:
            yield name, torch.ones(1)
