"""The `folio` command: serve (all three processes), or one role on its own.

Every flag is generated from a declared setting (folio/command_settings.py lists each command's),
and may also come from the environment as FOLIO_<FLAG> (dashes as underscores, e.g.
FOLIO_CURVE_KEYS for --curve-keys); a flag on the command line wins, an empty variable
counts as unset. Every check across settings runs before the command starts anything
(folio/checks.py): a problem is one line naming the flag, exit status 2.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import Any

from folio.checks import CHECKS, ExecutorPlan, ProbePlan
from folio.flags import FolioParser, add_config_args
from folio.command_settings import COMMANDS, MAIN
from folio.shared.config import SettingError


def build_parser() -> FolioParser:
    parser = FolioParser(
        prog="folio", description="Folio LLM serving engine. Every --flag can also be set "
        "as the environment variable FOLIO_<FLAG>, e.g. FOLIO_CURVE_KEYS=/keys "
        "(docs/configuration.md lists them).")
    for group in MAIN:
        add_config_args(parser, group.config, group.skip, group.defaults)
    sub = parser.add_subparsers(dest="command", required=True)
    for command in COMMANDS:
        command_parser = sub.add_parser(command.name, help=command.help)
        for group in command.groups:
            add_config_args(command_parser, group.config, group.skip, group.defaults)
    for role_parser in sub.choices.values():
        for group in MAIN:
            add_config_args(role_parser, group.config, group.skip, inherited=True)
    return parser


def command_parser(parser: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser:
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices[name]


def setting_flag(parser: argparse.ArgumentParser, setting: str) -> str:
    """The flag of a declared setting (`executor_timeout_s` is --executor-timeout)."""
    for action in parser._actions:
        if action.dest == setting and action.option_strings:
            return action.option_strings[0]
    return "--" + setting.replace("_", "-")


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    role = args.command
    logging.basicConfig(level=args.log_level,
                        format=f"%(asctime)s folio-{role} %(levelname)s %(message)s")
    try:
        checked = CHECKS[role](args) if role in CHECKS else args
        return run_role(role, checked)
    except SettingError as error:   # raised before any process or socket starts
        print(f"folio {role}: error: {setting_flag(command_parser(parser, role), error.setting)}"
              f" {error.problem}", file=sys.stderr)
        return 2


def set_role_title(role: str) -> None:
    """Make `ps` show folio-<role>, however the process was started."""
    title = f"folio-{role}"
    try:
        import setproctitle

        setproctitle.setproctitle(" ".join([title, *sys.argv[1:]]))
    except ImportError:
        pass
    try:   # the short name (comm) too, for `ps -e`, `top` and `pgrep`
        import ctypes

        ctypes.CDLL(None).prctl(15, title.encode()[:15], 0, 0, 0)   # PR_SET_NAME
    except (OSError, AttributeError):
        pass


def run_role(role: str, checked: Any) -> int:
    """Run a command with its checked settings (folio/checks.py)."""
    if role == "serve" and isinstance(checked, ExecutorPlan):   # serve --headless
        set_role_title("executor")
        return _executor(checked)
    if role == "serve":
        from folio.serve import serve

        return serve(checked)
    if role == "keys":
        from folio.shared.security import generate_keys

        written = generate_keys(checked.curve_keys, checked.force, checked.client)
        for path in written:
            print(f"wrote {path}")
        print(f"keys in {checked.curve_keys}" + ("" if written else " (kept)"))
        return 0
    if role == "simulate":
        from folio.planner.simulator.command import run_simulate

        return run_simulate(checked)
    if role == "plan":
        from folio.planner.command import run_plan

        return run_plan(checked)
    if role == "probe":
        return _probe(checked)
    set_role_title(role)
    if role == "frontend":
        from folio.frontend.service import serve_frontend

        serve_frontend(checked)
        _exit_without_teardown(0)
    elif role == "scheduler":
        from folio.scheduler.service import SchedulerService

        SchedulerService(checked).run()
    elif role == "executor":
        return _executor(checked)
    return 0


def _exit_without_teardown(code: int) -> None:
    """Exit once a role has closed everything it owns, skipping the interpreter's teardown:
    the frontend's and executor's modules take up to a second to tear down (torch), which
    every `folio serve` shutdown and restart waited for."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _probe(plan: ProbePlan) -> int:
    from folio.probe import probe

    return probe(plan.probe.role, plan.probe.address, plan.probe.timeout, plan.curve_keys)


def _executor(plan: ExecutorPlan) -> int:
    from folio.executor.service import ExecutorService, ExecutorServiceConfig

    if plan.headless:   # this node's tensor-parallel ranks only
        from folio.executor.parallel.headless import run_headless

        return run_headless(plan.engine, plan.curve_keys)
    try:
        service = ExecutorService(ExecutorServiceConfig(plan.scheduler_address, plan.engine,
                                                        plan.curve_keys))
    except ValueError as error:   # e.g. --device cuda without one, tensors that misfit
        print(f"folio executor: error: {error}", file=sys.stderr)
        return 2   # `folio serve` does not restart it: it would fail the same way
    service.run()
    _exit_without_teardown(0)   # torch's teardown took 0.6 s of every stop and restart
    return 0


if __name__ == "__main__":
    sys.exit(main())
