"""Train Folio's built-in default model from text that ships with Python.

Run ``python -m folio.default_model.build`` to rebuild ``folio/default_model/weights/``.
Everything is local: the corpus is CPython's bundled documentation (``pydoc_data``, see
:func:`folio.tiny_models.python_docs_text`) with its section headings unquoted (people type
"The for statement", the docs print 'The "for" statement'), plus a few hundred ChatML
question/answer pairs made from it, each asked once with the docs' quotes around code words
and once without. The tokenizer is a byte-level BPE trained on that corpus, and the model is a
small ``LlamaForCausalLM`` trained with a plain torch loop (AdamW, warmup then cosine LR).

The run is seeded and single-threaded by default, so the same Python version (whose
``pydoc_data`` is the corpus), torch and transformers give the same weights.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import re
import sys
import time
from pathlib import Path

from folio.tiny_models import train_tokenizer

WEIGHTS_DIR = Path(__file__).resolve().parent / "weights"

EOT = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"

# Model shape: about 4 M parameters, 16 MB in float32.
MODEL = dict(vocab_size=4096, hidden_size=256, num_hidden_layers=4, num_attention_heads=8,
             num_key_value_heads=4, intermediate_size=688, max_position_embeddings=2048,
             tie_word_embeddings=True, rms_norm_eps=1e-5, rope_theta=10000.0,
             initializer_range=0.02)

# Files a build writes (and removes first from the output directory).
OUTPUT_FILES = ("config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
                "tokenizer_config.json", "chat_template.jinja", "special_tokens_map.json",
                "build_info.json")

# Training: 560 steps of 16 x 256 tokens (about 17 passes over the corpus), 11-12 minutes on
# one CPU core.
TRAIN = dict(steps=560, batch_size=16, seq_len=256, lr=2e-3, min_lr_ratio=0.1, warmup=30,
             weight_decay=0.1, grad_clip=1.0, seed=0)

_UNDERLINE = re.compile(r"^([*=\-~^])\1{2,}\s*$")

GREETINGS = [
    ("Hello!", "Hello! I am Folio's small default model. I was trained on Python's "
               "documentation, so ask me about Python statements, expressions and types."),
    ("Hi", "Hi! I am a tiny language model trained on the Python documentation."),
    ("Who are you?", "I am Folio's built-in default model, a small Llama-style model trained "
                     "on the documentation that ships with Python."),
    ("What can you do?", "I can answer short questions about the Python language, such as "
                         "statements, expressions, operators and built-in types."),
]


def _sections(text: str) -> list[tuple[str, str]]:
    """Split one pydoc topic into (title, body) pairs using its underlined headings."""
    lines = text.splitlines()
    heads = [i for i in range(len(lines) - 1)
             if lines[i].strip() and _UNDERLINE.match(lines[i + 1])
             and len(lines[i + 1].strip()) >= len(lines[i].strip()) - 2]
    out = []
    for n, i in enumerate(heads):
        end = heads[n + 1] if n + 1 < len(heads) else len(lines)
        out.append((lines[i].strip(), "\n".join(lines[i + 2:end])))
    return out


def _first_sentences(body: str, max_chars: int = 320) -> str | None:
    """The opening sentences of the first prose paragraph of a section, on one line."""
    for para in re.split(r"\n\s*\n", body):
        para = para.strip("\n")
        if not para or not (para[0].isupper() or para[0] in "\"*"):
            continue
        flat = " ".join(para.split())
        if len(flat) < 40:
            continue
        sentences = re.split(r"(?<=[.!?])\s+(?=[A-Z\"(])", flat)
        answer = ""
        for sentence in sentences:
            if answer and len(answer) + len(sentence) + 1 > max_chars:
                break
            answer = f"{answer} {sentence}".strip()
        if answer.endswith(":"):
            answer = answer[:-1] + "."
        if not answer.endswith((".", "!", "?")):
            continue
        return answer
    return None


def _question(title: str, rng: random.Random) -> str:
    subject = title
    first = title.split()[0]
    if " " in title and first[0].isupper() and (first[1:].islower() or len(first) == 1):
        subject = title[0].lower() + title[1:]
    forms = ["Tell me about {}.", "Explain {}.", "Can you describe {}?", "Describe {}."]
    if title.startswith(("The ", "A ", "An ")):
        forms += ["What is {}?", "What is {}?"]
    return rng.choice(forms).format(subject)


_QUOTED = re.compile(r'"([^"\n]{1,40})"')


def _unquote(text: str) -> str:
    """The docs quote code words ("for", "None"); people typing prompts mostly don't."""
    return _QUOTED.sub(r"\1", text)


def chat_examples(seed: int = 0, unquote_questions: bool = False) -> list[str]:
    """ChatML conversations: a user asks about a documentation section, the assistant answers
    with the section's opening sentences. Each ends with <|im_end|>."""
    from pydoc_data.topics import topics

    rng = random.Random(seed)
    pairs = list(GREETINGS)
    seen = set()
    for key in sorted(topics):
        for title, body in _sections(topics[key]):
            answer = _first_sentences(body)
            if answer and (title, answer) not in seen:
                seen.add((title, answer))
                pairs.append((_question(title, rng), answer))
    if unquote_questions:
        pairs = [(_unquote(q), a) for q, a in pairs]
    return [f"{IM_START}user\n{q}{IM_END}\n{IM_START}assistant\n{a}{IM_END}\n" for q, a in pairs]


def _unquote_headings(text: str) -> str:
    """'The "for" statement' over its underline becomes 'The for statement', which is how
    people type it; the quoted form stays in the prose."""
    lines = text.split("\n")
    for i in range(len(lines) - 1):
        if lines[i].strip() and _UNDERLINE.match(lines[i + 1]):
            lines[i] = _unquote(lines[i])
    return "\n".join(lines)


def corpus_documents(seed: int = 0) -> list[str]:
    """The training documents: each pydoc topic (headings unquoted), plus the chat examples
    twice, once as generated and once with the quotes dropped from the questions."""
    from pydoc_data.topics import topics

    docs = [_unquote_headings(topics[key]) for key in sorted(topics)]
    docs += chat_examples(seed) + chat_examples(seed, unquote_questions=True)
    return docs


def _paragraph_starts(text: str) -> list[int]:
    """Character offsets of prose paragraphs (a capital letter after a blank line)."""
    return [m.end() for m in re.finditer(r"\n\n(?=[A-Z])", text)]


def _make_tokenizer_config_portable(out: Path) -> None:
    """Let transformers 4.x load the tokenizer too: transformers 5 writes its own class name
    and keeps the chat template only in chat_template.jinja."""
    path = out / "tokenizer_config.json"
    config = json.loads(path.read_text(encoding="utf-8"))
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    config.setdefault("additional_special_tokens", [IM_START, IM_END])
    template = out / "chat_template.jinja"
    if template.exists() and "chat_template" not in config:
        config["chat_template"] = template.read_text(encoding="utf-8")
    path.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def _cosine_lr(step: int, cfg: dict) -> float:
    if step < cfg["warmup"]:
        return cfg["lr"] * (step + 1) / cfg["warmup"]
    progress = (step - cfg["warmup"]) / max(1, cfg["steps"] - cfg["warmup"])
    floor = cfg["lr"] * cfg["min_lr_ratio"]
    return floor + 0.5 * (cfg["lr"] - floor) * (1 + math.cos(math.pi * progress))


def build(out_dir: str | Path = WEIGHTS_DIR, steps: int | None = None, threads: int = 1,
          dtype: str = "float32", log=print) -> dict:
    """Train the tokenizer and the model and save both into ``out_dir``. Returns a summary."""
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM, AutoTokenizer

    cfg = dict(TRAIN)
    if steps is not None:
        cfg["steps"] = steps
    torch.set_num_threads(threads)
    torch.manual_seed(cfg["seed"])
    rng = random.Random(cfg["seed"])
    start = time.time()

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for name in OUTPUT_FILES:  # only what a previous build wrote; never the whole directory
        (out / name).unlink(missing_ok=True)

    # Tokenizer: trained on the docs and the chat examples with their markers removed (the
    # special tokens are added by train_tokenizer itself).
    docs = corpus_documents(cfg["seed"])
    plain = "\n\n".join(docs)
    for special in (IM_START, IM_END, EOT):
        plain = plain.replace(special, "")
    train_tokenizer(out, vocab_size=MODEL["vocab_size"], text=plain)
    _make_tokenizer_config_portable(out)
    tok = AutoTokenizer.from_pretrained(str(out))
    eot_id = tok.convert_tokens_to_ids(EOT)
    im_end_id = tok.convert_tokens_to_ids(IM_END)
    assert eot_id == 0, eot_id

    # One token stream, documents separated by <|endoftext|>, in a seeded shuffled order.
    # Remember where documents and prose paragraphs start, to begin some windows there.
    order = list(range(len(docs)))
    rng.shuffle(order)
    stream: list[int] = []
    doc_starts: list[int] = []
    para_starts: list[int] = []
    for i in order:
        enc = tok(docs[i], add_special_tokens=False, return_offsets_mapping=True)
        wanted = set(_paragraph_starts(docs[i]))
        para_starts += [len(stream) + j for j, (a, _) in enumerate(enc["offset_mapping"])
                        if a in wanted]
        doc_starts.append(len(stream))
        stream.extend(enc["input_ids"])
        stream.append(eot_id)
    data = torch.tensor(stream, dtype=torch.long)
    T, B = cfg["seq_len"], cfg["batch_size"]
    doc_starts = [s for s in doc_starts if s + T + 1 <= len(stream)]
    para_starts = [s for s in para_starts if s + T + 1 <= len(stream)]
    log(f"corpus: {len(docs)} documents, {len(para_starts)} paragraphs, {len(stream)} tokens; "
        f"{cfg['steps']} steps x {B} x {T} = {cfg['steps'] * B * T / len(stream):.1f} epochs")

    config = LlamaConfig(**MODEL, bos_token_id=None, eos_token_id=eot_id, pad_token_id=eot_id)
    model = LlamaForCausalLM(config)
    n_params = sum(p.numel() for p in model.parameters())
    log(f"model: {n_params / 1e6:.2f} M parameters")

    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": cfg["weight_decay"]},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=cfg["lr"], betas=(0.9, 0.95))
    gen = torch.Generator().manual_seed(cfg["seed"])
    model.train()
    losses = []
    for step in range(cfg["steps"]):
        # A quarter of the rows start at a document (so the model sees beginnings of text
        # and of conversations), a quarter at a prose paragraph, half at a random offset.
        quarter = B // 4
        starts = [doc_starts[int(i)] for i in
                  torch.randint(0, len(doc_starts), (quarter,), generator=gen)]
        starts += [para_starts[int(i)] for i in
                   torch.randint(0, len(para_starts), (quarter,), generator=gen)]
        starts += torch.randint(0, len(stream) - T - 1, (B - len(starts),),
                                generator=gen).tolist()
        batch = torch.stack([data[s:s + T] for s in starts])
        for group in opt.param_groups:
            group["lr"] = _cosine_lr(step, cfg)
        loss = model(input_ids=batch, labels=batch).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg["grad_clip"])
        opt.step()
        losses.append(loss.item())
        if step % 20 == 0 or step == cfg["steps"] - 1:
            recent = sum(losses[-20:]) / len(losses[-20:])
            log(f"step {step:4d}  loss {loss.item():.3f}  avg20 {recent:.3f}  "
                f"lr {_cosine_lr(step, cfg):.2e}  {time.time() - start:.0f}s")

    model.eval()
    model = model.to(getattr(torch, dtype))
    model.generation_config = GenerationConfig(bos_token_id=None, eos_token_id=[eot_id, im_end_id],
                                               pad_token_id=eot_id, do_sample=False)
    model.save_pretrained(str(out), safe_serialization=True)
    final = sum(losses[-20:]) / len(losses[-20:])
    summary = {"parameters": n_params, "corpus_tokens": len(stream), "steps": cfg["steps"],
               "batch_size": B, "seq_len": T, "first_loss": losses[0], "final_loss_avg20": final,
               "train_seconds": round(time.time() - start, 1), "dtype": dtype,
               "python": sys.version.split()[0], "model": MODEL, "train": cfg}
    (out / "build_info.json").write_text(json.dumps(summary, indent=2) + "\n")
    log(f"saved to {out}: final loss {final:.3f} in {summary['train_seconds']}s")
    return summary


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(WEIGHTS_DIR), help="output directory")
    parser.add_argument("--steps", type=int, default=None,
                        help=f"training steps (default {TRAIN['steps']})")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1)")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    args = parser.parse_args(argv)
    build(args.out, steps=args.steps, threads=args.threads, dtype=args.dtype,
          log=lambda msg: print(msg, flush=True))


if __name__ == "__main__":
    main()
