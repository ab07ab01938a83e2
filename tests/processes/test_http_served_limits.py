"""Reliability IV (issue 25, items 3 and 7) against a real `folio serve`: a completion whose
log-prob tables would make a huge answer is refused with a 400 that says why; under the
bound, a prompt's echoed table is built once for its n choices and a large answer comes out
whole while /health keeps answering; a malformed tool_choice is a 400, not a traceback; a
taken port stops `folio serve` in one line before it starts anything.
"""

from __future__ import annotations

import json
import random
import socket
import subprocess
import sys
import threading

import httpx
import pytest

from tests.http_server import ROOT, HttpServer

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server(tmp_path_factory, llama_dir):
    srv = HttpServer(llama_dir, tmp_path_factory.mktemp("rel4http"), "--num-kv-blocks", "512")
    try:
        srv.wait_ready()
        yield srv
    finally:
        srv.stop()


def _ids(count: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(3, 1000) for _ in range(count)]


def _complete(server, body: dict, timeout: float = 300) -> httpx.Response:
    return httpx.post(f"{server.base}/v1/completions", json=body, timeout=timeout)


def test_a_completion_whose_logprobs_would_be_huge_is_refused_saying_why(server):
    body = {"prompt": [_ids(1000, seed) for seed in range(8)], "echo": True,
            "logprobs": 20, "max_tokens": 1, "n": 64}
    answer = _complete(server, body)
    assert answer.status_code == 400, answer.text[:300]
    error = answer.json()["error"]
    assert error["param"] == "logprobs"
    assert "entries" in error["message"] and "at most" in error["message"]
    assert "n = 64" in error["message"] and "logprobs 20" in error["message"]
    assert httpx.get(f"{server.base}/health").status_code == 200


def _prompt_part(choice: dict, prompt_len: int) -> dict:
    return {key: values[:prompt_len] for key, values in choice["logprobs"].items()}


def test_echo_choices_share_their_prompts_table(server):
    prompts = [_ids(40, 1), _ids(55, 2)]
    body = {"prompt": prompts, "echo": True, "logprobs": 5, "max_tokens": 3, "n": 3,
            "temperature": 1.0, "seed": 7}
    answer = _complete(server, body)
    assert answer.status_code == 200, answer.text[:300]
    choices = answer.json()["choices"]
    assert [c["index"] for c in choices] == list(range(6))
    alone = _complete(server, {**body, "n": 1}).json()["choices"]
    for p, prompt in enumerate(prompts):
        want = _prompt_part(alone[p], len(prompt))
        for choice in choices[3 * p:3 * p + 3]:
            table = choice["logprobs"]
            assert len(table["tokens"]) == len(prompt) + 3
            assert _prompt_part(choice, len(prompt)) == want
            offsets, position = [], 0
            for token in table["tokens"]:
                offsets.append(position)
                position += len(token)
            assert table["text_offset"] == offsets
            assert table["token_logprobs"][0] is None and table["top_logprobs"][0] is None
            assert all(1 <= len(top) <= 6 for top in table["top_logprobs"][1:])   # by text


def test_a_large_answer_comes_out_whole_while_health_answers(server):
    prompt = _ids(600, 3)   # 8 choices x 601 tokens x 21 entries: streamed as it is built
    body = {"prompt": [prompt], "echo": True, "logprobs": 20, "max_tokens": 1, "n": 8,
            "temperature": 1.0, "seed": 1}
    health: list[int] = []
    done = threading.Event()

    def poll() -> None:
        with httpx.Client(timeout=60) as client:
            for _ in range(600):   # bounded: at most 600 polls
                if done.is_set():
                    return
                health.append(client.get(f"{server.base}/health").status_code)
                done.wait(0.05)

    poller = threading.Thread(target=poll)
    poller.start()
    try:
        answer = _complete(server, body)
    finally:
        done.set()
        poller.join(timeout=60)
    assert answer.status_code == 200
    choices = json.loads(answer.content)["choices"]
    assert len(choices) == 8 and all(len(c["logprobs"]["tokens"]) == 601 for c in choices)
    first = _prompt_part(choices[0], 600)
    assert all(_prompt_part(c, 600) == first for c in choices)
    assert health and set(health) == {200}


def test_a_tool_choice_name_that_is_not_a_string_is_a_400(server):
    tools = [{"type": "function", "function": {"name": "get", "parameters": {
        "type": "object", "properties": {}}}}]
    for name in (["get"], {"a": 1}, 7, None):
        answer = httpx.post(f"{server.base}/v1/chat/completions", timeout=60, json={
            "messages": [{"role": "user", "content": "hi"}], "tools": tools,
            "tool_choice": {"type": "function", "function": {"name": name}}})
        assert answer.status_code == 400, (name, answer.text[:300])
        assert answer.json()["error"]["param"] == "tool_choice"
    assert httpx.get(f"{server.base}/health").status_code == 200


@pytest.mark.parametrize("flag", ["--port", "--zmq-address"])
def test_a_taken_port_stops_folio_serve_in_one_line_before_anything_starts(
        llama_dir, tmp_path, flag):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        value = str(port) if flag == "--port" else f"tcp://127.0.0.1:{port}"
        extra = [] if flag == "--port" else ["--port", "0"]
        run = subprocess.run(
            [sys.executable, "-m", "folio", "serve", "--model", str(llama_dir), flag, value,
             *extra], cwd=ROOT, capture_output=True, text=True, timeout=120)
    lines = [line for line in (run.stdout + run.stderr).splitlines() if line.strip()]
    assert run.returncode == 2, run.stderr[-2000:]
    assert len(lines) == 1 and "Traceback" not in lines[0], lines[:20]
    assert flag in lines[0] and str(port) in lines[0] and "in use" in lines[0]
