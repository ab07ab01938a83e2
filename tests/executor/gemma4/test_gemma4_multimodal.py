"""A Gemma4ForConditionalGeneration checkpoint is served as its text model: the config
nested under text_config, the decoder's weights under model.language_model., the vision
tower skipped; greedy tokens identical to transformers' multimodal class given text only.
Image and audio inputs are refused by the API, naming the content part."""

from __future__ import annotations

import json

import pytest

from folio import LLM, SamplingParams
from folio.executor.models.hf_config import read_model_config
from tests.conftest import TEST_DEVICE
from tests.executor.gemma4.checkpoints import make_gemma4_multimodal_dir
from tests.hf_oracle import hf_greedy, random_prompts

pytestmark = pytest.mark.parity

PROMPTS, _ = random_prompts(3, 1, 40, vocab=1024, seed=7)


@pytest.fixture(scope="module")
def multimodal_dir(tmp_path_factory, tokenizer_dir):
    return make_gemma4_multimodal_dir(tmp_path_factory.mktemp("gemma4_mm"), tokenizer_dir,
                                      "shared_kv_ple")


def test_the_text_model_of_a_multimodal_checkpoint_matches_transformers(multimodal_dir):
    raw = json.loads((multimodal_dir / "config.json").read_text())
    assert raw["architectures"] == ["Gemma4ForConditionalGeneration"] and raw["vision_config"]
    config = read_model_config(multimodal_dir)
    assert config.architecture == "Gemma4ForCausalLM"
    assert config.num_layers == raw["text_config"]["num_hidden_layers"]
    assert config.gemma4.kv_source == (0, 1, 2, 3, 3, 2)
    expected = hf_greedy(multimodal_dir, PROMPTS, [8] * len(PROMPTS), TEST_DEVICE)
    llm = LLM(str(multimodal_dir), dtype="float32", device=TEST_DEVICE, num_kv_blocks=64)
    params = SamplingParams(temperature=0.0, max_tokens=8)
    assert [r.outputs[0].token_ids for r in llm.generate(PROMPTS, params)] == expected


def test_image_and_audio_parts_are_refused_naming_them(multimodal_dir, tmp_path):
    """Through `folio serve` and the openai SDK: a 400 naming the part; text still runs."""
    import openai

    from tests.http_server import openai_client, serving

    with serving(multimodal_dir, tmp_path, "--device", "cpu", "--num-kv-blocks", "64") \
            as server:
        client, name = openai_client(server, "unused"), multimodal_dir.name
        for part in ({"type": "image_url", "image_url": {"url": "data:,"}},
                     {"type": "input_audio", "input_audio": {"data": "", "format": "wav"}}):
            with pytest.raises(openai.BadRequestError) as info:
                client.chat.completions.create(model=name, max_tokens=2, messages=[
                    {"role": "user", "content": [{"type": "text", "text": "hi"}, part]}])
            assert repr(part["type"]) in info.value.message
            assert info.value.body["param"] == "messages"
        text = client.completions.create(model=name, prompt=[5, 6, 7], max_tokens=2,
                                         temperature=0.0)
        assert text.usage.completion_tokens == 2
