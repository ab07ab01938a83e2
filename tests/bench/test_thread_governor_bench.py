"""bench/governor_neighbour.py's reading of the executor's log (the served runs themselves
are the bench; tests/processes/test_thread_governor_served.py checks the behaviour)."""

from __future__ import annotations

from datetime import datetime

from bench.governor_neighbour import governor_lines


def test_governor_lines_are_read_with_their_time_from_the_start(tmp_path):
    # Lines before the start (in the warm-up) count too: the count the run began with.
    log = tmp_path / "serve.log"
    log.write_text(
        "2026-12-02 05:31:45,813 folio-executor INFO CPU threads: 2 (one per usable core)\n"
        "2026-12-02 05:31:58,333 folio-executor INFO CPU threads 2 -> 1: its threads waited "
        "52% of the last 1.1 s for a core (over 25% for 2 windows in a row); a window at 2 "
        "in 2 s\n"
        "2026-12-02 05:32:00,362 folio-executor DEBUG CPU threads: a window at 2 to probe\n"
        "2026-12-02 05:32:01,400 folio-frontend INFO CPU threads 9 -> 1: not the executor\n"
        "2026-12-02 05:32:01,417 folio-executor INFO CPU threads 1 -> 2: its threads waited "
        "5% of the last 1.1 s for a core at 2\n")
    since = datetime(2026, 12, 2, 5, 32, 0).timestamp()
    lines = governor_lines(log, since)
    assert [(g["at_s"], g["from"], g["to"]) for g in lines] == [(-1.7, 2, 1), (1.4, 1, 2)]
    assert lines[0]["line"].startswith("CPU threads 2 -> 1: its threads waited 52%")
