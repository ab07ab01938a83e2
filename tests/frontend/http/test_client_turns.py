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
def server(long_llama_dir, tmp_path_factory):
    with serving(long_llama_dir, tmp_path_factory.mktemp("turns"), "--api-key", KEY,
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


def _stream_until(server, key: str, name: str, started: list[str], release: threading.Event,
                  max_tokens: int) -> None:
    """Streams a completion; notes `name` at its first token (one seat: the order of first
    tokens is the order of admission); reads on (a client that stops reading is cut off)
    until `release` is set, then hangs up (an abort)."""
    body = {"prompt": [5, 6, 7, 8], "max_tokens": max_tokens, "temperature": 0,
            "ignore_eos": True, "stream": True}
    with httpx.stream("POST", f"{server.base}/v1/completions", json=body, timeout=120,
                      headers={"Authorization": f"Bearer {key}"}) as answer:
        assert answer.status_code == 200, answer.read()
        for line in answer.iter_lines():
            if line.startswith("data: {") and name not in started:
                started.append(name)
            if name in started and release.is_set():
                break


def test_a_second_client_is_not_queued_behind_the_first_ones_requests(server):
    started: list[str] = []
    release = threading.Event()
    # The heavy client's requests would run for 30 000 tokens: each holds the one seat until
    # the test hangs it up, so the queue below is there at any speed.
    heavy = [threading.Thread(target=_stream_until,
                              args=(server, KEY, f"heavy{i}", started, release, 30_000))
             for i in range(HEAVY)]
    for thread in heavy:
        thread.start()
    _wait_for_waiting(server, HEAVY - 1)   # one runs, the rest wait
    light = threading.Thread(target=_stream_until,
                             args=(server, PRIORITY_KEY, "light", started, release, 4))
    light.start()
    _wait_for_waiting(server, HEAVY)
    release.set()   # the running one hangs up; each admitted after it hangs up at once
    for thread in [*heavy, light]:
        thread.join()
    # FCFS would admit it last; taking turns, it goes next: only the heavy requests
    # already due (their client's clock behind this step) go first.
    assert sorted(started) == sorted([*(f"heavy{i}" for i in range(HEAVY)), "light"])
    assert started.index("light") <= 2, started


def _wait_for_waiting(server, count: int) -> None:
    deadline = time.monotonic() + 120
    while _waiting(server) < count:
        assert time.monotonic() < deadline, f"never {count} requests waiting"
        time.sleep(0.05)
