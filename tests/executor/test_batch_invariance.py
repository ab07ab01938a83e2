"""A request's greedy tokens, and the logprobs they come with to the last bit, do not depend
on what else is in its batch: one prompt alone,
then inside batches of 2, 8, 17 and 64 requests of other lengths (its rows meet decode rows,
prompt chunks, the native step's small batches and the layer loop's large ones), in every
weight format the CPU executor runs."""

from __future__ import annotations

import random

import pytest

from folio import LLM, SamplingParams
from folio.kernels import cpu_attention
from folio.kernels.vnni_layout import vnni_available

pytestmark = pytest.mark.skipif(not cpu_attention.load().ok,
                                reason="the CPU operators are not built")

FORMATS = {"float32": dict(dtype="float32"), "bfloat16": dict(dtype="bfloat16"),
           "int8": dict(dtype="float32", quantization="int8"),
           "int4": dict(dtype="float32", quantization="int4")}


@pytest.mark.parametrize("name", FORMATS)
def test_greedy_tokens_ignore_the_batch(name, llama_dir):
    if "quantization" in FORMATS[name] and not vnni_available():
        pytest.skip("quantized weights are batch-invariant on the AVX-512 VNNI kernel only "
                    "(the portable kernels switch arithmetic at 8 rows: docs/cpu.md)")
    llm = LLM(str(llama_dir), skip_tokenizer_init=True, device="cpu", num_kv_blocks=512,
              max_num_seqs=64, **FORMATS[name])
    try:
        rng = random.Random(0)
        vocab = llm.engine.executor.model_config.vocab_size
        prompt = [rng.randrange(1, vocab) for _ in range(11)]
        params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, logprobs=2)

        def answer(output):   # tokens, and every logprob bit for bit
            sample = output.outputs[0]
            return sample.token_ids, [{t: p.logprob for t, p in entry.items()}
                                      for entry in sample.logprobs]

        alone = answer(llm.generate([prompt], params)[0])
        for size in (2, 8, 17, 64):
            others = [[rng.randrange(1, vocab) for _ in range(rng.randrange(1, 40))]
                      for _ in range(size - 1)]
            others_params = [SamplingParams(temperature=0, max_tokens=rng.randrange(1, 20),
                                            ignore_eos=True) for _ in others]
            place = rng.randrange(size)
            batch = others[:place] + [prompt] + others[place:]
            batch_params = others_params[:place] + [params] + others_params[place:]
            outputs = llm.generate(batch, batch_params)
            assert answer(outputs[place]) == alone, size
    finally:
        llm.close()
