"""The native decode step: the transformer layers of a small step (decodes) in one C++ call,
kernels/cpu/decode_step.cpp, for the llama-style models it covers on the CPU, and
kernels/cpu/hybrid_step.cpp for the dense hybrids' decode-only steps (hybrid.py).

select.py decides once, at load, whether a model's steps take it (and logs why not);
layers.py reads a decoder's modules into the C++ object; step.py calls it; hybrid.py does
both for a hybrid.
"""

from folio.executor.native_step.select import DECODE_STEPS, MAX_TOKENS, select_decode_step

__all__ = ["DECODE_STEPS", "MAX_TOKENS", "select_decode_step"]
