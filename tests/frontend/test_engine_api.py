"""The engine client and the data-parallel replicas implement the one declared engine API
(frontend/engine_api.py), member for member, with the same call signatures."""

from __future__ import annotations

import inspect

import pytest
import zmq.asyncio

from folio.frontend.engine_client import EngineClient
from folio.frontend.engine_api import Engine
from folio.frontend.input_processor import ModelFacts
from folio.frontend.replicas import Replicas
from folio.shared.hf_tokenizer import load_tokenizer


def _declared() -> dict[str, object]:
    names = set(Engine.__annotations__)
    names |= {name for name, value in vars(Engine).items()
              if not name.startswith("_") and (callable(value) or isinstance(value, property))}
    return {name: getattr(Engine, name, None) for name in names}


@pytest.fixture
def engines(tokenizer_dir, tmp_path):
    ctx = zmq.asyncio.Context()
    tokenizer = load_tokenizer(tokenizer_dir)
    made = [EngineClient(tokenizer, f"ipc://{tmp_path}/none.sock", ctx),
            Replicas(tokenizer, [f"ipc://{tmp_path}/a.sock", f"ipc://{tmp_path}/b.sock"], ctx)]
    try:
        yield made
    finally:
        for engine in made:
            engine.close()
        ctx.term()


def test_both_kinds_implement_the_declared_engine(engines):
    declared = _declared()
    assert {"submit", "abort", "replica_health", "rank_health", "inputs", "facts"} <= \
        set(declared)
    for engine in engines:
        assert isinstance(engine, Engine)
        for name, member in declared.items():
            assert hasattr(engine, name), f"{type(engine).__name__} lacks {name}"
            if callable(member) and not isinstance(member, property):
                ours = inspect.signature(getattr(type(engine), name)).parameters
                theirs = list(inspect.signature(member).parameters)
                # The declared parameters, in order; any more are optional.
                assert list(ours)[:len(theirs)] == theirs, \
                    f"{type(engine).__name__}.{name}({', '.join(ours)}) is not {name}{theirs}"
                assert all(p.default is not p.empty for p in list(ours.values())[len(theirs):])


def test_members_one_kind_has_no_use_for_answer_plainly(engines):
    single, replicas = engines
    assert single.replica_health() is None and single.rank_health() == []
    health = replicas.replica_health()
    assert [entry["replica"] for entry in health] == [0, 1]
    assert replicas.rank_health() == []   # listed under each replica instead
    for engine in engines:   # before the scheduler's engine_info: the defaults
        assert engine.facts == ModelFacts(len(engine.tokenizer), None, *engine.limits)
        assert engine.inputs.tokenizer is engine.tokenizer
