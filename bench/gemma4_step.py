"""One user's decode on a random Gemma 4 (per-layer inputs, kv-shared layers, double-wide
MLPs) with the Python layers (decode_step="python") and the native step
(kernels/cpu/gemma4_step.cpp, decode_step="auto"), through folio.LLM on the CPU.

    python bench/gemma4_step.py                          # hidden 512, 12 layers, float32
    python bench/gemma4_step.py --dtype bfloat16 --tokens 128 --repeats 3
    python bench/gemma4_step.py --tiny --tokens 4 --repeats 1   # only checks that it runs

The checkpoint is made by transformers in a temporary directory (hidden 512, 12 layers of
which 2 global and the last 4 kv-shared, 8 heads / 2 KV heads of 64 (global 128), MLP 1536,
per-layer inputs 64 wide, vocab 8192; about 58M parameters). Both engines load it; after a
warm-up request each generates --tokens greedy tokens after a 32-token prompt, alternately,
--repeats times; the best time over the tokens is printed per path, with the ratio and
whether both gave the same tokens. The figures that count come from a quiet machine; on a
shared one they only show it runs.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

SMALL = dict(vocab_size=8192, hidden_size=512, intermediate_size=1536, num_hidden_layers=12,
             num_attention_heads=8, num_key_value_heads=2, head_dim=64, global_head_dim=128,
             sliding_window=128, num_kv_shared_layers=4, hidden_size_per_layer_input=64,
             vocab_size_per_layer_input=8192)
TINY = dict(vocab_size=1024, hidden_size=64, intermediate_size=96, num_hidden_layers=6,
            num_attention_heads=4, num_key_value_heads=2, head_dim=16, global_head_dim=32,
            sliding_window=16, num_kv_shared_layers=2, hidden_size_per_layer_input=8,
            vocab_size_per_layer_input=1024)


def make_checkpoint(directory: Path, tiny: bool) -> int:
    """A random Gemma4ForCausalLM saved in `directory`; returns its parameter count."""
    import torch
    import transformers as hf

    widths = TINY if tiny else SMALL
    layers = widths["num_hidden_layers"]
    config = hf.Gemma4TextConfig(
        **widths, use_double_wide_mlp=True, max_position_embeddings=2048,
        layer_types=(["sliding_attention"] * (layers // 2 - 1) + ["full_attention"]) * 2,
        bos_token_id=None, eos_token_id=0, pad_token_id=0)
    torch.manual_seed(0)
    model = hf.Gemma4ForCausalLM(config)
    model.save_pretrained(str(directory), safe_serialization=True)
    return sum(p.numel() for p in model.parameters())


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--tiny", action="store_true")
    args = parser.parse_args(argv)
    from folio import LLM, SamplingParams

    with tempfile.TemporaryDirectory() as directory:
        params_count = make_checkpoint(Path(directory), args.tiny)
        print(f"parameters: {params_count / 1e6:.1f}M, {args.dtype}, one user, "
              f"{args.tokens} tokens after a 32-token prompt")
        engines = {path: LLM(directory, skip_tokenizer_init=True, device="cpu",
                             num_kv_blocks=64, dtype=args.dtype, decode_step=path)
                   for path in ("python", "auto")}
        prompt = list(range(1, 33))
        params = SamplingParams(temperature=0, max_tokens=args.tokens + 1, ignore_eos=True)
        best, tokens = {}, {}
        for llm in engines.values():
            llm.generate([prompt], params)   # warm-up
        for _ in range(args.repeats):
            for path, llm in engines.items():
                start = time.perf_counter()
                tokens[path] = llm.generate([prompt], params)[0].outputs[0].token_ids
                elapsed = (time.perf_counter() - start) / args.tokens
                best[path] = min(best.get(path, elapsed), elapsed)
    for path, label in (("python", "Python layers"), ("auto", "native step")):
        print(f"  {label:<14} {best[path] * 1e3:8.2f} ms/token")
    same = "yes" if tokens["python"] == tokens["auto"] else "no"
    print(f"  ratio {best['python'] / best['auto']:.2f}x, same tokens: {same}")


if __name__ == "__main__":
    main()
