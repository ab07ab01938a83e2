"""The wire: every message that crosses a socket, declared once, framed with msgpack."""
