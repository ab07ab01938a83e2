"""`folio plan` and `folio simulate` inputs are validated like every other setting: a bad
trace line, a trace past the request cap, repeated request names, a cost file without its
scheduling keys and a pool too large to simulate are one line naming the field (and the
trace's line), exit 2; a trace is read lazily and no further than the cap."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from folio.planner.command import PlanSettings, run_plan
from folio.planner.cost import load_cost
from folio.planner.simulator.inputs import MAX_KV_BLOCKS, MAX_LINE_BYTES, MAX_REQUESTS, \
    load_trace
from folio.planner import workload
from folio.shared.config import SettingError
from tests.planner.hand_cost import hand_cost

ROOT = Path(__file__).resolve().parents[2]
GOOD = {"arrival": 0, "prompt_tokens": 8, "output_tokens": 4}


def _trace(tmp_path: Path, *items, name: str = "trace.jsonl") -> Path:
    path = tmp_path / name
    path.write_text("".join((i if isinstance(i, str) else json.dumps(i)) + "\n"
                            for i in items))
    return path


def _cost_file(tmp_path: Path, change=None) -> Path:
    data = json.loads(hand_cost().to_json())
    if change is not None:
        change(data)
    path = tmp_path / "cost.json"
    path.write_text(json.dumps(data))
    return path


def _folio(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "folio", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)


def _one_line_error(result: subprocess.CompletedProcess, start: str) -> str:
    err = result.stderr.strip()
    assert result.returncode == 2, result.stderr
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert err.startswith(start), err
    return err


@pytest.mark.parametrize("line, problem", [
    ('{"arrival": Infinity, "prompt_tokens": 8, "output_tokens": 4}',
     "arrival must be a finite number"),
    ('{"arrival": NaN, "prompt_tokens": 8, "output_tokens": 4}', "arrival must be a finite"),
    ('{"arrival": -1, "prompt_tokens": 8, "output_tokens": 4}', "arrival must be"),
    ('{"arrival": "soon", "prompt_tokens": 8, "output_tokens": 4}', "arrival must be"),
    ('{"prompt_tokens": 8, "output_tokens": 4}', "missing arrival"),
    ('{"arrival": 0, "prompt_tokens": 8.5, "output_tokens": 4}', "prompt_tokens must be"),
    ('{"arrival": 0, "prompt_tokens": true, "output_tokens": 4}', "prompt_tokens must be"),
    ('{"arrival": 0, "prompt_tokens": 8, "output_tokens": 0}', "output_tokens must be"),
    ('{"arrival": 0, "prompt_tokens": 8}', "missing output_tokens"),
    ('{"arrival": 0, "prompt_tokens": 8, "output_tokens": 4, "prefix": "s", '
     '"prefix_tokens": "4"}', "prefix_tokens must be an integer"),
    ('{"arrival": 0, "prompt_tokens": 8, "output_tokens": 4, "prefix": "s", '
     '"prefix_tokens": 4.5}', "prefix_tokens must be an integer"),
    ('{"arrival": 0, "prompt_tokens": 8, "output_tokens": 4, "prefix": "s", '
     '"prefix_tokens": 9}', "prefix_tokens (9) is more than prompt_tokens (8)"),
    ('{"arrival": 0, "prompt_tokens": 8, "output_tokens": 4, "prefix": {"a": [1, 2]}}',
     "prefix must be a string or an integer"),
    ('{"arrival": 0, "prompt_tokens": 8, "output_tokens": 4, "prefix_id": [1]}',
     "prefix_id must be a string or an integer"),
    ('{"arrival": 0, "prompt_tokens": 8, "output_tokens": 4, "name": {"x": 1}}',
     "name must be a string or an integer"),
    ('[1, 2]', "not a JSON object (list)"),
    ('{"arrival": 0,', "not JSON"),
])
def test_a_bad_trace_line_names_its_line_and_field(tmp_path, line, problem):
    path = _trace(tmp_path, GOOD, line)
    with pytest.raises(ValueError) as caught:
        load_trace(path)
    message = str(caught.value)
    assert message.startswith(f"{path}:2: ") and problem in message, message
    assert "\n" not in message


def test_nested_json_is_shown_short(tmp_path):
    path = _trace(tmp_path, {**GOOD, "prefix": {"k": list(range(10_000))}})
    with pytest.raises(ValueError) as caught:
        load_trace(path)
    assert len(str(caught.value)) < len(str(path)) + 120


def test_repeated_names_are_refused(tmp_path):
    path = _trace(tmp_path, {**GOOD, "name": "a"}, {**GOOD, "name": "b"},
                  {**GOOD, "arrival": 1, "name": "a"})
    with pytest.raises(ValueError, match=r":3: name 'a' repeats line 1's"):
        load_trace(path)


def test_a_name_cannot_take_an_unnamed_requests_place(tmp_path):
    """An unnamed request is named by its position: an explicit "1" elsewhere collides."""
    path = _trace(tmp_path, {**GOOD, "name": "1"}, GOOD)
    with pytest.raises(ValueError, match=r":2: name '1' repeats line 1's"):
        load_trace(path)


def test_unnamed_requests_are_named_by_position(tmp_path):
    path = _trace(tmp_path, GOOD, "", {**GOOD, "name": "last"}, {**GOOD, "arrival": 2})
    assert [r.name for r in load_trace(path)] == ["0", "last", "2"]


def test_reading_stops_past_the_cap(tmp_path):
    """The line past the cap is refused before it is parsed, and the rest never read."""
    path = _trace(tmp_path, GOOD, GOOD | {"arrival": 1}, GOOD | {"arrival": 2},
                  "this is not even JSON", "nor this")
    with pytest.raises(ValueError, match=r":4: more than 3 requests .*stopped reading"):
        load_trace(path, max_requests=3)
    exactly = _trace(tmp_path, GOOD, GOOD | {"arrival": 1}, GOOD | {"arrival": 2},
                     name="exactly.jsonl")
    assert len(load_trace(exactly, max_requests=3)) == 3


def test_the_trace_cap_is_the_generated_workloads_cap():
    assert workload.MAX_REQUESTS == MAX_REQUESTS == 100_000
    assert load_trace.__defaults__ == (MAX_REQUESTS,)


def test_a_line_too_long_is_refused_without_holding_it(tmp_path):
    path = tmp_path / "long.jsonl"
    path.write_text(json.dumps(GOOD) + "\n" + " " * (MAX_LINE_BYTES * 4) + "\n")
    with pytest.raises(ValueError, match=r":2: longer than"):
        load_trace(path)


def test_a_file_that_is_not_text_is_refused(tmp_path):
    path = tmp_path / "binary.jsonl"
    path.write_bytes(json.dumps(GOOD).encode() + b"\n\xff\xfe\n")
    with pytest.raises(ValueError, match=r":2: not UTF-8"):
        load_trace(path)


def test_a_good_trace_reads_as_before(tmp_path):
    path = _trace(tmp_path, {**GOOD, "prefix_id": 7, "prefix_tokens": 4},
                  {**GOOD, "arrival": 0.5, "prefix": "sys"})
    first, second = load_trace(path)
    assert (first.prefix, first.prefix_tokens, second.prefix, second.arrival) == \
        ("7", 4, "sys", 0.5)


@pytest.mark.parametrize("change, problem", [
    (lambda d: d.pop("scheduling"), "missing scheduling"),
    (lambda d: d.update(scheduling={}), "scheduling.max_num_seqs must be a positive integer"),
    (lambda d: d["scheduling"].pop("max_num_batched_tokens"),
     "scheduling.max_num_batched_tokens must be"),
    (lambda d: d["scheduling"].pop("enable_prefix_caching"),
     "missing scheduling.enable_prefix_caching"),
    (lambda d: d["scheduling"].update(enable_prefix_caching="yes"),
     "scheduling.enable_prefix_caching must be true or false"),
    (lambda d: d["scheduling"].update(preemption_mode="never"),
     "scheduling.preemption_mode must be one of"),
    (lambda d: d["kv"].update(num_kv_blocks=10 ** 12), "kv.num_kv_blocks (1000000000000) is "
     "more than a plan simulates"),
])
def test_a_cost_file_missing_what_a_plan_reads_is_refused(tmp_path, change, problem):
    path = _cost_file(tmp_path, change)
    with pytest.raises(ValueError) as caught:
        load_cost(path)
    assert str(caught.value).startswith(f"{path}: ") and problem in str(caught.value)


def test_calibrated_memory_too_large_to_simulate_names_the_cost_file(tmp_path):
    cost = _cost_file(tmp_path, lambda d: d["kv"].update(memory_bytes=10 ** 18))
    settings = PlanSettings(cost=str(cost), workload="fixed:rate=1,n=2,prompt=8,output=4")
    with pytest.raises(SettingError) as caught:
        run_plan(settings)
    assert caught.value.setting == "cost" and "more than a plan simulates" in str(caught.value)


def test_too_many_blocks_on_the_command_line_are_refused():
    with pytest.raises(SettingError) as caught:
        PlanSettings(num_kv_blocks=10 ** 12)
    assert caught.value.setting == "num_kv_blocks" and str(MAX_KV_BLOCKS) in str(caught.value)


def test_plan_refuses_an_infinite_arrival_in_one_line(tmp_path):
    trace = _trace(tmp_path, GOOD, {**GOOD, "arrival": 1e400})   # json writes Infinity
    err = _one_line_error(_folio("plan", "--cost", str(_cost_file(tmp_path)), "--workload",
                                 str(trace)), "folio plan: error: --workload ")
    assert f"{trace}:2: arrival must be a finite number" in err


def test_plan_refuses_a_cost_file_without_scheduling_in_one_line(tmp_path):
    cost = _cost_file(tmp_path, lambda d: d["scheduling"].clear())
    err = _one_line_error(_folio("plan", "--cost", str(cost), "--workload",
                                 str(_trace(tmp_path, GOOD, {**GOOD, "arrival": 1}))),
                          "folio plan: error: --cost ")
    assert "scheduling.max_num_seqs" in err


def test_simulate_refuses_a_bad_trace_line_in_one_line(tmp_path):
    trace = _trace(tmp_path, GOOD, {**GOOD, "name": "0"})
    err = _one_line_error(_folio("simulate", str(trace), "--num-kv-blocks", "16"),
                          "folio simulate: error: ")
    assert f"{trace}:2: name '0' repeats line 1's" in err
