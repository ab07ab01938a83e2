"""docs/configuration.md, generated from the declared settings: one table per command
(flag, FOLIO_* variable, default, meaning), the variables without a flag, and those
compose.yaml reads itself.

    python -m folio.settings_doc            # rewrite docs/configuration.md
    python -m folio.settings_doc --check    # exit 1 if the page is stale

tests/processes/test_deploy_files.py fails when the committed page differs from this.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from folio.cli import build_parser, command_parser
from folio.flags import default_text
from folio.command_settings import COMMANDS, ENVIRONMENT_ONLY

PAGE = Path(__file__).resolve().parents[1] / "docs" / "configuration.md"

# compose.yaml's own variables (no flag): which image, model folder and host ports.
COMPOSE_VARIABLES = {
    "FOLIO_IMAGE": ("folio:latest (compose.cpu.yaml: folio:cpu)", "image name to build and run"),
    "FOLIO_BASE_IMAGE": ("pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime",
                         "the GPU image's base (build argument BASE)"),
    "FOLIO_MODEL_DIR": ("./models/default", "host directory mounted read-only at /models"),
    "FOLIO_MODEL_PATH": ("/models", "the checkpoint inside the container (e.g. a snapshot "
                         "inside a mounted Hugging Face cache)"),
    "FOLIO_PUBLISH_ADDRESS": ("127.0.0.1", "host interface of the published ports (0.0.0.0: "
                              "every interface)"),
    "FOLIO_HTTP_PORT": ("8000", "host port of the HTTP API"),
    "FOLIO_ZMQ_PORT": ("5555", "host port of the ZeroMQ SDK socket"),
}

INTRO = """# Configuration

Every setting of every `folio` command, generated from the settings' declarations
(`python -m folio.settings_doc` writes this page; do not edit it by hand). Each setting is
declared once, with its default, help sentence and check, beside the code that uses it:
the engine's in `shared/config.py`, the scheduler process's in `scheduler/service_config.py`, the
transport, shutdown, client-limit and HTTP settings in `shared/service_settings.py`, and
those only the command line has in `folio/command_settings.py`.

Every flag can also come from the environment as the variable shown (`FOLIO_<FLAG>`, the
flag's name in capitals with dashes as underscores); a flag on the command line wins, an
empty variable counts as unset, a switch's variable takes `1`/`0`, `true`/`false`,
`yes`/`no` or `on`/`off`. A value no engine can run with is refused before any process
starts, in one line naming the flag (exit status 2); `folio serve` and each role run the
same checks (`folio/checks.py`).
"""


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _row(action: argparse.Action, parser) -> str:
    if action.option_strings:
        flag = f"`{action.option_strings[0]}`"
        if isinstance(action, argparse.BooleanOptionalAction):
            flag += f" / `{action.option_strings[1]}`"
        else:
            value = action.metavar or action.option_strings[0][2:].replace("-", "_").upper()
            flag = f"`{action.option_strings[0]} {value}{' ...' if action.nargs == '+' else ''}`"
    else:
        flag = f"`{action.dest.upper()}` (positional)"
    env = parser.env_names.get(action.dest)
    help_text = (action.help or "").removesuffix(" (default: %(default)s)")
    said = re.search(r" ?\(default: ([^()]*(?:\([^()]*\)[^()]*)*)\)", help_text)
    if said:
        default, help_text = said.group(1), help_text.replace(said.group(0), "")
    else:
        default = default_text(action) or ""
    if action.choices and not action.option_strings:
        help_text += f" ({', '.join(action.choices)})"
    elif action.choices:
        help_text += f"{'; o' if help_text else 'O'}ne of {', '.join(map(str, action.choices))}"
    return (f"| {flag} | {f'`{env}`' if env else '—'} | {_cell(default)} | "
            f"{_cell(help_text)} |")


def _table(parser, actions) -> list[str]:
    rows = [_row(a, parser) for a in actions if a.dest != "help"
            and a.default is not argparse.SUPPRESS]   # --log-level: listed once, above
    return ["| Flag | Variable | Default | Meaning |", "| --- | --- | --- | --- |", *rows]


def configuration_page() -> str:
    parser = build_parser()
    lines = [INTRO, "## Every command", "", "Given before or after the subcommand.", "",
             *_table(parser, [a for a in parser._actions if a.dest == "log_level"])]
    for name in [c.name for c in COMMANDS]:
        sub = command_parser(parser, name)
        summary = _help_of(parser, name)
        lines += ["", f"## folio {name}", "", summary[0].upper() + summary[1:],
                  "", *_table(sub, sub._actions)]
    lines += ["", "## Environment only", "",
              "Read by the code that needs it; no flag sets it.", "",
              "| Variable | Default | Meaning |", "| --- | --- | --- |"]
    lines += [f"| `{n}` | {d} | {_cell(m)} |" for n, (d, m) in ENVIRONMENT_ONLY.items()]
    lines += ["", "## Docker Compose", "",
              "`compose.yaml` passes the variables of the tables above from your shell or "
              "`.env` file to the services that use them, and reads these itself:", "",
              "| Variable | Default | Meaning |", "| --- | --- | --- |"]
    lines += [f"| `{n}` | `{d}` | {_cell(m)} |" for n, (d, m) in COMPOSE_VARIABLES.items()]
    return "\n".join(lines) + "\n"


def _help_of(parser, name: str) -> str:
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return next(c.help for c in sub._choices_actions if c.dest == name) + "."


def main(argv: list[str] | None = None) -> int:
    args = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    args.add_argument("--check", action="store_true", help="exit 1 if the page is stale")
    if args.parse_args(argv).check:
        stale = not PAGE.exists() or PAGE.read_text() != configuration_page()
        print(f"{PAGE} is {'stale: run python -m folio.settings_doc' if stale else 'current'}")
        return int(stale)
    PAGE.write_text(configuration_page())
    print(f"wrote {PAGE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
