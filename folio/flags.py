"""Config dataclasses as command-line flags and FOLIO_* variables, and back: each field's
flag, type, default, choices, variable and help sentence come from the field itself
(shared/settings.py's `setting`).

A flag's variable is FOLIO_<FLAG> (dashes as underscores, e.g. FOLIO_CURVE_KEYS for
--curve-keys) unless the field names another; a flag on the command line wins, an empty
variable counts as unset. Repeatable flags and positional arguments have no variable.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from collections.abc import Mapping
from typing import Any

_KINDS = {"int": int, "float": float, "str": str}
_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


def flag_name(spec: dataclasses.Field) -> str:
    return spec.metadata.get("flag") or spec.name.replace("_", "-")


def env_name(spec: dataclasses.Field) -> str | None:
    """The FOLIO_* variable that sets this field, or None."""
    env = spec.metadata.get("env", True)
    if env is False:
        return None
    return env if isinstance(env, str) else "FOLIO_" + flag_name(spec).replace("-", "_").upper()


def _kind(spec: dataclasses.Field) -> Any:
    """How a flag's text becomes the field's value: declared, or the annotation's type
    (a string under `from __future__ import annotations`: "int | None", "float", ...)."""
    if spec.metadata.get("kind"):
        return spec.metadata["kind"]
    first = str(spec.type).split(" ")[0].split("[")[0]
    return _KINDS.get(first, str)


class FolioParser(argparse.ArgumentParser):
    """A parser whose flags may come from FOLIO_* variables (read when it parses: a bad
    variable is reported by the command that uses it), with one-line errors."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)
        self.env_names: dict[str, str] = {}   # dest -> its FOLIO_* variable

    def parse_known_args(self, args=None, namespace=None):
        apply_env_defaults(self)
        return super().parse_known_args(args, namespace)

    def error(self, message: str):   # one line, not the whole usage
        self.exit(2, f"{self.prog}: error: {message} (`{self.prog} --help` lists the flags)\n")


def add_config_args(parser: FolioParser, cls: type, skip: tuple[str, ...] = (),
                    defaults: Mapping[str, Any] | None = None, inherited: bool = False
                    ) -> None:
    """Every field of the config dataclass `cls` (but `skip`) as an argument with its
    declared default (or this command's, from `defaults`), help sentence and variable.
    inherited: the flag repeats one of the main parser's (given before or after the
    subcommand); its value stays the main parser's unless given here."""
    defaults = defaults or {}
    for spec in dataclasses.fields(cls):
        if spec.name in skip:
            continue
        meta = spec.metadata
        default = defaults.get(spec.name, spec.default)
        if spec.default_factory is not dataclasses.MISSING:   # a repeatable flag's ()
            default = []
        kwargs: dict[str, Any] = {"help": meta.get("help"), "dest": spec.name}
        if meta.get("positional"):
            optional_value = {"nargs": meta["nargs"], "default": spec.default} \
                if meta.get("nargs") else {}
            parser.add_argument(spec.name, choices=meta.get("choices"), help=meta.get("help"),
                                **optional_value)
            continue
        if inherited:
            default = argparse.SUPPRESS
            kwargs["help"] = f"{kwargs['help']} (default: the value given before the " \
                "subcommand, else " + str(spec.default) + ")"
        if default is dataclasses.MISSING:
            kwargs["required"] = True
        else:
            kwargs["default"] = default
        if not isinstance(spec.default, bool) and not meta.get("choices"):   # the flag's name
            kwargs["metavar"] = meta.get("metavar") or flag_name(spec).replace("-", "_").upper()
        if meta.get("repeat"):
            kwargs["action"] = "append"
        elif isinstance(spec.default, bool):
            kwargs["action"] = argparse.BooleanOptionalAction
        else:
            kwargs.update(type=_kind(spec), choices=meta.get("choices"))
            if meta.get("nargs"):
                kwargs["nargs"] = meta["nargs"]
        parser.add_argument("--" + flag_name(spec), **kwargs)
        name = env_name(spec)
        if name is not None and not inherited:
            parser.env_names[spec.name] = name


def config_values(args: argparse.Namespace, cls: type,
                  skip: tuple[str, ...] = ()) -> dict[str, Any]:
    """The fields of `cls` (but `skip`) read back from parsed arguments."""
    values = {}
    for spec in dataclasses.fields(cls):
        if spec.name in skip:
            continue
        value = getattr(args, spec.name)
        values[spec.name] = tuple(value) if spec.metadata.get("repeat") else value
    return values


def config_of(cls: type, args: argparse.Namespace, **given: Any) -> Any:
    """An instance of `cls` from parsed arguments (its declared checks run), the fields in
    `given` set by the caller instead."""
    return cls(**config_values(args, cls, skip=tuple(given)), **given)


def config_flags(config: Any, skip: tuple[str, ...] = ()) -> list[str]:
    """The command-line form of a config dataclass: what add_config_args parses back."""
    flags: list[str] = []
    for spec in dataclasses.fields(config):
        value: Any = getattr(config, spec.name)
        if spec.name in skip or value is None:
            continue
        flag = "--" + flag_name(spec)
        if spec.metadata.get("positional"):
            flags.append(str(value))
        elif isinstance(value, bool):
            flags.append(flag if value else "--no-" + flag[2:])
        elif spec.metadata.get("repeat"):
            for item in value:
                flags += [flag, str(item)]
        elif spec.metadata.get("nargs") and isinstance(value, (list, tuple)):
            if value:   # none given: no flag (nargs "+" takes at least one)
                flags += [flag, *map(str, value)]
        else:
            flags += [flag, str(value)]
    return flags


def apply_env_defaults(parser: FolioParser) -> None:
    """Each declared FOLIO_* variable in the environment becomes the default of its flag
    (and satisfies a required flag); the command line still wins."""
    for action in parser._actions:
        name = parser.env_names.get(action.dest)
        raw = os.environ.get(name, "") if name else ""
        if raw == "":
            continue
        try:
            if isinstance(action, argparse.BooleanOptionalAction):
                if raw.lower() not in _TRUE + _FALSE:
                    raise ValueError("expected 1/0, true/false, yes/no or on/off")
                value: Any = raw.lower() in _TRUE
            else:
                value = action.type(raw) if action.type else raw
            if action.choices is not None and value not in action.choices:
                raise ValueError(f"expected one of {', '.join(map(str, action.choices))}")
        except ValueError as error:
            parser.error(f"environment variable {name}={raw!r}: {error}")
        action.default = value
        action.required = False


def default_text(action: argparse.Action) -> str | None:
    """A flag's default as its help line and docs/configuration.md show it; None when its
    sentence says it."""
    if action.required:
        return "required"
    default = action.default
    if default is argparse.SUPPRESS:
        return None
    if isinstance(default, bool):
        return "on" if default else "off"
    return "none" if default in (None, []) else str(default)


class HelpFormatter(argparse.HelpFormatter):
    """Each flag's line ends with its default (or 'required'), unless its sentence says it;
    switches read on/off, unset values none."""

    def _get_help_string(self, action: argparse.Action) -> str:
        # Python 3.11's BooleanOptionalAction appends its own "(default: %(default)s)".
        text = (action.help or "").removesuffix(" (default: %(default)s)")
        if "default:" in text or not action.option_strings or action.dest == "help":
            return text
        shown = default_text(action)
        if shown is None:
            return text
        if shown == "required":
            return f"{text} (required)"
        return f"{text} (default: {shown.replace('%', '%%')})"
