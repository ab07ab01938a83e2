"""lm-evaluation-harness' `local-completions` model against a real `folio serve` gives the
same per-sample loglikelihoods as the harness' own `hf` model on the same float32
checkpoint (issue 15, item 1), on a local task built from the text that ships with Python.
Skipped when lm-eval is not installed (it is in the `test` extra)."""

from __future__ import annotations

import json

import pytest

from tests.http_server import serving

pytestmark = pytest.mark.slow
lm_eval = pytest.importorskip(
    "lm_eval", reason="lm-eval is not installed (scripts/setup.sh --test installs it)")
MODEL = "tiny"
SAMPLES = 24
TOL = 1e-3


def _task(path) -> None:
    """Contexts of 24 words of Python's docs, continuations of the next 6."""
    from pydoc_data.topics import topics

    words = " ".join(topics[k] for k in sorted(topics)).split()
    with open(path / "pydocs.jsonl", "w") as f:
        for i in range(SAMPLES):
            at = i * 24 * 7
            f.write(json.dumps({"context": " ".join(words[at:at + 24]),
                                "continuation": " " + " ".join(words[at + 24:at + 30])})
                    + "\n")
    (path / "pydocs.yaml").write_text(f"""task: folio_pydocs
dataset_path: json
dataset_kwargs:
  data_files:
    test: {path / "pydocs.jsonl"}
test_split: test
output_type: loglikelihood
doc_to_text: "{{{{context}}}}"
doc_to_target: "{{{{continuation}}}}"
metric_list:
  - metric: perplexity
    aggregation: perplexity
    higher_is_better: false
""")


def _loglikelihoods(model: str, args: str, tasks) -> list[float]:
    result = lm_eval.simple_evaluate(model=model, model_args=args, tasks=["folio_pydocs"],
                                     task_manager=tasks, log_samples=True, batch_size=4)
    samples = sorted(result["samples"]["folio_pydocs"], key=lambda s: s["doc_id"])
    return [s["resps"][0][0][0] for s in samples]


def test_local_completions_matches_the_hf_model_per_sample(tmp_path_factory, llama_dir,
                                                           monkeypatch):
    from lm_eval.tasks import TaskManager

    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    task_dir = tmp_path_factory.mktemp("lm-eval-task")
    _task(task_dir)
    tasks = TaskManager(include_path=str(task_dir), include_defaults=False)   # not the 1000s of stock tasks
    hf = _loglikelihoods("hf", f"pretrained={llama_dir},dtype=float32,device=cpu", tasks)
    with serving(llama_dir, tmp_path_factory.mktemp("lm-eval"), "--served-model-name",
                 MODEL, "--num-kv-blocks", "256") as server:
        served = _loglikelihoods(
            "local-completions",
            f"base_url={server.base}/v1/completions,model={MODEL},tokenizer={llama_dir},"
            "tokenizer_backend=huggingface,num_concurrent=2,max_retries=1", tasks)
    assert len(hf) == len(served) == SAMPLES
    assert all(value < 0 for value in served)   # real scores, not the zeros of issue 15
    worst = max(abs(a - b) for a, b in zip(hf, served))
    assert worst <= TOL, (worst, hf, served)
