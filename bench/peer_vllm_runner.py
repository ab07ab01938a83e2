"""Runs one offline workload through vLLM (`vllm.LLM`) and writes tok/s and the output ids.

Run by bench/peer.py with the peer virtual environment's python; imports only vLLM and the
standard library, so it never needs Folio installed:

    /work/peer/vllm-venv/bin/python bench/peer_vllm_runner.py \
        --model DIR --workload in.json --out out.json

The workload file holds {"prompts": [[token ids], ...], "outputs": [max_tokens, ...]};
the result file {"seconds", "output_tokens", "tok_per_s", "token_ids", "vllm_version"}.
"""

from __future__ import annotations

import argparse
import json
import time


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--workload", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--engine-kwargs", default="{}",
                        help="JSON object of extra vllm.LLM keyword arguments")
    args = parser.parse_args()

    import vllm
    from vllm import LLM, SamplingParams

    with open(args.workload) as f:
        work = json.load(f)
    prompts, outputs = work["prompts"], work["outputs"]
    kwargs = dict(dtype="float32", skip_tokenizer_init=True, seed=0)
    kwargs.update(json.loads(args.engine_kwargs))
    llm = LLM(model=args.model, **kwargs)

    def params(count: int) -> SamplingParams:
        # detokenize=False: there is no tokenizer; ids are what we compare.
        return SamplingParams(temperature=0, max_tokens=count, ignore_eos=True,
                              detokenize=False)

    llm.generate([{"prompt_token_ids": prompts[0][:16]}], params(2), use_tqdm=False)  # warm-up
    requests = [{"prompt_token_ids": p} for p in prompts]
    start = time.perf_counter()
    results = llm.generate(requests, [params(n) for n in outputs], use_tqdm=False)
    elapsed = time.perf_counter() - start
    token_ids = [list(r.outputs[0].token_ids) for r in results]
    produced = sum(map(len, token_ids))
    with open(args.out, "w") as f:
        json.dump({"seconds": elapsed, "output_tokens": produced, "tok_per_s": produced / elapsed,
                   "token_ids": token_ids, "vllm_version": vllm.__version__,
                   "engine_kwargs": kwargs}, f)


if __name__ == "__main__":
    main()
