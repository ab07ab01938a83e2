"""Bad input gets a clear error and leaves nothing allocated."""

from __future__ import annotations

import json
import shutil

import pytest

from folio import LLM, SamplingParams


@pytest.fixture(scope="module")
def llm(llama_dir):
    return LLM(str(llama_dir), num_kv_blocks=64, max_model_len=200)


def test_prompt_longer_than_max_model_len(llm):
    with pytest.raises(ValueError, match=r"201 tokens, more than this model's maximum context length max_model_len = 200"):
        llm.generate([[5] * 10, [7] * 201], SamplingParams(max_tokens=4))
    stats = llm.stats()
    assert stats["kv_blocks_free"] == stats["kv_blocks_total"]
    assert stats["num_waiting"] == stats["num_running"] == 0


def test_prompt_plus_max_tokens_past_the_context_is_refused_as_the_server_refuses(llm):
    # The server's wording (tests/processes/test_pipeline.py): admission is the scheduler's alone.
    with pytest.raises(ValueError, match=r"plus max_tokens \(30\) is 210 tokens, more than "
                       r"max_model_len = 200"):
        llm.generate([[5] * 180], SamplingParams(max_tokens=30))
    assert llm.stats()["kv_blocks_free"] == 64


def test_prompt_longer_than_pool(llama_dir):
    small = LLM(str(llama_dir), num_kv_blocks=4, block_size=16)
    with pytest.raises(ValueError, match=r"KV cache's capacity .* = 64"):
        small.generate([[5] * 65])
    assert small.stats()["kv_blocks_free"] == 4


def test_token_ids_outside_vocabulary(llm):
    with pytest.raises(ValueError, match=r"outside the vocabulary \[0, 1024\)"):
        llm.generate([[5, 1024]])
    assert llm.stats()["kv_blocks_free"] == 64


def test_empty_prompt(llm):
    with pytest.raises(ValueError, match="at least one token"):
        llm.generate([[]])


def test_unsupported_architecture(llama_dir, tmp_path):
    for name in ("config.json", "model.safetensors"):
        shutil.copy(llama_dir / name, tmp_path / name)
    config = json.loads((tmp_path / "config.json").read_text())
    config["architectures"] = ["GPT2LMHeadModel"]
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"unsupported architecture 'GPT2LMHeadModel'.*Llama"):
        LLM(str(tmp_path), tokenizer=str(llama_dir))


def test_missing_checkpoint(tmp_path):
    with pytest.raises(ValueError, match=r"^model .*no config\.json"):
        LLM(str(tmp_path), tokenizer=str(tmp_path))


@pytest.mark.parametrize("kwargs, message", [
    ({"temperature": -1}, "temperature must be >= 0"),
    ({"top_p": 0}, r"top_p must be in \(0, 1\]"),
    ({"top_k": -2}, "top_k must be >= 1, or 0 / -1"),
    ({"max_tokens": 0}, "max_tokens must be >= 1"),
    ({"n": 0}, "n must be >= 1"),
    ({"min_tokens": 5, "max_tokens": 2}, "min_tokens must be <= max_tokens"),
    ({"seed": -1}, "seed must be in"),
])
def test_impossible_sampling_params(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SamplingParams(**kwargs)


def test_wrong_types_in_sampling_params():
    with pytest.raises(TypeError, match="max_tokens must be an integer"):
        SamplingParams(max_tokens="7")
    with pytest.raises(ValueError, match="unknown sampling parameter"):
        SamplingParams.from_dict({"temprature": 0.5})


def test_engine_config_errors(llama_dir):
    with pytest.raises(ValueError, match="block_size must be a power of two"):
        LLM(str(llama_dir), block_size=12)
    with pytest.raises(ValueError, match="attention_backend must be one of"):
        LLM(str(llama_dir), attention_backend="cudnn")


def test_an_sdk_request_over_the_message_limit_is_refused_before_it_is_sent(tmp_path):
    """The server would drop the whole connection (every request on it) for one message
    over 64 MiB: the SDK refuses that request alone, without sending it."""
    from folio.client import Client
    from folio.errors import RequestRejected

    with Client(f"ipc://{tmp_path}/nobody.sock", connect_timeout=0.1) as client:
        with pytest.raises(RequestRejected, match="exceeds the 67108864-byte message limit"):
            client.generate("a" * (65 * 2**20))
