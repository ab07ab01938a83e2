"""Mixed load on one `folio serve` (tests/soak/load.py), through the SDK and through HTTP:
with aborts, vanishing clients and a small waiting queue, nothing fails, every KV block comes
back after each round, every process lives on, and the scheduler and the frontend do not
grow from one round's idle to the next's."""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from tests.http_server import serving
from tests.soak.load import HttpDriver, Mix, SdkDriver, run_load, serve_pids

pytestmark = pytest.mark.slow
MIX = Mix(requests=60, concurrency=16, prompt_len=(8, 64), output_len=(8, 32),
          max_vanish_s=0.5)
RSS_SLACK_MIB = 16.0


@pytest.fixture(scope="module")
def server(tmp_path_factory, llama_dir):
    # 16 clients, 4 running and 4 waiting: the rest are refused, queue full.
    with serving(llama_dir, tmp_path_factory.mktemp("load"), "--num-kv-blocks", "256",
                 "--max-num-seqs", "4", "--max-queued-requests", "4") as srv:
        yield srv


def _pids(server) -> dict[str, int]:
    """The roles' pids, once `folio serve` has printed them (after its first good health)."""
    deadline = time.monotonic() + 60
    while not (pids := serve_pids(server.log)):
        assert time.monotonic() < deadline, server.log.read_text()[-2000:]
        time.sleep(0.1)
    return pids


@pytest.mark.parametrize("via", ["sdk", "http"])
def test_mixed_load_leaves_no_failure_no_block_and_no_growth(server, via):
    pids = _pids(server)
    assert {"scheduler", "frontend"} <= set(pids) and any("executor" in n for n in pids), pids

    async def load() -> dict:
        driver = SdkDriver(server.zmq_address, MIX) if via == "sdk" else \
            HttpDriver(server.base, MIX)
        return await run_load(driver, MIX, pids)

    report = asyncio.run(load())
    shown = json.dumps(report, indent=1)
    for summary in report["rounds"]:
        assert summary["requests"] == MIX.requests and summary["failed"] == 0, shown
        assert summary["idle_after"], shown
        assert summary["completed"] + summary["refused"] > 0, shown
    growth = report["rss_growth_mib"]
    assert all(g is not None for g in growth.values()), shown   # every process lives on
    # The executor's allocator and per-shape caches keep growing over many rounds this
    # small before they level off (a few MiB a round after eight): only the processes that
    # hold per-request state in Python are held to the slack.
    assert growth["scheduler"] <= RSS_SLACK_MIB and growth["frontend"] <= RSS_SLACK_MIB, shown
