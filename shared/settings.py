"""How a setting is declared: once, as a field of a frozen config dataclass, with its
default, the sentence its --flag's help shows and its check.

The command line, the FOLIO_* variables and docs/configuration.md are generated from these
fields (folio/flags.py, folio/settings_doc.py). A config runs its fields' checks when it is
made (`check_fields` in `__post_init__`), so a bad value is refused the same way whether it
came from a flag, a variable or Python: a SettingError naming the field.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import field, fields
from typing import Any

Check = Callable[[Any], "str | None"]   # the problem with a value, or None when it is fine


class SettingError(ValueError):
    """A setting no engine can run with; `setting` is the field's name (the flag's too)."""

    def __init__(self, setting: str, problem: str) -> None:
        super().__init__(f"{setting} {problem}")
        self.setting = setting
        self.problem = problem


def setting(default: Any, help: str, flag: str | None = None, *, check: Check | None = None,
            choices: tuple[str, ...] | None = None, metavar: str | None = None,
            env: bool | str = True, kind: Callable[[str], Any] | None = None,
            nargs: str | None = None, repeat: bool = False, positional: bool = False) -> Any:
    """A config field and everything its command-line form needs.

    default: MISSING makes a required field; help: the --flag's sentence; flag: its name
    when not the field's (dashes for underscores); check: the value's check (choices add
    theirs); env: False when no FOLIO_* variable sets it, or the variable's own name when
    it is not FOLIO_<FLAG>; kind: how a flag's text becomes the value when the annotation
    (int, float, str) does not say it; nargs "+": one or more values; repeat: a repeatable
    flag (a tuple); positional: an argument without a flag."""
    metadata = {"help": help, "flag": flag, "check": check, "choices": choices,
                "metavar": metavar, "env": False if repeat or positional else env,
                "kind": kind, "nargs": nargs, "repeat": repeat, "positional": positional}
    if repeat:
        return field(default_factory=tuple, metadata=metadata)
    return field(default=default, metadata=metadata)


class Checked:
    """A config base that runs its fields' declared checks when made (a dataclass whose
    own __post_init__ calls check_fields does the same)."""

    def __post_init__(self) -> None:
        check_fields(self)


def check_fields(config: Any) -> None:
    """Run every declared check of `config`'s fields: the first problem is a SettingError."""
    for spec in fields(config):
        value = getattr(config, spec.name)
        choices = spec.metadata.get("choices")
        problem = one_of(choices)(value) if choices and value is not None else None
        check = spec.metadata.get("check")
        if problem is None and check is not None:
            problem = check(value)
        if problem is not None:
            raise SettingError(spec.name, problem)


# ---- checks: each returns the problem with a value, or None ----------------------------

def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def positive_int(value: Any) -> str | None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        return f"must be a positive integer, got {value!r}"
    return None


def non_negative_int(value: Any) -> str | None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        return f"must be an integer >= 0, got {value!r}"
    return None


def at_least(low: float, unit: str = "") -> Check:
    def check(value: Any) -> str | None:
        return None if _number(value) and value >= low else \
            f"must be >= {low}{unit}, got {value}"
    return check


def above(low: float, unit: str = "") -> Check:
    def check(value: Any) -> str | None:
        return None if _number(value) and value > low else f"must be > {low}{unit}, got {value}"
    return check


def in_range(low: int, high: int) -> Check:
    def check(value: Any) -> str | None:
        return None if _number(value) and low <= value <= high else \
            f"must be in {low}..{high}, got {value}"
    return check


def fraction(value: Any) -> str | None:
    return None if _number(value) and 0 < value <= 1 else f"must be in (0, 1], got {value}"


def power_of_two(value: Any) -> str | None:
    problem = positive_int(value)
    if problem is None and value & (value - 1):
        return f"must be a power of two, got {value}"
    return problem


def one_of(allowed: tuple[str, ...]) -> Check:
    def check(value: Any) -> str | None:
        return None if value in allowed else \
            f"must be one of {', '.join(allowed)}; got {value!r}"
    return check


def optional(check: Check) -> Check:
    """`check`, but None (unset) passes."""
    return lambda value: None if value is None else check(value)
