"""``runs``: list the saved runs; delete some, or prune the history to its limits
(NOTE [ Keeping the history within its limits ], store/retention.py)."""

from __future__ import annotations

import argparse
import time

from dataloader_tuner.cli.args import EXIT_OK, EXIT_USAGE, add_db, add_json, print_json
from dataloader_tuner.store import retention
from dataloader_tuner.run.settle import settle_dead_runs
from dataloader_tuner.store import RunStore

NAME = "runs"
HELP = "list saved runs; delete some, or prune the history to its limits"


def prepare_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--limit", type=int, default=50)
    parser.add_argument("--delete", type=int, nargs="+", metavar="ID",
                        help="delete these runs with their rows and events (not a running one)")
    parser.add_argument("--prune", action="store_true",
                        help="delete the finished runs past the age limit, then the oldest "
                             "until the history fits its size, and give the space back")
    parser.add_argument("--max-gb", type=float, default=None,
                        help=f"the history's size limit for --prune (${retention.MAX_GB_ENV}, "
                             "else the History page's, else "
                             f"{retention.DEFAULT_MAX_GB:g}; 0: none)")
    parser.add_argument("--max-days", type=float, default=None,
                        help=f"the age limit for --prune, from a run's end "
                             f"(${retention.MAX_DAYS_ENV}, else the History page's, else "
                             f"{retention.DEFAULT_MAX_DAYS:g}; 0: none)")
    add_json(parser)
    add_db(parser)


def run(args: argparse.Namespace) -> int:
    store = RunStore(args.db)
    settle_dead_runs(store)  # a watched job killed outright never said it ended
    if args.delete or args.prune:
        return _remove(store.path, args)
    saved = store.list_runs(args.limit)
    if args.json:
        print_json({"status": "ok", "db": store.path, "runs": [r.to_dict() for r in saved]})
        return EXIT_OK
    if not saved:
        print(f"no runs saved yet in {store.path}")
    for saved_run in saved:
        rate = saved_run.samples_per_s
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(saved_run.started_at))
        rate_text = f"{rate:10.1f} samples/s" if rate else " " * 20
        print(f"{saved_run.id:5d}  {when}  {saved_run.kind:8s} {saved_run.status:8s} "
              f"{rate_text}  {saved_run.target}")
    return EXIT_OK


def _remove(path: str, args: argparse.Namespace) -> int:
    """--delete or --prune: what went and the history's size after, or why nothing did."""
    try:
        limits = retention.Limits.for_history(path, args.max_gb, args.max_days)
        done = (retention.delete_runs(path, args.delete) if args.delete
                else retention.prune(path, limits))
    except (KeyError, ValueError) as exc:  # (RunningRun is a ValueError)
        message = exc.args[0] if exc.args else str(exc)
        if args.json:
            print_json({"status": "error", "error": message})
        else:
            print(f"dataloader-tuner runs: {message}")
        return EXIT_USAGE
    if args.json:
        print_json({"status": "ok", "db": path, "deleted": list(done.deleted),
                    "bytes_before": done.bytes_before, "bytes_after": done.bytes_after,
                    "file_bytes": done.file_bytes_after, "given_back": done.given_back,
                    "limits": limits.text()})
        return EXIT_OK
    which = ", ".join(map(str, done.deleted)) if done.deleted else "none"
    print(f"deleted {len(done.deleted)} run(s) ({which}): the history used "
          f"{_mb(done.bytes_before)} and uses {_mb(done.bytes_after)}; the file is "
          f"{_mb(done.file_bytes_after)}" + ("" if done.given_back else
                                             " (busy: the space is reused, not returned yet)"))
    if args.prune:
        print(f"limits: {limits.text()}")
    return EXIT_OK


def _mb(size: int) -> str:
    return f"{size / 2 ** 20:,.1f} MB"
