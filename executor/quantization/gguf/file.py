"""Opens a GGUF file (llama.cpp's single-file checkpoint) and checks what Folio can read of
it, before any weight is dequantized (no torch import: the command line's checks run this
before any process starts)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

# The tensor types gguf.quants.dequantize turns into floats, all dequantized to --dtype at
# load (none is kept quantized in memory yet).
SUPPORTED_TYPES = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q2_K",
                   "Q3_K", "Q4_K", "Q5_K", "Q6_K")


def is_gguf(path: str | Path) -> bool:
    return str(path).lower().endswith(".gguf")


def is_directory_or_gguf(path: str | Path) -> bool:
    """Where a checkpoint or its tokenizer can be: a directory, or one GGUF file."""
    return Path(path).is_dir() or (is_gguf(path) and Path(path).is_file())


def open_gguf(path: str | Path) -> Any:
    """A gguf.GGUFReader over `path`; ValueError (one line naming the file and the field) for
    a file that is not a sound GGUF, whose metadata does not match its tensors, or that holds
    a tensor type Folio cannot dequantize. The header is read bounded and checked first:
    GGUFReader allocates whatever a crafted header declares."""
    from gguf import GGUFReader

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no such GGUF file {path}")
    check_gguf_file(path)
    try:
        return GGUFReader(str(path))
    except (ValueError, IndexError, KeyError, OSError, TypeError) as error:
        raise ValueError(f"{path.name} is not a readable GGUF file ({error})") from None


def check_gguf_file(path: Path) -> None:
    """The bounded header checks (header.py, validate.py), with the tensor types."""
    from folio.executor.quantization.gguf.names import GGUF_ARCHITECTURES
    from folio.executor.quantization.gguf.header import GgufFormatError, read_gguf_header
    from folio.executor.quantization.gguf.validate import check_gguf_header

    try:
        header = read_gguf_header(path)
        check_gguf_header(header, GGUF_ARCHITECTURES)
    except GgufFormatError as error:
        raise ValueError(f"{path.name}: {error}") from None
    except OSError as error:
        raise ValueError(f"{path.name} is not a readable GGUF file ({error})") from None
    gpt_oss = header.metadata.get("general.architecture")
    gpt_oss = gpt_oss is not None and gpt_oss.value == "gpt-oss"
    for tensor in header.tensors:
        if tensor.type_name == "MXFP4" and gpt_oss:
            continue   # its experts' (gguf/gpt_oss/validate.py checked which tensors)
        if tensor.type_name not in SUPPORTED_TYPES:
            raise ValueError(f"{path.name}: tensor {tensor.name} is of GGUF type "
                             f"{tensor.type_name}; Folio reads {', '.join(SUPPORTED_TYPES)}")


def field(reader: Any, key: str, default: Any = None) -> Any:
    """A metadata value: a number, a string or a list."""
    entry = reader.fields.get(key)
    return default if entry is None else entry.contents()


def float32_decimal(value: float) -> float:
    """A float32 metadata value as the decimal the converter was given (1e-06, not
    9.99999997e-07): the float32 checkpoint's config.json value, exactly."""
    import numpy as np

    return float(str(np.float32(value)))
