"""The ``ddlsim`` command line.

Every subcommand takes ``--json`` for machine-readable output. Bad input (an unknown model, a
bad spec or strategy) ends with one ``ddlsim: error: ...`` line on stderr and exit status 2.
"""

import argparse
import sys
from collections.abc import Callable, Sequence

from ddlsim.data.errors import DdlsimError, one_line
from ddlsim.service import (
    cmd_graph,
    cmd_predict,
    cmd_profile,
    cmd_run,
    cmd_search,
    cmd_serve,
    cmd_simulator,
    cmd_specs,
    demo,
)

EXIT_BAD_INPUT = 2


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ddlsim",
        description="Predict and search distributed training strategies before spending GPU time.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    cmd_specs.register(sub)
    cmd_graph.register(sub)
    cmd_profile.register(sub)
    cmd_run.register(sub)
    cmd_predict.register(sub)
    cmd_simulator.register(sub)
    cmd_search.register(sub)
    cmd_serve.register(sub)
    demo.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    handler: Callable[[argparse.Namespace], int] = args.handler
    try:
        return handler(args)
    except (DdlsimError, OSError) as exc:
        print(f"ddlsim: error: {one_line(exc, limit=2000)}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        print("ddlsim: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
