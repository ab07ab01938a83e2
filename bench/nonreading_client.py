"""A client that sends and never reads, against a real `folio serve` (issue 25).

    python -m bench.nonreading_client --rate 10000 --seconds 15
    python -m bench.nonreading_client --seconds 10 -- --max-queued-requests 1000

Starts `folio serve` (the built-in model unless --model) with the HTTP API on loopback, then
runs, for --seconds, a raw DEALER (receive queue of one message, kernel buffer of one byte)
that sends --rate streamed generates a second and never reads a reply, while a bystander SDK
client generates a short greedy request in a loop and `/health` is timed every 0.25 s. The
attacker then leaves; the script waits (at most --recovery-timeout) until the engine holds
no request and every KV block is free, and times SIGTERM. Arguments after `--` go to
`folio serve`.

Prints one JSON summary: requests sent, peak scheduler and frontend RSS, the slowest
`/health`, bystander outcomes, log size and traceback count, recovery and stop times.
Loopback only; every loop is bounded in time.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import zmq  # noqa: E402

from bench.serve_process import stop  # noqa: E402
from folio import SamplingParams  # noqa: E402
from folio.client import Client  # noqa: E402
from folio.shared.protocol import messages as m  # noqa: E402

GREEDY = SamplingParams(temperature=0, ignore_eos=True, max_tokens=4)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _role_pids(log: Path) -> dict[str, int]:
    """The roles' pids from `folio serve`'s banner ("pids: scheduler=1, executor=2, ...")."""
    for line in log.read_text(errors="replace").splitlines():
        if line.strip().startswith("pids:"):
            pairs = (item.split("=") for item in line.split(":", 1)[1].split(","))
            return {role.strip(): int(pid) for role, pid in pairs}
    return {}


def _rss_mib(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def _cpu_s(pid: int) -> float:
    """CPU seconds (user + system) the process has used."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _health(base: str, timeout: float) -> tuple[float, dict | None]:
    start = time.monotonic()
    try:
        with urllib.request.urlopen(f"{base}/health", timeout=timeout) as response:
            body = json.loads(response.read())
    except (OSError, ValueError):
        body = None
    return time.monotonic() - start, body


def _engine_stats(watcher: Client) -> dict:
    """The scheduler's stats through the SDK's health (HTTP /health has none); {} if none."""
    try:
        return watcher.health(timeout=5.0).get("stats") or {}
    except Exception:   # the frontend did not answer in time: counted by the caller
        return {}


def non_reading_dealer(ctx: zmq.Context, address: str) -> zmq.Socket:
    """A DEALER that never reads: its receive queue holds one message, its buffer one byte."""
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.RCVHWM, 1)
    sock.setsockopt(zmq.RCVBUF, 1)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(address)
    return sock


def _attack(address: str, rate: float, seconds: float, sent: list[int]) -> None:
    ctx = zmq.Context()
    sock = non_reading_dealer(ctx, address)
    params = SamplingParams(max_tokens=64, ignore_eos=True)
    start = time.monotonic()
    try:
        while (elapsed := time.monotonic() - start) < seconds:
            due = int(elapsed * rate) + 1
            while sent[0] < due:
                try:
                    sock.send(m.encode_generate(uuid.uuid4().hex, params, True,
                                                prompt_token_ids=[5, 6, 7, 8]), zmq.NOBLOCK)
                    sent[0] += 1
                except zmq.Again:   # the frontend does not read fast enough
                    sent[1] += 1
                    break
            time.sleep(0.001)
    finally:
        sock.close(0)
        ctx.term()


def _bystander(address: str, stop: threading.Event, outcomes: dict) -> None:
    with Client(address, timeout=10.0) as client:
        expected = outcomes["expected"] = client.generate([1, 2, 3], GREEDY).token_ids
        while not stop.is_set():
            try:
                got = client.generate([1, 2, 3], GREEDY).token_ids
                outcomes["ok" if got == expected else "wrong"] += 1
            except Exception as error:   # a timeout or a refusal: counted, not fatal
                key = type(error).__name__
                outcomes[key] = outcomes.get(key, 0) + 1
            stop.wait(0.2)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", help="checkpoint directory (default: the built-in model)")
    parser.add_argument("--rate", type=float, default=10000.0,
                        help="attacker's generates per second (default 10000)")
    parser.add_argument("--seconds", type=float, default=15.0,
                        help="how long the attacker sends, at most 20 (default 15)")
    parser.add_argument("--recovery-timeout", type=float, default=120.0,
                        help="seconds to wait for the engine to be idle after (default 120)")
    parser.add_argument("serve_args", nargs="*", help="after --: more `folio serve` flags")
    args = parser.parse_args()
    args.seconds = min(args.seconds, 20.0)
    run_dir = Path(tempfile.mkdtemp(prefix="folio-nonreading-"))
    port = _free_port()
    base, address = f"http://127.0.0.1:{port}", f"ipc://{run_dir}/client.sock"
    log = run_dir / "serve.log"
    model = ["--model", args.model] if args.model else []
    env = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1")
    proc = subprocess.Popen(
        [sys.executable, "-m", "folio", "serve", *model, "--port", str(port),
         "--zmq-address", address, *args.serve_args],
        cwd=ROOT, env=env, stdout=open(log, "wb"), stderr=subprocess.STDOUT)
    summary: dict = {"rate": args.rate, "seconds": args.seconds, "serve_args": args.serve_args}
    try:
        deadline = time.monotonic() + 180
        while _health(base, 1.0)[1] is None:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"folio serve did not start: {log.read_text()[-2000:]}")
            time.sleep(0.3)
        time.sleep(1.0)   # the banner follows the first good /health
        pids = _role_pids(log)
        peak = {role: _rss_mib(pid) for role, pid in pids.items()}
        summary["rss_before_mib"] = dict(peak)
        sent, outcomes, stop = [0, 0], {"ok": 0, "wrong": 0}, threading.Event()
        attacker = threading.Thread(target=_attack, args=(address, args.rate, args.seconds,
                                                          sent))
        bystander = threading.Thread(target=_bystander, args=(address, stop, outcomes))
        bystander.start()
        attacker.start()
        slowest, unanswered, most_held = 0.0, 0, 0
        watcher = Client(address, timeout=10.0)
        while attacker.is_alive():
            took, body = _health(base, 5.0)
            slowest, unanswered = max(slowest, took), unanswered + (body is None)
            stats = _engine_stats(watcher)
            most_held = max(most_held, stats.get("num_running", 0) + stats.get("num_waiting", 0))
            peak = {role: max(peak[role], _rss_mib(pid)) for role, pid in pids.items()}
            time.sleep(0.25)
        left_at = time.monotonic()
        stop.set()   # an idle engine below means the attacker's requests are gone
        bystander.join(30)
        summary.update(sent=sent[0], attacker_send_refused=sent[1],
                       health_slowest_s=round(slowest, 3), health_unanswered=unanswered,
                       most_requests_held=most_held,
                       bystander={k: v for k, v in outcomes.items() if k != "expected"})
        recovered_after = None
        while time.monotonic() - left_at < args.recovery_timeout:
            took, body = _health(base, 5.0)
            slowest = max(slowest, took)
            peak = {role: max(peak[role], _rss_mib(pid)) for role, pid in pids.items()}
            stats = _engine_stats(watcher)
            if (stats.get("num_running") == 0 and stats.get("num_waiting") == 0
                    and stats.get("kv_blocks_free") == stats.get("kv_blocks_total")):
                recovered_after = time.monotonic() - left_at
                break
            time.sleep(0.25)
        busy = {role: _cpu_s(pid) for role, pid in pids.items()}
        time.sleep(3.0)   # after it left: nobody should be busy on its account
        summary["cpu_share_3s_after"] = {role: round((_cpu_s(pid) - busy[role]) / 3.0, 2)
                                         for role, pid in pids.items()}
        try:   # served as before, and right
            after = watcher.generate([1, 2, 3], GREEDY).token_ids == outcomes.get("expected")
        except Exception as error:   # e.g. the frontend is gone: reported, not raised
            after = f"{type(error).__name__}: {error}"
        watcher.close()
        summary["processes_alive"] = {role: Path(f"/proc/{pid}").exists()
                                      for role, pid in pids.items()}
        summary.update(
            recovered_after_s=None if recovered_after is None else round(recovered_after, 2),
            health_slowest_overall_s=round(slowest, 3), bystander_after_ok=after,
            rss_peak_mib={k: round(v) for k, v in peak.items()},
            rss_after_mib={role: round(_rss_mib(pid)) for role, pid in pids.items()})
    finally:
        stopping = time.monotonic()
        stop(proc, timeout=90)
        summary["sigterm_s"] = round(time.monotonic() - stopping, 2)
        text = log.read_text(errors="replace")
        summary.update(log_bytes=len(text.encode()), log_lines=text.count("\n"),
                       tracebacks=text.count("Traceback"),
                       never_retrieved=text.count("was never retrieved"), log=str(log))
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
