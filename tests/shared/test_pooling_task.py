"""Which runner a checkpoint gets and how it pools (shared/pooling/task.py), from its own
files: config.json's architecture and keys, sentence-transformers' modules.json."""

from __future__ import annotations

import json

import pytest

from folio.shared.pooling.task import resolve_pooling_task


def _checkpoint(path, architecture="Qwen3ForCausalLM", pooling=None, normalize=True, **config):
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps({"architectures": [architecture],
                                                  "hidden_size": 64, **config}))
    if pooling is not None:
        modules = [{"path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]
        if normalize:
            modules.append({"path": "2_Normalize",
                            "type": "sentence_transformers.models.Normalize"})
        (path / "modules.json").write_text(json.dumps(modules))
        (path / "1_Pooling").mkdir()
        (path / "1_Pooling" / "config.json").write_text(json.dumps({pooling: True}))
    return path


def test_a_causal_lm_generates_unless_told(tmp_path):
    path = _checkpoint(tmp_path / "lm")
    assert resolve_pooling_task(path) is None
    task = resolve_pooling_task(path, runner="pooling")
    assert (task.pooling_type, task.normalize, task.scores) == ("last", True, False)


def test_declared_embedding_models(tmp_path):
    base = resolve_pooling_task(_checkpoint(tmp_path / "base", "Qwen3Model"))
    assert base.pooling_type == "last" and base.hidden_size == 64
    mean = resolve_pooling_task(_checkpoint(tmp_path / "st", pooling="pooling_mode_mean_tokens",
                                            normalize=False))
    assert (mean.pooling_type, mean.normalize) == ("mean", False)
    assert resolve_pooling_task(tmp_path / "st", pooling_type="last").pooling_type == "last"
    assert resolve_pooling_task(tmp_path / "st", runner="generate") is None


def test_matryoshka_is_declared_or_refused_by_name(tmp_path):
    plain = resolve_pooling_task(_checkpoint(tmp_path / "plain", "Qwen3Model"))
    assert plain.dimensions_problem(64) is None
    assert "does not declare Matryoshka" in plain.dimensions_problem(32)
    listed = resolve_pooling_task(_checkpoint(tmp_path / "listed", "Qwen3Model",
                                              matryoshka_dimensions=[16, 32]))
    assert listed.dimensions_problem(16) is None and "16, 32" in listed.dimensions_problem(8)
    anything = resolve_pooling_task(_checkpoint(tmp_path / "any", "Qwen3Model",
                                                is_matryoshka=True))
    assert anything.dimensions_problem(8) is None and anything.dimensions_problem(65)


def test_scorers_and_refusals(tmp_path):
    declared = resolve_pooling_task(_checkpoint(tmp_path / "rr",
                                                classifier_from_token=["no", "yes"]))
    assert declared.score_tokens == ("no", "yes") and declared.pooling_type == "last"
    flagged = resolve_pooling_task(_checkpoint(tmp_path / "lm"), score_tokens="not,is")
    assert flagged.score_tokens == ("not", "is")
    with pytest.raises(ValueError, match="classification heads are not served"):
        resolve_pooling_task(_checkpoint(tmp_path / "cls", "Qwen3ForSequenceClassification"),
                             runner="pooling")
    with pytest.raises(ValueError, match="pooling_mode_cls_token is not served"):
        resolve_pooling_task(_checkpoint(tmp_path / "cls-st", pooling="pooling_mode_cls_token"))
    with pytest.raises(ValueError, match="two tokens"):
        resolve_pooling_task(tmp_path / "lm", score_tokens="yes")
