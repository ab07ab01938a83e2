"""A ZeroMQ client that sends and never reads (issue 25): the attacker of
tests/frontend/test_nonreading_clients.py and tests/processes/test_nonreading_served.py."""

from __future__ import annotations

import zmq


def non_reading_dealer(ctx: zmq.Context, address: str) -> zmq.Socket:
    """A DEALER that never reads: its receive queue holds one message, its buffer one byte."""
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.RCVHWM, 1)
    sock.setsockopt(zmq.RCVBUF, 1)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(address)
    return sock
