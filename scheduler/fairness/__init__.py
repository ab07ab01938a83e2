"""The order of the waiting and swapped queues (docs/serving.md, "Who goes first"): each
request's place is fixed when it arrives, from its priority, aged by the steps it waits
(aging.py), and its client's virtual clock, so that clients take turns (client_clocks.py)."""
