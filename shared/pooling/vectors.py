"""What the executor returns for a pooled request, and how it becomes an answer.

The executor sends each pooled request's vector as little-endian float32 bytes: the pooled
hidden state (not normalised), or for a scorer the softmax over its two score tokens'
logits. Truncation to `dimensions` (Matryoshka) comes before normalising, so a truncated
embedding is unit length too.
"""

from __future__ import annotations

import base64

import numpy as np


def to_bytes(values) -> bytes:
    return np.asarray(values, dtype="<f4").tobytes()


def from_bytes(data: bytes) -> np.ndarray:
    return np.frombuffer(data, dtype="<f4")


def embedding(data: bytes, normalize: bool, dimensions: int | None = None) -> np.ndarray:
    """The answer's vector (float32): truncated to `dimensions`, then normalised."""
    vector = from_bytes(data)
    if dimensions is not None:
        vector = vector[:dimensions]
    if normalize:
        norm = float(np.linalg.norm(vector.astype(np.float64)))
        vector = vector / max(norm, 1e-12)
    return vector.astype(np.float32)


def score(data: bytes) -> float:
    """A scorer's probability of its `for` token (the second of the two)."""
    return float(from_bytes(data)[1])


def encode(vector: np.ndarray, encoding_format: str) -> list[float] | str:
    """OpenAI's encoding_format: "float" a list, "base64" the float32 bytes in base64."""
    if encoding_format == "base64":
        return base64.b64encode(vector.astype("<f4").tobytes()).decode("ascii")
    return vector.tolist()
