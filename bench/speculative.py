"""Speculative decoding (n-gram prompt lookup, or suffix decoding with --method suffix) on vs
off for one user, offline (folio.LLM):
a copy-heavy prompt ("repeat this text" + a paragraph of Python's pydoc_data topics, the
model's chat template applied) and a prompt with nothing to copy, alternated A B A B.

    python -m bench.speculative --model /tmp/smol/f32 --rounds 3 --max-tokens 128

Prints one JSON line per run (mode, tok/s, steps, drafts accepted) and the machine's load
average, since the figures move with what else runs."""

from __future__ import annotations

import argparse
import json
import os
import time


TOPICS = ("assert", "assignment", "async", "booleans", "calls", "class", "comparisons",
          "compound", "dict", "exceptions", "for", "function", "global", "import", "try",
          "raise")
SUBJECTS = ("a lighthouse keeper and a storm", "a cat who learns to fly", "the last train",
            "a baker's secret recipe", "a robot gardener", "two rival chess players",
            "a lost map", "the coldest winter", "a talking river", "an old violin",
            "a city under the sea", "the moon's day off", "a forgotten library",
            "a clockmaker's apprentice", "a desert caravan", "a kite that would not land")


def copy_prompt(tokenizer, chars: int, index: int = 0) -> list[int]:
    import pydoc_data.topics

    text = pydoc_data.topics.topics[TOPICS[index % len(TOPICS)]][:chars]
    return _chat(tokenizer, "Repeat the following text exactly, word for word:\n\n" + text)


def fresh_prompt(tokenizer, index: int = 0) -> list[int]:
    return _chat(tokenizer, f"Write a short story about {SUBJECTS[index % len(SUBJECTS)]}.")


def _chat(tokenizer, content: str) -> list[int]:
    messages = [{"role": "user", "content": content}]
    if getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True,
                                             tokenize=False)
        return tokenizer.encode(text, add_special_tokens=False)
    return tokenizer.encode(content)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--method", choices=("ngram", "suffix"), default="ngram")
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--chars", type=int, default=1200)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--concurrency", type=int, default=1,
                        help="requests at once (offline: one generate call)")
    parser.add_argument("--max-running", type=int, default=4,
                        help="the policy's threshold (set it high to measure drafts anyway)")
    args = parser.parse_args()

    from folio import LLM, SamplingParams

    lookup = {"prompt_lookup_max": 4, "prompt_lookup_min": 2} if args.method == "ngram" \
        else {}
    spec = json.dumps({"method": args.method, "num_speculative_tokens": args.k, **lookup,
                       "max_running": args.max_running})
    engines = {"off": LLM(args.model, dtype=args.dtype, device="cpu", num_kv_blocks=512),
               "on": LLM(args.model, dtype=args.dtype, device="cpu", num_kv_blocks=512,
                         speculative_config=spec)}
    tokenizer = engines["off"].tokenizer
    count = args.concurrency
    prompts = {"copy": [copy_prompt(tokenizer, args.chars, i) for i in range(count)],
               "fresh": [fresh_prompt(tokenizer, i) for i in range(count)]}
    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens, ignore_eos=True)
    for llm in engines.values():   # warm up: first-call costs out of the figures
        llm.generate(prompts["fresh"][:1], SamplingParams(temperature=0.0, max_tokens=4))
    for round_index in range(args.rounds):
        for workload, prompt in prompts.items():
            outputs = {}
            for mode in ("off", "on") if round_index % 2 == 0 else ("on", "off"):
                llm = engines[mode]
                before = llm.stats()
                start = time.perf_counter()
                results = [r.outputs[0].token_ids for r in llm.generate(prompt, params)]
                seconds = time.perf_counter() - start
                after = llm.stats()
                outputs[mode] = results
                tokens = sum(map(len, results))
                print(json.dumps({
                    "round": round_index, "workload": workload, "mode": mode,
                    "concurrency": count, "prompt_tokens": sum(map(len, prompt)),
                    "tokens": tokens, "tok_s": round(tokens / seconds, 1),
                    "steps": after["steps"] - before["steps"],
                    "accepted": after.get("spec_decode_num_accepted_tokens", 0)
                    - before.get("spec_decode_num_accepted_tokens", 0),
                    "load": round(os.getloadavg()[0], 1)}), flush=True)
            assert outputs["on"] == outputs["off"], "speculation changed a greedy output"


if __name__ == "__main__":
    main()
