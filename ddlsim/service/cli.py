"""The ``ddlsim`` command line.

Every subcommand takes ``--json`` for machine-readable output. Bad input (an unknown model, a
bad spec or strategy) ends with one ``ddlsim: error: ...`` line on stderr and exit status 2.
"""

import argparse
import importlib
import sys
from collections.abc import Callable, Sequence
from typing import NoReturn

from ddlsim.data.errors import DdlsimError, one_line
from ddlsim.data.shutdown import freeze_for_exit

EXIT_BAD_INPUT = 2
# The module of ``ddlsim.service`` that registers each command, in the order help lists them.
# A command imports its own module only: ``ddlsim run`` (every rank under torchrun is one)
# starts without the simulator's GNN, the REST API or Optuna.
COMMANDS: dict[str, str] = {
    "models": "cmd_specs",
    "spec": "cmd_specs",
    "graph": "cmd_graph",
    "profile": "cmd_profile",
    "run": "cmd_run",
    "predict": "cmd_predict",
    "simulator": "cmd_simulator",
    "search": "cmd_search",
    "serve": "cmd_serve",
    "worker": "cmd_serve",
    "demo": "demo",
}


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser of every command, or of ``command``'s module only when it is one."""
    parser = argparse.ArgumentParser(
        prog="ddlsim",
        description="Predict and search distributed training strategies before spending GPU time.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    chosen = [COMMANDS[command]] if command in COMMANDS else list(dict.fromkeys(COMMANDS.values()))
    for name in chosen:
        importlib.import_module(f"ddlsim.service.{name}").register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    given = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(given[0] if given else None)
    args = parser.parse_args(given)
    handler: Callable[[argparse.Namespace], int] = args.handler
    try:
        return handler(args)
    except (DdlsimError, OSError) as exc:
        print(f"ddlsim: error: {one_line(exc, limit=2000)}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        print("ddlsim: interrupted", file=sys.stderr)
        return 130


def run_command_line() -> NoReturn:
    """The console script and ``python -m ddlsim``: :func:`main` on ``sys.argv``, then exit
    without the interpreter's last collection (:mod:`ddlsim.data.shutdown`)."""
    code = main()
    freeze_for_exit()
    sys.exit(code)


if __name__ == "__main__":
    run_command_line()
