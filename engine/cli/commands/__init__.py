"""One module per command, each a ``Command``: its name and help, the flags it takes
(``prepare_parser``) and what it does (``run``, returning the exit code)."""

from __future__ import annotations

import argparse
from typing import Protocol

from dataloader_tuner.cli.commands import dashboard, inspect, profile, runs, trace, tune


class Command(Protocol):
    NAME: str
    HELP: str

    def prepare_parser(self, parser: argparse.ArgumentParser) -> None: ...

    def run(self, args: argparse.Namespace) -> int: ...


COMMANDS: list[Command] = [profile, tune, inspect, runs, trace, dashboard]
