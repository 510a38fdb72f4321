"""``python -m dataloader_tuner``: profile a dataset's loader, tune it, list and export saved runs.

Exit codes: 0 ok, 1 the user's dataset, settings or run failed (with the error document),
2 bad usage (unknown flags, malformed values).
With ``--json``, stdout holds exactly one JSON document; progress goes to stderr.
"""

from __future__ import annotations

import argparse
import os
import sys

from dataloader_tuner.cli.commands import COMMANDS


def build_parser() -> argparse.ArgumentParser:
    program = (os.path.basename(sys.argv[0]) if sys.argv[0].endswith("dataloader-tuner")
               else "python -m dataloader_tuner")
    parser = argparse.ArgumentParser(prog=program, description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for command in COMMANDS:
        command.prepare_parser(sub.add_parser(command.NAME, help=command.HELP))
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    command = next(c for c in COMMANDS if c.NAME == args.command)
    try:
        return command.run(args)
    except KeyboardInterrupt:
        print("\ninterrupted: run stopped, workers reaped", file=sys.stderr)
        return 130
