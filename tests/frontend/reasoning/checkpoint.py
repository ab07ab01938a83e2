"""A tiny checkpoint that reasons, deterministically: a Qwen3-style tokenizer (<think> and
</think> are tokens of its vocabulary) and thinking template (the generation prompt opens
<think>; enable_thinking false closes it empty), and a llama made by transformers whose
weights are set so that each token of ANSWER predicts the next one, the last one the end
of text. Its one layer adds nothing (o_proj and down_proj zero), so the last hidden state
is the last token's embedding: one-hot per chain token, and lm_head maps it to its
successor with a large margin. The model really writes `</think>` as a token, at any
sampling temperature; nothing in the server is told what to answer."""

from __future__ import annotations

from pathlib import Path

REASONING = "Let me add"
ANSWER_TEXT = "Result: four"
# What the model writes after the generation prompt's "<think>\n" (no token twice: each
# one's successor is fixed). After "</think>" (where a prompt with thinking off ends) it
# writes the answer alone.
OUTPUT = f"{REASONING} </think> {ANSWER_TEXT}"
TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' }}"
    "{% if message.get('reasoning_content') %}"
    "{{ '<think>\n' + message['reasoning_content'] + '\n</think>\n\n' }}{% endif %}"
    "{{ message['content'] + '<|im_end|>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}"
    "{% if enable_thinking is defined and not enable_thinking %}"
    "{{ '<think>\n\n</think>' }}{% else %}{{ '<think>\n' }}{% endif %}{% endif %}")
VOCAB = 1024
_MARGIN = 10.0


def chain_ids(tokenizer) -> list[int]:
    """The prompt's last token, then the answer's tokens, then the end of text."""
    opened = tokenizer.apply_chat_template([{"role": "user", "content": "2+2?"}],
                                           add_generation_prompt=True, tokenize=True)
    if hasattr(opened, "keys"):
        opened = opened["input_ids"]
    output = tokenizer.encode(OUTPUT, add_special_tokens=False)
    return [list(opened)[-1], *output, tokenizer.eos_token_id]


def make_reasoning_checkpoint(out: Path) -> list[int]:
    """Write the checkpoint to `out`; returns the tokens it generates (eos included)."""
    import torch
    from transformers import AutoTokenizer, LlamaForCausalLM

    from folio.tiny_models import make_random_checkpoint, train_tokenizer

    train_tokenizer(out, vocab_size=VOCAB - 8)
    tokenizer = AutoTokenizer.from_pretrained(str(out))
    tokenizer.add_tokens(["<think>", "</think>"])   # Qwen3's: not special, kept in text
    tokenizer.chat_template = TEMPLATE
    tokenizer.save_pretrained(str(out))
    chain = chain_ids(tokenizer)
    assert len(set(chain)) == len(chain), "each chain token must lead to one successor"
    make_random_checkpoint(out, vocab_size=VOCAB, num_layers=1, max_position_embeddings=4096)
    model = LlamaForCausalLM.from_pretrained(str(out))
    hidden = model.config.hidden_size
    assert len(chain) <= hidden
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        model.model.norm.weight.fill_(1.0)
        model.lm_head.weight.zero_()
        for i, (token, successor) in enumerate(zip(chain, chain[1:])):
            model.model.embed_tokens.weight[token] = torch.nn.functional.one_hot(
                torch.tensor(i), hidden).float()
            model.lm_head.weight[successor, i] = _MARGIN
    model.save_pretrained(str(out))
    return chain[1:]
