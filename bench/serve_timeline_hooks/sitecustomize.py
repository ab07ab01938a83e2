"""Loaded by every Python process of a `folio serve` started by bench/serve_timeline.py (this
folder leads its PYTHONPATH). With FOLIO_TIMELINE set, the scheduler process writes a line
per request added, step planned and result read, and the executor process one per step run,
to FOLIO_TIMELINE.<pid>, each with its CLOCK_MONOTONIC time (shared by every process).
A diagnostic: it wraps the services' methods, so it follows their names."""

import importlib.abc
import importlib.machinery
import os
import sys
import time

_BASE = os.environ.get("FOLIO_TIMELINE")


def _writer(prefix: str):
    handle = []

    def write(*fields) -> None:
        if not handle:
            handle.append(open(f"{_BASE}.{prefix}{os.getpid()}", "a", buffering=1))
        handle[0].write(" ".join(map(str, fields)) + "\n")

    return write


def _wrap_scheduler(service) -> None:
    write, cls = _writer(""), service.SchedulerService
    add, step, result = cls._add, cls._step, cls._on_result

    def timed_add(self, identity, request_id, prompt, *args, **kwargs):
        at = time.monotonic()
        add(self, identity, request_id, prompt, *args, **kwargs)
        held = self.scheduler.requests.get(request_id) if self.scheduler else None
        write("add", at, request_id, len(prompt), held.handle if held is not None else -1)

    def timed_step(self):
        at = time.monotonic()
        step(self)
        plan = self.steps.plans[-1] if self.steps.plans else None
        if plan is not None and plan.step_id == self.steps.last_sent:
            new = ",".join(f"{r.handle}:{r.num_new_tokens}" for r in plan.new_requests)
            write("plan", at, plan.step_id, len(plan.running_handles), new or "-")

    def timed_result(self, outcome):
        write("result", time.monotonic(), outcome.step_id)
        return result(self, outcome)

    cls._add, cls._step, cls._on_result = timed_add, timed_step, timed_result


def _wrap_executor(service) -> None:
    write, cls = _writer("exec."), service.ExecutorService
    apply = cls._apply

    def timed_apply(self, plan):
        start = time.monotonic()
        apply(self, plan)
        write("exec", start, time.monotonic(), plan.step_id)

    cls._apply = timed_apply


_WRAPS = {"folio.scheduler.service": _wrap_scheduler, "folio.executor.service": _wrap_executor}


class _WrapOnImport(importlib.abc.MetaPathFinder):
    """Wraps a service's module as it is first imported, in whichever process imports it
    (the scheduler process never imports torch, so nothing is imported here ahead)."""

    def find_spec(self, name, path, target=None):
        if name not in _WRAPS:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        execute = spec.loader.exec_module

        def exec_module(module):
            execute(module)
            _WRAPS[name](module)

        spec.loader.exec_module = exec_module
        return spec


if _BASE:
    sys.meta_path.insert(0, _WrapOnImport())
