"""The live page map at /kv, in headless Chromium: the grid changes while a request runs,
shared prompt blocks show their count, speculative decoding's mean accepted length shows
(overall and per request), and every block is free (or cached) at the end. The plan page at
/plan beside it draws a saved plan. Screenshots are saved to $FOLIO_TEST_ARTIFACTS (default:
the test's tmp directory)."""

from __future__ import annotations

import json
import os
import re
import threading
import time
from pathlib import Path

import httpx
import pytest

from tests.pipeline import Pipeline
from tests.frontend.http.test_chat_page import _free_port, _wait, browser  # noqa: F401 (a fixture)

pytestmark = pytest.mark.slow
SPEC = json.dumps({"method": "suffix", "num_speculative_tokens": 4,
                   "suffix_decoding_min_match_len": 1})


@pytest.fixture(scope="module")
def server(tmp_path_factory, llama_dir):
    pipe = Pipeline(tmp_path_factory.mktemp("run"), llama_dir,
                    engine_args=("--num-kv-blocks", "256", "--block-size", "4",
                                 "--speculative-config", SPEC),
                    scheduler_args=("--speculative-config", SPEC),   # both read it
                    http_port=_free_port())
    try:
        pipe.wait_ready()
        base = f"http://127.0.0.1:{pipe.http_port}"
        deadline = time.monotonic() + 30
        while True:   # the SDK socket answers first; the HTTP port may still be opening
            try:
                if httpx.get(f"{base}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, pipe.logs()
            time.sleep(0.1)
        yield base
    finally:
        pipe.stop()


def _blocks(driver) -> list[tuple[str, str, str]]:
    """(state, ref, fill) of every drawn block."""
    return driver.execute_script(
        "return [...document.querySelectorAll('#grid .block')]"
        ".map(b => [b.dataset.state, b.dataset.ref, b.dataset.fill]);")


def _text(driver, element_id: str) -> str:
    """An element's shown text, read in one script call: the page redraws every 100 ms, so
    an element found in one call may be replaced before a second call reads it."""
    return driver.execute_script(f"return document.getElementById('{element_id}').innerText;")


def test_grid_follows_a_running_request(server, browser, tmp_path):  # noqa: F811
    browser.get(server + "/kv?every=100")   # a fast machine ends the answers in ~1 s
    _wait(browser, lambda d: len(_blocks(d)) == 256, "the grid of 256 blocks", timeout=15)
    assert {state for state, _, _ in _blocks(browser)} <= {"F", "C"}
    body = {"prompt": "a prompt the two answers share, long enough for blocks " * 2,
            "max_tokens": 900, "temperature": 0.0, "ignore_eos": True, "stream": True}
    answers = []
    seen_enough = threading.Event()   # then each client leaves, which aborts its request

    def stream() -> None:
        with httpx.stream("POST", f"{server}/v1/completions", json=body,
                          timeout=120) as answer:
            answers.append(answer.status_code)
            for _ in answer.iter_lines():
                if seen_enough.is_set():
                    break

    workers = [threading.Thread(target=stream) for _ in range(2)]
    for worker in workers:
        worker.start()
    first = _wait(browser, lambda d: (lambda b: b if any(s == "U" for s, _, _ in b) else None)(
        _blocks(d)), "blocks in use")
    _wait(browser, lambda d: any(s == "U" and ref == "2" for s, ref, _ in _blocks(d))
          and d.execute_script("return document.querySelectorAll('#tables tr .pages').length;")
          == 2, "both block tables and a shared prompt block with reference count 2")
    shared_label = browser.execute_script(
        "return document.querySelector('#grid .block.shared .count').textContent;")
    assert shared_label == "2"
    lanes = browser.execute_script("return document.querySelectorAll('#lanes .lane').length;")
    # 1024 slots hold one reservation of max_model_len = 1024: the other request waits.
    assert lanes == 1 and "1 request(s) would wait" in _text(browser, "lanes")
    artifacts = Path(os.environ.get("FOLIO_TEST_ARTIFACTS", tmp_path))
    artifacts.mkdir(parents=True, exist_ok=True)
    # Drafts carried: a request's row shows its mean accepted length, the pool's the overall.
    spec_cells = "return [...document.querySelectorAll('#tables td.spec')]" \
        ".map(c => c.textContent);"
    _wait(browser, lambda d: any(re.fullmatch(r"\d+\.\d\d", c)
                                 for c in d.execute_script(spec_cells)),
          "a request's mean accepted length")
    overall = _text(browser, "spec-mean")
    assert re.fullmatch(r"mean accepted length \d+\.\d\d", overall), overall
    assert float(overall.split()[-1]) >= 1.0
    assert browser.save_screenshot(str(artifacts / "kv_page.png"))
    _wait(browser, lambda d: _blocks(d) != first, "the grid to change as tokens arrive")
    seen_enough.set()
    for worker in workers:
        worker.join(120)
    assert answers == [200, 200]
    _wait(browser, lambda d: all(s != "U" for s, _, _ in _blocks(d)), "every block free")
    assert browser.execute_script("return document.body.dataset.used;") == "0"


def test_plan_page_draws_a_saved_plan(server, browser, tmp_path):  # noqa: F811
    """/plan beside the page map: a `folio plan --save` file, picked in the page, drawn as
    one line per option in each chart, the SLO as a line, a table row per option."""
    from folio.planner.command import PlanSettings, make_plan
    from folio.planner.workload import parse_workload
    from tests.planner.hand_cost import hand_cost

    settings = PlanSettings(workload="fixed:rate=20,n=10,prompt=64,output=16", compare=True,
                            slo="tpot=25ms")
    plan = make_plan(settings, hand_cost(base_ms=5, per_prefill_token=0.1),
                     parse_workload(settings.workload))
    saved = tmp_path / "plan.json"
    saved.write_text(json.dumps(plan))
    browser.get(server + "/plan")
    browser.find_element("id", "file").send_keys(str(saved))
    count = len(plan["options"])
    _wait(browser, lambda d: d.execute_script("return document.body.dataset.options;")
          == str(count), "the plan drawn", timeout=15)
    drawn = browser.execute_script(
        "return ['ttft-chart', 'tpot-chart'].map(id => [...document.querySelectorAll("
        "`#${id} .series`)].map(l => l.dataset.option));")
    names = [entry["option"] for entry in plan["options"]]
    assert drawn == [names, names]
    assert browser.execute_script("return document.querySelectorAll('#tpot-chart .slo')"
                                  ".length;") == 1
    rows = browser.execute_script(
        "return [...document.querySelectorAll('#options tr[data-option]')]"
        ".map(r => r.dataset.option);")
    assert rows == names and "contiguous, reserve" in browser.find_element(
        "id", "options").text
    artifacts = Path(os.environ.get("FOLIO_TEST_ARTIFACTS", tmp_path))
    artifacts.mkdir(parents=True, exist_ok=True)
    assert browser.save_screenshot(str(artifacts / "plan_page.png"))
