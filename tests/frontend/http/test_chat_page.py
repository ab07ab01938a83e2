"""The chat page at /, in headless Chromium (Debian's chromium + chromedriver, via Selenium).

.ci/run installs the browser (scripts/install-browser.sh); without it these tests fail, they
do not skip.
"""

from __future__ import annotations

import re
import socket
import tempfile
import time
from pathlib import Path

import httpx
import pytest

from tests.pipeline import Pipeline

pytestmark = pytest.mark.slow

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
CHROMIUM_FLAGS = (
    "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
    # No network lookups of its own (blocked here), no first-run work.
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--no-first-run", "--window-size=1200,800")
WAIT_S = 60


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# Tokens the stop test asks for: far more than a far faster engine makes in the browser's
# round trips between the first tokens showing and the click (the 32768-token model).
ENDLESS = 32_000


@pytest.fixture(scope="module")
def server(tmp_path_factory, long_llama_dir):
    """The three processes; the frontend serves HTTP. Yields the base URL."""
    pipe = Pipeline(tmp_path_factory.mktemp("run"), long_llama_dir,
                    engine_args=("--num-kv-blocks", "2048"), http_port=_free_port())
    try:
        pipe.wait_ready()
        base = f"http://127.0.0.1:{pipe.http_port}"
        deadline = time.monotonic() + 30
        while True:
            pipe.check_alive()
            try:
                if httpx.get(f"{base}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"HTTP API not up; logs: {pipe.logs()}")
            time.sleep(0.1)
        yield base
    finally:
        pipe.stop()


@pytest.fixture(scope="module")
def browser():
    missing = [str(p) for p in (CHROMIUM, CHROMEDRIVER) if not p.exists()]
    if missing:
        pytest.fail(f"the chat-page test needs Debian's chromium and chromium-driver "
                    f"({', '.join(missing)} missing); install them with "
                    f"scripts/install-browser.sh (.ci/run does)", pytrace=False)
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        pytest.fail("selenium is missing; install the test extra "
                    "(scripts/setup.sh --test)", pytrace=False)
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    with tempfile.TemporaryDirectory(prefix="folio-chromium-") as profile:
        for flag in (*CHROMIUM_FLAGS, f"--user-data-dir={profile}"):
            options.add_argument(flag)
        driver = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=options)
        try:
            yield driver
        finally:
            driver.quit()


def _el(driver, element_id: str):
    from selenium.webdriver.common.by import By

    return driver.find_element(By.ID, element_id)


def _wait(driver, condition, what: str, timeout: float = WAIT_S):
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, timeout, poll_frequency=0.05).until(
        lambda d: condition(d), message=f"timed out after {timeout}s waiting for {what}")


def _set(driver, element_id: str, value: str) -> None:
    field = _el(driver, element_id)
    field.clear()
    if value:
        field.send_keys(value)


def _open(driver, base: str, model: str, **settings: str) -> None:
    driver.get(base + "/")
    driver.execute_script("localStorage.clear(); sessionStorage.clear();")   # default settings
    driver.refresh()
    _wait(driver, lambda d: model in _el(d, "model").text, "the model name from /v1/models")
    for element_id, value in settings.items():
        _set(driver, element_id.replace("_", "-"), value)


def _send(driver, text: str, enter: bool = False) -> None:
    """Type the message and click Send (or press Enter; Shift+Enter makes line breaks)."""
    from selenium.webdriver.common.keys import Keys

    prompt = _el(driver, "prompt")
    lines = text.split("\n")
    for i, line in enumerate(lines):
        prompt.send_keys(line)
        if i < len(lines) - 1:
            prompt.send_keys(Keys.SHIFT, Keys.ENTER)
    if enter:
        prompt.send_keys(Keys.ENTER)
    else:
        _el(driver, "send").click()


def _assistant_messages(driver) -> list:
    from selenium.webdriver.common.by import By

    return driver.find_elements(By.CSS_SELECTOR, "#messages .msg.assistant")


def _answer_done(driver) -> dict:
    """Wait for the last answer to finish; its text (exact, via textContent) and status."""
    def finished(d):
        bubbles = _assistant_messages(d)
        if not bubbles or d.find_element("tag name", "body").get_attribute("data-state") != "idle":
            return False
        return bubbles[-1].get_attribute("data-status") in ("done", "stopped", "error")

    _wait(driver, finished, "the streamed answer to finish")
    bubble = _assistant_messages(driver)[-1]
    return {"text": driver.execute_script(
                "return arguments[0].querySelector('.content').textContent", bubble),
            "status": bubble.get_attribute("data-status"),
            "finish_reason": bubble.get_attribute("data-finish-reason"),
            "tokens": int(_el(driver, "tokens").text),
            "tps": _el(driver, "tps").text,
            "error": _el(driver, "error").is_displayed()}


def _metric(base: str, name: str, label: str = "") -> float:
    """A value from /metrics: the sample named `name` whose labels include `label`."""
    text = httpx.get(f"{base}/metrics", timeout=5).text
    for line in text.splitlines():
        sample, _, value = line.rpartition(" ")
        if sample.split("{")[0] == name and label in sample:
            return float(value)
    return 0.0


def _model(base: str) -> str:
    return httpx.get(f"{base}/v1/models", timeout=5).json()["data"][0]["id"]


def test_chat_page_streams_the_greedy_answer_and_keeps_the_conversation(browser, server):
    model = _model(server)
    _open(browser, server, model, temperature="0", top_p="1", max_tokens="24", seed="",
          system="You are terse.")
    settings = {"model": model, "temperature": 0, "top_p": 1, "max_tokens": 24}
    messages = [{"role": "system", "content": "You are terse."}]
    for turn, question in enumerate(("What does the for statement do?",
                                     "And the while\nstatement?")):
        count = len(_assistant_messages(browser))
        _send(browser, question, enter=turn == 1)
        # The answer appears while it streams, with a live tokens/s readout.
        _wait(browser, lambda d: len(_assistant_messages(d)) == count + 1, "the answer bubble")
        got = _answer_done(browser)
        assert got["status"] == "done" and not got["error"], got
        assert got["text"].strip(), got
        assert float(got["tps"]) > 0, got

        messages.append({"role": "user", "content": question})
        direct = httpx.post(f"{server}/v1/chat/completions", timeout=60,
                            json={**settings, "messages": messages}).json()
        choice = direct["choices"][0]
        assert got["text"] == choice["message"]["content"]
        assert got["finish_reason"] == choice["finish_reason"]
        assert got["tokens"] == direct["usage"]["completion_tokens"]
        messages.append({"role": "assistant", "content": got["text"]})
    assert _el(browser, "prompt").get_property("value") == ""


def test_stop_button_ends_the_stream_and_the_server_aborts_the_request(browser, server):
    _open(browser, server, _model(server), temperature="0", max_tokens=str(ENDLESS),
          system="")
    _send(browser, "Tell me everything about the for statement.")
    # Stop once some tokens show on the page (greedy, this answer has no EOS for thousands
    # of tokens): the request surely runs, with far more to go than any engine makes
    # before the click lands.
    _wait(browser, lambda d: int(_el(d, "tokens").text or 0) >= 2, "the first tokens")
    assert float(_el(browser, "tps").text) > 0   # the live readout
    stop = _el(browser, "stop")
    assert stop.is_enabled() and not _el(browser, "send").is_enabled()
    stop.click()
    got = _answer_done(browser)
    assert got["status"] == "stopped" and not got["error"], got
    assert 2 <= got["tokens"] < ENDLESS
    assert not stop.is_enabled() and _el(browser, "send").is_enabled()
    # The client went away, so the server aborted the request: nothing keeps running.
    deadline = time.monotonic() + 60   # generous: only that it happens is tested
    while (_metric(server, "folio:num_requests_running") != 0
           or _metric(server, "folio:request_success_total", 'finished_reason="abort"') != 1):
        assert time.monotonic() < deadline, "the stopped request was not aborted"
        time.sleep(0.1)
    assert httpx.get(f"{server}/health", timeout=5).json() == {"status": "ok"}
    # The page keeps working after a stop: the stopped turn stays in the conversation.
    _set(browser, "max-tokens", "8")
    _send(browser, "Thanks.")
    got = _answer_done(browser)
    assert got["status"] == "done" and got["tokens"] <= 8, got
    assert len(_assistant_messages(browser)) == 2


def test_errors_show_the_servers_message_and_give_the_text_back(browser, server):
    _open(browser, server, _model(server), top_p="0")
    _send(browser, "Hello?\nAnyone?")
    _wait(browser, lambda d: _el(d, "error").is_displayed(), "the error display")
    assert re.fullmatch(r"HTTP 400: top_p must be .*\(invalid_value\)",
                        _el(browser, "error-text").text)
    assert _el(browser, "prompt").get_property("value") == "Hello?\nAnyone?"
    assert _assistant_messages(browser) == []


# Replaces fetch for /v1/chat/completions with a canned SSE stream, cut every 3 bytes (lines
# and UTF-8 characters split across reads), that fails mid-answer with an error event.
FAKE_STREAM = r"""
const real = window.fetch;
window.folioRequests = [];
window.fetch = async (url, init) => {
  if (!String(url).endsWith("/v1/chat/completions")) return real(url, init);
  window.folioRequests.push({headers: init.headers, body: JSON.parse(init.body)});
  const head = {id: "c", object: "chat.completion.chunk", created: 0, model: "m"};
  const events = [
    {...head, choices: [{index: 0, delta: {role: "assistant", content: ""}}]},
    {...head, choices: [{index: 0, delta: {content: "h\u00e9llo"}, finish_reason: null}]},
    {...head, choices: [{index: 0, delta: {content: " w\u00f6rld \u2603"}}]},
    {error: {message: "the engine stopped", type: "service_unavailable", param: null,
             code: "engine_unavailable"}}];
  const bytes = new TextEncoder().encode(
    ": comment\r\n\r\n" + events.map(e => "data: " + JSON.stringify(e) + "\r\n\r\n").join(""));
  let at = 0;
  const body = new ReadableStream({pull(c) {
    if (at >= bytes.length) c.close(); else { c.enqueue(bytes.slice(at, at + 3)); at += 3; }
  }});
  return new Response(body, {status: 200, headers: {"Content-Type": "text/event-stream"}});
};
"""


def test_mid_stream_error_event_and_api_key(browser, server):
    model = _model(server)
    _open(browser, server, model, temperature="0.5", top_p="0.9", max_tokens="", seed="7",
          api_key="secret-key")
    browser.execute_script(FAKE_STREAM)
    _send(browser, "Hi")
    got = _answer_done(browser)
    assert got["status"] == "error" and got["text"] == "h\u00e9llo w\u00f6rld \u2603", got
    assert got["tokens"] == 2
    assert _el(browser, "error-text").text == "the engine stopped (engine_unavailable)"
    (request,) = browser.execute_script("return window.folioRequests")
    assert request["headers"]["Authorization"] == "Bearer secret-key"
    assert request["body"] == {
        "model": model, "messages": [{"role": "user", "content": "Hi"}], "stream": True,
        "stream_options": {"include_usage": True}, "temperature": 0.5, "top_p": 0.9,
        "seed": 7}
