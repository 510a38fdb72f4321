"""What the commands share: argument types, the common flags, exit codes, JSON output."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Callable

from dataloader_tuner import protocol

from dataloader_tuner.settings import read_settings
from dataloader_tuner.store import default_db_path

EXIT_OK, EXIT_RUN_FAILED, EXIT_USAGE = 0, 1, 2
TARGET_HELP = "path/to/data.py[:attr] or pkg.module[:attr]"
SETTING_FLAGS = ("num_workers", "pin_memory", "prefetch_factor", "persistent_workers",
                 "multiprocessing_context")


def _number(name: str, kind: type, least: float, strict: bool) -> Callable[[str], Any]:
    """An argument type: a ``kind`` of at least ``least`` (above it where ``strict``), named for
    argparse's message on text that is no number ("invalid positive_int value: 'x'")."""
    def check(text: str) -> Any:
        value = kind(text)
        if value < least or (strict and not value > least):
            raise argparse.ArgumentTypeError(
                f"must be {'>' if strict else '>='} {least:g}, got {value}")
        return value
    check.__name__ = name
    return check


positive_int = _number("positive_int", int, 1, strict=False)
non_negative_int = _number("non_negative_int", int, 0, strict=False)
positive_float = _number("positive_float", float, 0, strict=True)
non_negative_float = _number("non_negative_float", float, 0, strict=False)


def batch_size_arg(text: str) -> int | None:
    """A positive int, or ``none``: the dataset yields whole batches (``batch_size=None``)."""
    if text.strip().lower() == "none":
        return None
    return positive_int(text)


def add_db(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--db", help=f"run history database (default {default_db_path()}, "
                                     "or $DLTUNER_DB)")


def add_json(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print one JSON document on stdout")


def add_loader_target(parser: argparse.ArgumentParser) -> None:
    """The target, its batch size and a simulated step: what profile and tune both take."""
    parser.add_argument("target", help=TARGET_HELP)
    parser.add_argument("--batch-size", type=batch_size_arg, default=argparse.SUPPRESS,
                        help="N, or none when the dataset yields whole batches; default: the "
                             "module's batch_size, else 32")
    parser.add_argument("--step-ms", type=non_negative_float,
                        help="simulate a training step of this many ms per batch (0: none); "
                             "default: the module's train_step if it has one")


def add_run_limits(parser: argparse.ArgumentParser, waiting_for: str, sampled: str) -> None:
    """What profile and tune both take: how long to wait for ``waiting_for`` before failing,
    and whether to sample stacks (``sampled``: where)."""
    parser.add_argument("--timeout-s", type=positive_float, default=protocol.DEFAULT_TIMEOUT_S,
                        help=f"fail if no {waiting_for} for this long")
    parser.add_argument("--no-stacks", action="store_true",
                        help=f"do not sample where the loader's time goes {sampled} "
                             "(docs/profile.md)")


def add_speedscope(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--speedscope", metavar="FILE",
                        help="also write the sampled stacks to FILE, for "
                             "https://www.speedscope.app (docs/profile.md)")


def write_speedscope(path: str | None, collapsed: dict | None, name: str) -> None:
    """The run's sampled stacks to ``path`` as a speedscope file, said on stderr (stdout may
    be --json); where there are none to show, why."""
    if not path:
        return
    if not collapsed:
        sys.stderr.write(f"--speedscope: {path} not written: no sampled stacks to show (too few "
                         "looks, --no-stacks, or the run failed first)\n")
        return
    from dataloader_tuner.analyse.speedscope import speedscope_document

    with open(path, "w") as f:
        json.dump(speedscope_document(collapsed, name), f)
    sys.stderr.write(f"the sampled stacks: {path} (open it at https://www.speedscope.app)\n")


def print_json(doc: dict) -> None:
    """One JSON document on one line of stdout: what every ``--json`` prints."""
    sys.stdout.write(json.dumps(doc, default=str) + "\n")


def error_doc(error: dict) -> dict:
    return {"status": "error", "error": error, "warnings": []}


def settings_from_args(args: argparse.Namespace) -> dict:
    """The settings given on the command line (a settings file, then flags); the module's own
    fill in the rest."""
    chosen = read_settings(args.settings) if getattr(args, "settings", None) else {}
    chosen.update({key: getattr(args, key) for key in SETTING_FLAGS
                   if getattr(args, key, None) is not None})
    if hasattr(args, "batch_size"):  # absent unless given (argparse.SUPPRESS); None is a value
        chosen["batch_size"] = args.batch_size
    return chosen
