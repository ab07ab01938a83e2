"""GGUF files served directly: small files written here from the tiny llama checkpoint the
way llama.cpp's converter writes them (tests/executor/quantization/gguf_files.py), nothing downloaded.

An F32 file gives exactly the tokens of the safetensors checkpoint it was made from; a
quantized one, dequantized in float32, gives the tokens transformers' own GGUF loading gives
for the same file; bad files are refused before any process starts."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

import numpy as np
import pytest
import torch

from folio.executor.quantization.gguf.weights import unpermute_rows
from folio.executor.models.hf_config import read_model_config
from folio.shared.hf_tokenizer import load_tokenizer
from folio.shared.sampling_params import SamplingParams
from tests.conftest import TEST_DEVICE
from tests.executor.quantization.gguf_files import permute_rows, serve_refusal, write_llama_gguf

PROMPT_IDS = [[5, 6, 7, 8], [300, 12, 999, 4, 77, 1]]
GREEDY = SamplingParams(max_tokens=16, temperature=0.0)


QUANTS = ("F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1")
K_QUANTS = ("Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K")


@pytest.fixture(scope="module")
def gguf_dir(tmp_path_factory, llama_dir) -> Path:
    path = tmp_path_factory.mktemp("gguf")
    for quant in ("F32", *QUANTS):
        write_llama_gguf(llama_dir, path / f"tiny-{quant}.gguf", quant)
    return path


@pytest.fixture(scope="module")
def k_quant_dir(tmp_path_factory, tokenizer_dir) -> Path:
    """K-quant blocks hold 256 weights: a llama whose rows are multiples of 256."""
    from tests.conftest import _model_dir

    model = _model_dir(tmp_path_factory, tokenizer_dir, "llama256", arch="llama",
                       hidden_size=256, intermediate_size=512)
    path = tmp_path_factory.mktemp("gguf_k")
    for quant in K_QUANTS:
        write_llama_gguf(model, path / f"tiny-{quant}.gguf", quant)
    return path


def _folio_tokens(model: Path, prompts) -> list[list[int]]:
    from folio import LLM

    # float activations: a quantized file's tokens are transformers' (which multiplies its
    # dequantized weights); the default int8 activations of decode batches round x as
    # llama.cpp does, and a tiny random model's near-ties then differ.
    llm = LLM(str(model), dtype="float32", device=TEST_DEVICE, num_kv_blocks=64,
              quantized_activations="float")
    return [list(out.outputs[0].token_ids) for out in llm.generate(prompts, GREEDY)]


def _transformers_tokens(gguf_file: Path, prompts: list[list[int]]) -> list[list[int]]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(gguf_file.parent),
                                                 gguf_file=gguf_file.name,
                                                 dtype=torch.float32).eval()
    tokens = []
    for ids in prompts:
        out = model.generate(torch.tensor([ids]), max_new_tokens=GREEDY.max_tokens,
                             do_sample=False, eos_token_id=None, pad_token_id=0)
        tokens.append(out[0, len(ids):].tolist())
    return tokens


@pytest.fixture(scope="module")
def qwen_ggufs(tmp_path_factory, tokenizer_dir, qwen2_dir) -> dict[str, tuple[Path, Path]]:
    """Per architecture: its safetensors checkpoint, and a directory with its GGUF files.
    Qwen2 (biases, tied embeddings, MQA) and Qwen3 (q/k norms) are stored unpermuted."""
    from tests.conftest import _model_dir

    # head_dim 128: transformers' GGUF reading takes Qwen3's default, not the file's.
    qwen3_dir = _model_dir(tmp_path_factory, tokenizer_dir, "qwen3", arch="qwen3",
                           head_dim=128)
    made = {}
    for arch, model in (("qwen2", qwen2_dir), ("qwen3", qwen3_dir)):
        path = tmp_path_factory.mktemp(f"gguf_{arch}")
        for quant in ("F32", "Q8_0"):
            write_llama_gguf(model, path / f"{arch}-{quant}.gguf", quant, architecture=arch)
        made[arch] = (model, path)
    return made


def test_unpermute_undoes_the_converters_permutation():
    rows = np.arange(8 * 3 * 2, dtype=np.float32).reshape(8 * 2, 3)   # 2 heads of 8
    permuted = permute_rows(rows, 2)
    assert not np.array_equal(permuted, rows)
    assert np.array_equal(unpermute_rows(permuted, 2), rows)


def test_config_from_metadata_equals_the_checkpoints(llama_dir, gguf_dir):
    from_dir = asdict(read_model_config(llama_dir))
    from_gguf = asdict(read_model_config(gguf_dir / "tiny-F32.gguf"))
    # The tokenizer's eos; the directory's generation_config names the same token.
    assert from_gguf == from_dir


def test_tokenizer_and_chat_template_come_from_the_file(llama_dir, gguf_dir):
    ours, theirs = load_tokenizer(gguf_dir / "tiny-F32.gguf"), load_tokenizer(llama_dir)
    text = "def f(x):\n    return x ** 2  # ünïcode <|im_end|>"
    assert ours(text).input_ids == theirs(text).input_ids
    messages = [{"role": "user", "content": "What is a list?"}]
    rendered = ours.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert rendered == theirs.apply_chat_template(messages, tokenize=False,
                                                  add_generation_prompt=True)
    assert "<|im_start|>assistant" in rendered


def test_f32_gguf_gives_the_safetensors_checkpoints_tokens(llama_dir, gguf_dir):
    prompts = ["The Python language", *PROMPT_IDS]
    assert _folio_tokens(gguf_dir / "tiny-F32.gguf", prompts) == \
        _folio_tokens(llama_dir, prompts)


def test_llama3_rope_scaling_comes_back_from_rope_freqs(llama3_rope_dir, tmp_path):
    """llama.cpp stores Llama 3.1's rope scaling as per-frequency divisors; the parameters
    fitted back give the checkpoint's config and tokens, past the original length."""
    path = write_llama_gguf(llama3_rope_dir, tmp_path / "llama3.gguf", "F32")
    config = read_model_config(path)
    assert config.rope.rope_type == "llama3"
    assert asdict(config) == asdict(read_model_config(llama3_rope_dir))
    long_prompt = [(7 * i) % 1000 + 3 for i in range(90)]   # past the original 64
    prompts = [long_prompt, *PROMPT_IDS]
    assert _folio_tokens(path, prompts) == _folio_tokens(llama3_rope_dir, prompts)


@pytest.mark.parametrize("head_dim, rope", [
    (128, {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
           "original_max_position_embeddings": 8192}),      # Llama 3.1 / 3.2
    (64, {"factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 8192}),       # Llama 3.2 1B's head
    (16, {"factor": 4.0, "low_freq_factor": 1.0, "high_freq_factor": 2.0,
          "original_max_position_embeddings": 256}),
])
def test_llama3_rope_parameters_give_back_the_divisors(head_dim, rope):
    from folio.executor.quantization.gguf.rope import llama3_divisors, llama3_rope_parameters

    from tests.executor.quantization.gguf_files import llama3_rope_freqs

    rope = {"rope_type": "llama3", **rope}
    divisors = llama3_rope_freqs(rope, 500000.0, head_dim)
    fitted = llama3_rope_parameters(divisors, 500000.0, head_dim)
    wavelen = 2 * np.pi * 500000.0 ** (np.arange(0, head_dim, 2) / head_dim)
    assert np.allclose(llama3_divisors(fitted, wavelen), divisors, rtol=1e-5)
    if head_dim == 128:   # enough blended frequencies to pin every parameter
        assert fitted == rope


@pytest.mark.parametrize("arch", ["qwen2", "qwen3"])
def test_qwen_ggufs_give_the_checkpoints_and_transformers_tokens(qwen_ggufs, arch):
    model, path = qwen_ggufs[arch]
    assert asdict(read_model_config(path / f"{arch}-F32.gguf")) == \
        asdict(read_model_config(model))
    prompts = ["The Python language", *PROMPT_IDS]
    assert _folio_tokens(path / f"{arch}-F32.gguf", prompts) == _folio_tokens(model, prompts)
    quantized = path / f"{arch}-Q8_0.gguf"
    assert _folio_tokens(quantized, PROMPT_IDS) == \
        _transformers_tokens(quantized, PROMPT_IDS)


@pytest.mark.parametrize("quant", QUANTS)
def test_quantized_gguf_gives_transformers_tokens(gguf_dir, quant):
    path = gguf_dir / f"tiny-{quant}.gguf"
    assert _folio_tokens(path, PROMPT_IDS) == _transformers_tokens(path, PROMPT_IDS)


@pytest.mark.parametrize("quant", K_QUANTS)
def test_k_quant_gguf_gives_transformers_tokens(k_quant_dir, quant):
    path = k_quant_dir / f"tiny-{quant}.gguf"
    assert _folio_tokens(path, PROMPT_IDS) == _transformers_tokens(path, PROMPT_IDS)


def test_q4_0_is_not_the_f32_model(gguf_dir):
    """The quantized files differ from F32 enough to change greedy tokens, so the test above
    compares dequantization, not just the permutation."""
    assert _folio_tokens(gguf_dir / "tiny-Q4_0.gguf", PROMPT_IDS) != \
        _folio_tokens(gguf_dir / "tiny-F32.gguf", PROMPT_IDS)


def _bad_files(llama_dir: Path, out: Path) -> dict[str, tuple[Path, str]]:
    import gguf

    whole = write_llama_gguf(llama_dir, out / "whole.gguf", "Q8_0")
    truncated = out / "truncated.gguf"
    truncated.write_bytes(whole.read_bytes()[:whole.stat().st_size - 100])
    iq = write_llama_gguf(llama_dir, out / "iq.gguf", "F32")
    data = iq.read_bytes()
    # One tensor info's type (after its name, dim count and dims) rewritten to I32.
    name = b"blk.0.attn_k.weight"
    at = data.index(name) + len(name) + 4 + 2 * 8
    assert int.from_bytes(data[at:at + 4], "little") == gguf.GGMLQuantizationType.F32
    iq.write_bytes(data[:at] + int(gguf.GGMLQuantizationType.I32).to_bytes(4, "little")
                   + data[at + 4:])
    return {
        "truncated": (truncated, "truncated"),
        "architecture": (write_llama_gguf(llama_dir, out / "gpt2.gguf", architecture="gpt2"),
                         "unsupported GGUF architecture 'gpt2'"),
        "quant type": (iq, "of GGUF type I32"),
        "stray tensor": (write_llama_gguf(llama_dir, out / "stray.gguf", extra_tensors={
            "blk.0.attn_qkv.weight": np.zeros((4, 4), np.float32)}), "'blk.0.attn_qkv.weight'"),
        "rope factors": (write_llama_gguf(llama_dir, out / "rope.gguf", extra_tensors={
            "rope_freqs.weight": np.array([1, 3, 1, 5, 2, 8, 1, 2], np.float32)}),
            "does not follow Llama 3's rope scaling"),
    }


def test_bad_gguf_files_are_refused_naming_model(llama_dir, tmp_path):
    from folio import LLM

    for case, (path, words) in _bad_files(llama_dir, tmp_path).items():
        with pytest.raises(ValueError) as caught:
            LLM(str(path), num_kv_blocks=64)
        message = str(caught.value)
        assert "model" in message and words in message and "\n" not in message, (case, message)


def test_cli_refuses_a_truncated_gguf_in_one_line_exit_2(llama_dir, tmp_path):
    path, words = _bad_files(llama_dir, tmp_path)["truncated"]
    result = serve_refusal(path, tmp_path)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2, result.stderr
    assert len(lines) == 1 and "--model" in lines[0] and words in lines[0], lines


@pytest.mark.slow
def test_folio_serve_serves_a_gguf_file_with_structured_outputs(llama_dir, gguf_dir, tmp_path):
    """`folio serve --model x.gguf`: the frontend's tokenizer and the executor's grammar
    tokenizer both come from the file; the answer is the safetensors checkpoint's."""
    from tests.http_server import openai_client, serving

    prompt = [5, 6, 7, 8]
    [expected] = _folio_tokens(llama_dir, [prompt])
    with serving(gguf_dir / "tiny-F32.gguf", tmp_path) as server:
        client = openai_client(server, "unused")
        # Under the file's name and, as vLLM serves it, the path as given, which clients
        # written for `vllm serve PATH` send back.
        path = str(gguf_dir / "tiny-F32.gguf")
        assert [m.id for m in client.models.list().data] == ["tiny-F32.gguf", path]
        assert client.models.retrieve(path).id == path
        model = path
        plain = client.completions.create(model=model, prompt=prompt, max_tokens=len(expected),
                                          temperature=0, logprobs=0,
                                          extra_body={"ignore_eos": True})
        assert plain.choices[0].text == load_tokenizer(llama_dir).decode(expected,
                                                                         skip_special_tokens=True)
        shaped = client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "a number"}], max_tokens=8,
            temperature=0, response_format={"type": "json_schema", "json_schema": {
                "name": "n", "schema": {"type": "integer"}}})
        assert shaped.choices[0].message.content.strip().lstrip("-").isdigit()
