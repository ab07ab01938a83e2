"""The built-in default model ships with the package, loads with transformers, and was trained."""

from __future__ import annotations

import string

import pytest

from folio.default_model import default_model_path

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

MAX_BYTES = 25 * 1024 * 1024
ALLOWED = set(string.ascii_letters + string.digits + string.punctuation + " \n\t")


@pytest.fixture(scope="module")
def model_and_tokenizer():
    path = default_model_path()
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(path))
    model = transformers.AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32)
    model.eval()
    return model, tokenizer


def test_files_exist_and_are_small():
    path = default_model_path()
    for name in ("config.json", "generation_config.json", "model.safetensors",
                 "tokenizer.json", "tokenizer_config.json"):
        assert (path / name).is_file(), name
    total = sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
    assert total < MAX_BYTES, f"default model weighs {total} bytes"


def test_config_is_a_small_llama(model_and_tokenizer):
    model, tokenizer = model_and_tokenizer
    config = model.config
    assert config.model_type == "llama"
    assert config.max_position_embeddings >= 2048
    assert config.num_key_value_heads < config.num_attention_heads  # GQA
    assert len(tokenizer) <= config.vocab_size
    eos = model.generation_config.eos_token_id
    assert tokenizer.convert_tokens_to_ids("<|endoftext|>") in eos
    assert tokenizer.convert_tokens_to_ids("<|im_end|>") in eos


def test_greedy_text_reads_like_words(model_and_tokenizer):
    model, tokenizer = model_and_tokenizer
    ids = tokenizer("The for statement", return_tensors="pt").input_ids
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=40, do_sample=False)
    new = out[0, ids.shape[1]:].tolist()
    assert len(new) >= 10
    assert len(set(new)) > 1, "the same token over and over: untrained weights?"
    wordlike = [t for t in new if (piece := tokenizer.decode([t])) and set(piece) <= ALLOWED]
    assert len(wordlike) >= 0.8 * len(new), tokenizer.decode(new)


def test_trained_on_python_docs(model_and_tokenizer):
    """Random weights would score about ln(vocab) = 8.3 nats per token here."""
    model, tokenizer = model_and_tokenizer
    text = ("The \"for\" statement is used to iterate over the elements of a sequence\n"
            "(such as a string, tuple or list) or other iterable object:")
    ids = tokenizer(text, return_tensors="pt").input_ids
    with torch.no_grad():
        loss = model(input_ids=ids, labels=ids).loss.item()
    assert loss < 4.0, loss


def test_chat_answer_ends_with_im_end(model_and_tokenizer):
    model, tokenizer = model_and_tokenizer
    messages = [{"role": "user", "content": "What is the \"while\" statement?"}]
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True,
                                        return_tensors="pt", return_dict=True)["input_ids"]
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=120, do_sample=False)
    new = out[0, ids.shape[1]:].tolist()
    assert tokenizer.convert_tokens_to_ids("<|im_end|>") in new, tokenizer.decode(new)
