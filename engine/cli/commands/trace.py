"""``trace``: export a saved run as Chrome/Perfetto trace JSON."""

from __future__ import annotations

import argparse
import json
import sys

from dataloader_tuner.access import open_private
from dataloader_tuner.analyse.chrome_trace import chrome_trace
from dataloader_tuner.cli.args import EXIT_OK, EXIT_USAGE, add_db
from dataloader_tuner.store import RunStore

NAME = "trace"
HELP = "export a saved run as Chrome/Perfetto trace JSON"


def prepare_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_id", type=int)
    parser.add_argument("--out", help="file to write (default: stdout)")
    add_db(parser)


def run(args: argparse.Namespace) -> int:
    store = RunStore(args.db)
    saved = store.get_run(args.run_id)
    if saved is None:
        print(f"error: no run {args.run_id} in {store.path}; list them with "
              "`python -m dataloader_tuner runs`", file=sys.stderr)
        return EXIT_USAGE
    doc = chrome_trace(store.batches(args.run_id), store.resources(args.run_id),
                       label=f"run {args.run_id}: {saved.target}",
                       windows=store.windows(args.run_id))
    text = json.dumps(doc)
    if args.out:
        with open_private(args.out) as f:
            f.write(text)
        print(f"wrote {len(doc['traceEvents'])} trace events to {args.out}; open it in "
              "https://ui.perfetto.dev", file=sys.stderr)
    else:
        sys.stdout.write(text + "\n")
    return EXIT_OK
