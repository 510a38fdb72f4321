"""``runs``: list the saved runs."""

from __future__ import annotations

import argparse
import time

from dataloader_tuner.cli.args import EXIT_OK, add_db, add_json, print_json
from dataloader_tuner.run.settle import settle_dead_runs
from dataloader_tuner.store import RunStore

NAME = "runs"
HELP = "list saved runs"


def prepare_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--limit", type=int, default=50)
    add_json(parser)
    add_db(parser)


def run(args: argparse.Namespace) -> int:
    store = RunStore(args.db)
    settle_dead_runs(store)  # a watched job killed outright never said it ended
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
