"""Config dataclasses as command-line flags and back: each field's flag, type, default and
help sentence come from the field itself (shared/config.py's `setting`)."""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

from folio.shared.config import ATTENTION_BACKENDS, DEVICES, DTYPES, LINEAR_BACKENDS, PREEMPTION_MODES

_CHOICES = {"dtype": DTYPES, "device": DEVICES, "attention_backend": ATTENTION_BACKENDS,
            "linear_backend": LINEAR_BACKENDS, "preemption_mode": PREEMPTION_MODES}
_KINDS = {"int": int, "float": float, "str": str}


def flag_name(spec: dataclasses.Field) -> str:
    return spec.metadata.get("flag", spec.name.replace("_", "-"))


def add_config_args(parser: argparse.ArgumentParser, cls: type,
                    skip: tuple[str, ...] = ()) -> None:
    """Every field of the config dataclass `cls` (but `skip`) as a --flag, with its default
    and the help sentence written beside the field."""
    for spec in dataclasses.fields(cls):
        if spec.name in skip:
            continue
        flag, help_text = "--" + flag_name(spec), spec.metadata.get("help")
        if spec.default is dataclasses.MISSING:
            parser.add_argument(flag, required=True, help=help_text)
        elif isinstance(spec.default, bool):
            parser.add_argument(flag, action=argparse.BooleanOptionalAction,
                                default=spec.default, help=help_text)
        else:   # the annotation is a string ("int | None", "float", ...)
            kind = _KINDS.get(str(spec.type).split(" ")[0], str)
            parser.add_argument(flag, type=kind, default=spec.default,
                                choices=_CHOICES.get(spec.name), help=help_text)


def config_values(args: argparse.Namespace, cls: type,
                  skip: tuple[str, ...] = ()) -> dict[str, Any]:
    """The fields of `cls` (but `skip`) read back from parsed --flags."""
    return {spec.name: getattr(args, flag_name(spec).replace("-", "_"))
            for spec in dataclasses.fields(cls) if spec.name not in skip}


def config_flags(config: Any, skip: tuple[str, ...] = ()) -> list[str]:
    """The command-line form of a config dataclass: what add_config_args parses back."""
    flags: list[str] = []
    for spec in dataclasses.fields(config):
        value: Any = getattr(config, spec.name)
        if spec.name in skip or value is None:
            continue
        flag = "--" + flag_name(spec)
        if isinstance(value, bool):
            flags.append(flag if value else "--no-" + flag[2:])
        else:
            flags += [flag, str(value)]
    return flags


class HelpFormatter(argparse.HelpFormatter):
    """Each flag's line ends with its default (or 'required'), unless its sentence says it;
    switches read on/off, unset values none."""

    def _get_help_string(self, action: argparse.Action) -> str:
        # Python 3.11's BooleanOptionalAction appends its own "(default: True)".
        text = (action.help or "").removesuffix(" (default: %(default)s)")
        if "default:" in text or not action.option_strings or action.dest == "help":
            return text
        if action.required:
            return f"{text} (required)"
        default = action.default
        if default is argparse.SUPPRESS:
            return text
        if isinstance(default, bool):
            return f"{text} (default: {'on' if default else 'off'})"
        return f"{text} (default: {'none' if default in (None, []) else '%(default)s'})"
