"""``inspect``: check a target: what dataset it finds, and a sample."""

from __future__ import annotations

import argparse

from dataloader_tuner.cli.args import (EXIT_OK, EXIT_RUN_FAILED, TARGET_HELP, add_json,
                                       print_json)
from dataloader_tuner.run.inspection import inspect_target

NAME = "inspect"
HELP = "check a target: what dataset it finds, a sample"


def prepare_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("target", help=TARGET_HELP)
    add_json(parser)


def run(args: argparse.Namespace) -> int:
    inspection = inspect_target(args.target)
    doc = inspection.to_dict()
    if args.json:
        print_json(doc)
    elif not inspection.ok:
        print(f"ERROR: {doc['error']['message']}")
    else:
        for key, value in doc["dataset"].items():
            print(f"{key}: {value}")
    return EXIT_OK if inspection.ok else EXIT_RUN_FAILED
