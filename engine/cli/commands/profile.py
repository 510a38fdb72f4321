"""``profile``: run the loader in the background and measure it."""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace

from dataloader_tuner import protocol
from dataloader_tuner.analyse.shm import shm_check
from dataloader_tuner.analyse.text import profile_text
from dataloader_tuner.analyse.overdue import overdue_now
from dataloader_tuner.cli.args import (EXIT_OK, EXIT_RUN_FAILED, add_db, add_json,
                                       add_loader_target, add_run_limits, add_speedscope,
                                       error_doc, non_negative_float, non_negative_int,
                                       positive_int, print_json, settings_from_args,
                                       write_speedscope)
from dataloader_tuner.config import LoaderConfig
from dataloader_tuner.record.windows import BatchWindow
from dataloader_tuner.errors import ConfigError
from dataloader_tuner.run.runner import RunRequest, run_to_completion
from dataloader_tuner.store import RunStore

NAME = "profile"
HELP = "run the loader in the background and measure it"


def prepare_parser(parser: argparse.ArgumentParser) -> None:
    add_loader_target(parser)
    parser.add_argument("--num-workers", type=non_negative_int)
    parser.add_argument("--pin-memory", action=argparse.BooleanOptionalAction)
    parser.add_argument("--prefetch-factor", type=positive_int)
    parser.add_argument("--persistent-workers", action=argparse.BooleanOptionalAction)
    parser.add_argument("--settings", metavar="FILE",
                        help="a settings file written by `tune --out`: profile its settings "
                             "(flags given here go on top)")
    parser.add_argument("--multiprocessing-context", choices=("fork", "spawn", "forkserver"),
                        help="how workers start (default: the platform's, fork on Linux)")
    parser.add_argument("--seconds", type=non_negative_float, default=protocol.DEFAULT_SECONDS,
                        help="how long to measure (default %(default)g; worker memory growth is "
                             "judged only over 8 s or more after the workers' first 2 s)")
    add_run_limits(parser, "batch arrives", "inside its processes, as it does by default")
    add_speedscope(parser)
    add_json(parser)
    add_db(parser)


def run(args: argparse.Namespace) -> int:
    try:  # flags DataLoader would reject together: refused before anything starts (with the
        # module's own settings they are checked in the engine, which knows them)
        settings = settings_from_args(args)
        if "num_workers" in settings:
            LoaderConfig.from_settings(settings)
    except ConfigError as exc:
        if args.json:
            print_json(error_doc(exc.to_dict()))
        else:
            print(f"ERROR: {exc}")
        return EXIT_RUN_FAILED
    # The count a tune measured to pay, unless a flag replaced it: no warning second-guesses it.
    tuned = settings.get("num_workers") if args.settings and args.num_workers is None else None
    request = RunRequest(
        target=args.target, settings=settings, tuned_workers=tuned,
        step_ms=args.step_ms, seconds=args.seconds, timeout_s=args.timeout_s,
        sample_stacks=not args.no_stacks,
    )
    store = RunStore(args.db)
    progress = Progress(enabled=sys.stderr.isatty())
    handle = run_to_completion(request, store, on_event=progress.on_event)
    progress.done()
    result = replace(handle.live.profile_result(handle.state.value), run_id=handle.run_id)
    write_speedscope(args.speedscope, result.stacks_collapsed, f"profile of {args.target}")
    if args.json:
        print_json(result.to_dict())
    else:
        print(profile_text(result))
    details = result.error.details if result.error is not None else None
    if result.failed and not args.json and details:
        print("\ndetails:\n" + details.rstrip(), file=sys.stderr)
    return EXIT_RUN_FAILED if result.failed else EXIT_OK


class Progress:
    """One status line on stderr while a run streams (never on stdout)."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.batches = 0
        self.windows: list[BatchWindow] = []  # the last Windows event's (record/windows.py)
        self.last = 0.0

    def on_event(self, event: protocol.Event) -> None:
        if isinstance(event, protocol.Ready):  # as the workers start, so the user sees it first
            for warning in shm_check(event.config, event.dataset, event.system.shm,
                                     event.ranks_on_node):
                sys.stderr.write(f"warning [{warning.code}]: {warning.message}\n")
        if isinstance(event, protocol.Overdue):  # said as it happens: a run may hang there
            sys.stderr.write(("\n" if self.last else "") + f"{overdue_now(event)}\n")
        if not self.enabled:
            return
        if isinstance(event, protocol.Batches):  # (the rows kept inside windows: not again)
            self.batches += sum(1 for row in event.rows
                                if not any(w.first_seq <= row[0] <= w.last_seq
                                           for w in self.windows))
        elif isinstance(event, protocol.Windows):  # just before their rows (run/runner.py)
            self.windows = event.folded()
            self.batches += sum(w.batches for w in self.windows)
        now = time.monotonic()
        if now - self.last > 0.5:
            self.last = now
            sys.stderr.write(f"\r  measuring... {self.batches} batches")
            sys.stderr.flush()

    def done(self) -> None:
        if self.enabled and self.last:
            sys.stderr.write("\r" + " " * 40 + "\r")
            sys.stderr.flush()
