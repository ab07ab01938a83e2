"""Who goes first, over HTTP with a real `folio serve` (docs/serving.md "Who goes first"):
a request may not ask a priority more urgent than --priority-floor unless it comes with
--priority-api-key; and clients take turns: one client's queue of requests does not stand
in front of another client's first one. One server, one seat (--max-num-seqs 1), so the
order of admission is the order of completion."""

from __future__ import annotations

import threading
import time

import httpx
import pytest

from tests.http_server import serving

KEY, PRIORITY_KEY = "turns-key", "turns-priority-key"
HEAVY = 6


@pytest.fixture(scope="module")
def server(llama_dir, tmp_path_factory):
    with serving(llama_dir, tmp_path_factory.mktemp("turns"), "--api-key", KEY,
                 "--priority-api-key", PRIORITY_KEY, "--scheduling-policy", "priority",
                 "--max-num-seqs", "1", "--dtype", "float32") as server:
        yield server


def _complete(server, key: str, **fields) -> httpx.Response:
    body = {"prompt": [5, 6, 7, 8], "max_tokens": 4, "temperature": 0, **fields}
    return httpx.post(f"{server.base}/v1/completions", json=body, timeout=120,
                      headers={"Authorization": f"Bearer {key}"})


def test_a_priority_past_the_floor_needs_the_priority_key(server):
    refused = _complete(server, KEY, priority=-5)
    assert refused.status_code == 400, refused.text
    assert "--priority-floor 0" in refused.json()["error"]["message"]
    assert refused.json()["error"]["param"] == "priority"
    assert _complete(server, PRIORITY_KEY, priority=-5).status_code == 200
    assert _complete(server, KEY, priority=3).status_code == 200
    assert _complete(server, "wrong", priority=3).status_code == 401


def _waiting(server) -> float:
    text = httpx.get(f"{server.base}/metrics",
                     headers={"Authorization": f"Bearer {KEY}"}).text
    line = next(l for l in text.splitlines() if l.startswith("folio:num_requests_waiting"))
    return float(line.split()[-1])


def test_a_second_client_is_not_queued_behind_the_first_ones_requests(server):
    done: list[str] = []
    lock = threading.Lock()

    def run(name: str, key: str, max_tokens: int) -> None:
        answer = _complete(server, key, max_tokens=max_tokens, ignore_eos=True)
        assert answer.status_code == 200, answer.text
        with lock:
            done.append(name)

    # Each heavy request runs 48 steps: the poll below sees its queue while the first runs.
    heavy = [threading.Thread(target=run, args=(f"heavy{i}", KEY, 48)) for i in range(HEAVY)]
    for thread in heavy:
        thread.start()
    deadline = time.monotonic() + 120
    while _waiting(server) < HEAVY - 1:   # one runs, the rest wait
        assert time.monotonic() < deadline, "the heavy client's requests never queued"
        time.sleep(0.05)
    light = threading.Thread(target=run, args=("light", PRIORITY_KEY, 4))
    light.start()
    for thread in [*heavy, light]:
        thread.join()
    # FCFS would finish it last; taking turns, it starts now: only the heavy requests
    # already due (their client's clock behind this step) go first.
    assert done.index("light") <= 2, done
