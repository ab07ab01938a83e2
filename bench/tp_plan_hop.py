"""How a step's plan reaches the tensor-parallel ranks: broadcast by rank 0 over gloo (what
Folio does) against the scheduler sending it to every rank over ZeroMQ (ipc://).

    python bench/tp_plan_hop.py                   # plan sizes 1 KiB, 8 KiB, 64 KiB
    python bench/tp_plan_hop.py --sizes 2048 --iters 2000

Two processes on this host. Each figure is half a ping-pong round trip (ms), the median of
`--iters` trips of a payload of that size (a decode plan is about 20 bytes per running
request: 256 requests ~ 5 KiB). broadcast: rank 0's two gloo broadcasts (length, payload)
as executor/parallel.py sends them, answered by a one-int broadcast back; zmq: a DEALER
send to a ROUTER in the other process, answered by one byte. With the broadcast the
scheduler sends once and rank 0 waits for the other ranks' copies before its own forward;
with per-rank sends the scheduler sends N times and every rank reads its own copy.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch.multiprocessing as mp

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def _broadcast_side(rank: int, port: int, sizes: list[int], iters: int, out) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=2, timeout=datetime.timedelta(seconds=60))
    header, back = torch.zeros(1, dtype=torch.int64), torch.zeros(1, dtype=torch.int64)
    results = {}
    for size in sizes:
        data = os.urandom(size)
        trips = []
        for _ in range(iters):
            start = time.perf_counter()
            if rank == 0:
                header[0] = size
            dist.broadcast(header, 0)
            payload = (torch.frombuffer(bytearray(data), dtype=torch.uint8) if rank == 0
                       else torch.empty(int(header[0]), dtype=torch.uint8))
            dist.broadcast(payload, 0)
            dist.broadcast(back, 1)
            trips.append(time.perf_counter() - start)
        results[size] = statistics.median(trips) / 2 * 1e3
    if rank == 0:
        out.put(results)
    dist.destroy_process_group()


def _zmq_peer(address: str, count: int) -> None:
    import zmq

    ctx = zmq.Context()
    sock = ctx.socket(zmq.ROUTER)
    sock.bind(address)
    for _ in range(count):
        identity, _payload = sock.recv_multipart()
        sock.send_multipart([identity, b"k"])
    sock.close(0)
    ctx.term()


def zmq_hops(sizes: list[int], iters: int) -> dict[int, float]:
    import zmq

    address = f"ipc://{tempfile.mkdtemp()}/hop.sock"
    peer = mp.get_context("spawn").Process(target=_zmq_peer,
                                           args=(address, len(sizes) * (iters + 10)))
    peer.start()
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.connect(address)
    results = {}
    for size in sizes:
        data = os.urandom(size)
        for _ in range(10):   # connect and warm up
            sock.send(data)
            sock.recv()
        trips = []
        for _ in range(iters):
            start = time.perf_counter()
            sock.send(data)
            sock.recv()
            trips.append(time.perf_counter() - start)
        results[size] = statistics.median(trips) / 2 * 1e3
    peer.join()
    sock.close(0)
    ctx.term()
    return results


def broadcast_hops(sizes: list[int], iters: int) -> dict[int, float]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_broadcast_side, args=(r, port, sizes, iters, out))
             for r in range(2)]
    for p in procs:
        p.start()
    results = out.get(timeout=300)
    for p in procs:
        p.join()
    return results


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1024, 8192, 65536])
    parser.add_argument("--iters", type=int, default=1000)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    load = os.getloadavg()[0]
    report = {"loadavg_1m": load, "broadcast_ms": broadcast_hops(args.sizes, args.iters),
              "zmq_ms": zmq_hops(args.sizes, args.iters)}
    if args.json:
        print(json.dumps(report, indent=2))
        return
    print(f"load average {load:.2f}; one-way ms (median of {args.iters} round trips / 2)")
    for size in args.sizes:
        print(f"{size:>7} B  broadcast (gloo) {report['broadcast_ms'][size]:.3f}  "
              f"zmq ipc {report['zmq_ms'][size]:.3f}")


if __name__ == "__main__":
    main()
