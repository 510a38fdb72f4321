"""``python -m engine``: profile a dataset's loader, tune it, list and export saved runs.

Exit codes: 0 ok, 1 the user's dataset, settings or run failed (with the error document),
2 bad usage (unknown flags, malformed values).
With ``--json``, stdout holds exactly one JSON document; progress goes to stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import replace

from engine import protocol
from engine.config import LoaderConfig
from engine.settings import load_settings
from engine.errors import ConfigError
from engine.analyse.report import render_text
from engine.run.runner import RunRequest, inspect_target, run_to_completion
from engine.run.store import RunStore, default_db_path

EXIT_OK, EXIT_RUN_FAILED, EXIT_USAGE = 0, 1, 2


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def batch_size_arg(text: str) -> int | None:
    """A positive int, or ``none``: the dataset yields whole batches (``batch_size=None``)."""
    if text.strip().lower() == "none":
        return None
    return _positive_int(text)


def _non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def _non_negative_float(text: str) -> float:
    value = float(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def _add_common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print one JSON document on stdout")
    parser.add_argument("--db", help=f"run history database (default {default_db_path()}, "
                                     "or $DLTUNER_DB)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=os.path.basename(sys.argv[0]) if sys.argv[0].endswith(
        "dataloader-tuner") else "python -m engine", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)

    profile = sub.add_parser("profile", help="run the loader in the background and measure it")
    profile.add_argument("target", help="path/to/data.py[:attr] or pkg.module[:attr]")
    profile.add_argument("--batch-size", type=batch_size_arg, default=argparse.SUPPRESS,
                         help="N, or none when the dataset yields whole batches; default: the "
                              "module's batch_size, else 32")
    profile.add_argument("--num-workers", type=_non_negative_int)
    profile.add_argument("--pin-memory", action=argparse.BooleanOptionalAction)
    profile.add_argument("--prefetch-factor", type=_positive_int)
    profile.add_argument("--persistent-workers", action=argparse.BooleanOptionalAction)
    profile.add_argument("--settings", metavar="FILE",
                         help="a settings file written by `tune --out`: profile its settings "
                              "(flags given here go on top)")
    profile.add_argument("--multiprocessing-context", choices=("fork", "spawn", "forkserver"),
                         help="how workers start (default: the platform's, fork on Linux)")
    profile.add_argument("--step-ms", type=_non_negative_float,
                         help="simulate a training step of this many ms per batch (0: none); "
                              "default: the module's train_step if it has one")
    profile.add_argument("--seconds", type=float, default=15.0,
                         help="how long to measure (default 15; worker memory growth is judged "
                              "only over 8 s or more after the workers' first 2 s)")
    profile.add_argument("--timeout-s", type=float, default=protocol.DEFAULT_TIMEOUT_S,
                         help="fail if no batch arrives for this long")
    _add_common(profile)

    inspect = sub.add_parser("inspect", help="check a target: what dataset it finds, a sample")
    inspect.add_argument("target", help="path/to/data.py[:attr] or pkg.module[:attr]")
    inspect.add_argument("--json", action="store_true", help="print one JSON document on stdout")

    trace = sub.add_parser("trace", help="export a saved run as Chrome/Perfetto trace JSON")
    trace.add_argument("run_id", type=int)
    trace.add_argument("--out", help="file to write (default: stdout)")
    trace.add_argument("--db", help=f"run history database (default {default_db_path()}, "
                                    "or $DLTUNER_DB)")

    dashboard = sub.add_parser("dashboard", help="open the dashboard (Streamlit, on 127.0.0.1)")
    dashboard.add_argument("--port", type=int, default=8501)
    dashboard.add_argument("--db", help=f"run history database (default {default_db_path()}, "
                                        "or $DLTUNER_DB)")

    runs = sub.add_parser("runs", help="list saved runs")
    runs.add_argument("--limit", type=int, default=50)
    _add_common(runs)

    from engine.cli.tune import add_tune_parser  # the tuner's flags live with the tuner

    add_tune_parser(sub, _add_common, _positive_int, _non_negative_float, batch_size_arg)
    return parser


def print_json(doc: dict) -> None:
    """One JSON document on one line of stdout: what every ``--json`` prints."""
    sys.stdout.write(json.dumps(doc, default=str) + "\n")


def _error_doc(error: dict) -> dict:
    return {"status": "error", "error": error, "warnings": []}


SETTING_FLAGS = ("num_workers", "pin_memory", "prefetch_factor", "persistent_workers",
                 "multiprocessing_context")


def settings_from_args(args: argparse.Namespace) -> dict:
    """The settings given on the command line (a settings file, then flags); the module's own
    fill in the rest."""
    chosen = load_settings(args.settings) if getattr(args, "settings", None) else {}
    chosen.update({key: getattr(args, key) for key in SETTING_FLAGS
                   if getattr(args, key, None) is not None})
    if hasattr(args, "batch_size"):  # absent unless given (argparse.SUPPRESS); None is a value
        chosen["batch_size"] = args.batch_size
    return chosen


def cmd_profile(args: argparse.Namespace) -> int:
    try:  # flags DataLoader would reject together: refused before anything starts (with the
        # module's own settings they are checked in the engine, which knows them)
        settings = settings_from_args(args)
        if "num_workers" in settings:
            LoaderConfig.from_settings(settings)
    except ConfigError as exc:
        if args.json:
            print_json(_error_doc(exc.to_dict()))
        else:
            print(f"ERROR: {exc}")
        return EXIT_RUN_FAILED
    # The count a tune measured to pay, unless a flag replaced it: no warning second-guesses it.
    tuned = settings.get("num_workers") if args.settings and args.num_workers is None else None
    request = RunRequest(
        target=args.target, settings=settings, tuned_workers=tuned,
        step_ms=args.step_ms, seconds=args.seconds, timeout_s=args.timeout_s,
    )
    store = RunStore(args.db)
    progress = _Progress(enabled=sys.stderr.isatty())
    handle = run_to_completion(request, store, on_event=progress.on_event)
    progress.done()
    result = replace(handle.live.summary(handle.state.value), run_id=handle.run_id)
    if args.json:
        print_json(result.to_dict())
    else:
        print(render_text(result))
    if result.failed and not args.json and result.error.get("details"):
        print("\ndetails:\n" + result.error["details"].rstrip(), file=sys.stderr)
    return EXIT_RUN_FAILED if result.failed else EXIT_OK


def cmd_runs(args: argparse.Namespace) -> int:
    store = RunStore(args.db)
    store.mark_lost_runs()  # a watched job killed outright never said it ended
    runs = store.list_runs(args.limit)
    if args.json:
        print_json({"status": "ok", "db": store.path, "runs": [run.to_dict() for run in runs]})
        return EXIT_OK
    if not runs:
        print(f"no runs saved yet in {store.path}")
    for run in runs:
        rate = run.samples_per_s
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(run.started_at))
        rate_text = f"{rate:10.1f} samples/s" if rate else " " * 20
        print(f"{run.id:5d}  {when}  {run.kind:8s} {run.status:8s} {rate_text}  {run.target}")
    return EXIT_OK


def cmd_inspect(args: argparse.Namespace) -> int:
    doc = inspect_target(args.target)
    if args.json:
        print_json(doc)
    elif doc["status"] == "error":
        print(f"ERROR: {doc['error']['message']}")
    else:
        for key, value in doc["dataset"].items():
            print(f"{key}: {value}")
    return EXIT_RUN_FAILED if doc["status"] == "error" else EXIT_OK


def cmd_trace(args: argparse.Namespace) -> int:
    from engine.analyse.trace import chrome_trace

    store = RunStore(args.db)
    run = store.get_run(args.run_id)
    if run is None:
        print(f"error: no run {args.run_id} in {store.path}; list them with "
              "`python -m engine runs`", file=sys.stderr)
        return EXIT_USAGE
    doc = chrome_trace(store.batches(args.run_id), store.resources(args.run_id),
                       label=f"run {args.run_id}: {run.target}")
    text = json.dumps(doc)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
        print(f"wrote {len(doc['traceEvents'])} trace events to {args.out}; open it in "
              "https://ui.perfetto.dev", file=sys.stderr)
    else:
        sys.stdout.write(text + "\n")
    return EXIT_OK


def dashboard_command(port: int) -> list[str]:
    """``streamlit run`` on the dashboard's pages, kept off the network as .streamlit/ does
    for a checkout: the dashboard runs whatever module it is pointed at."""
    import dashboard.streamlit_app as app

    return [sys.executable, "-m", "streamlit", "run", app.__file__, "--server.address",
            "127.0.0.1", "--server.port", str(port), "--server.headless", "true",
            "--server.fileWatcherType", "none", "--runner.postScriptGC", "false",
            "--browser.gatherUsageStats", "false", "--client.toolbarMode", "minimal"]


def cmd_dashboard(args: argparse.Namespace) -> int:
    env = dict(os.environ)
    if args.db:
        env["DLTUNER_DB"] = args.db
    print(f"DataLoader Tuner on http://127.0.0.1:{args.port} (Ctrl-C stops it)", file=sys.stderr)
    try:
        return subprocess.call(dashboard_command(args.port), env=env)
    except KeyboardInterrupt:
        return 130


class _Progress:
    """One status line on stderr while a run streams (never on stdout)."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.batches = 0
        self.last = 0.0

    def on_event(self, event: protocol.Event) -> None:
        if not self.enabled:
            return
        if isinstance(event, protocol.Batches):
            self.batches += len(event.rows)
        now = time.monotonic()
        if now - self.last > 0.5:
            self.last = now
            sys.stderr.write(f"\r  measuring... {self.batches} batches")
            sys.stderr.flush()

    def done(self) -> None:
        if self.enabled and self.last:
            sys.stderr.write("\r" + " " * 40 + "\r")
            sys.stderr.flush()


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        if args.command == "profile":
            return cmd_profile(args)
        if args.command == "runs":
            return cmd_runs(args)
        if args.command == "inspect":
            return cmd_inspect(args)
        if args.command == "trace":
            return cmd_trace(args)
        if args.command == "dashboard":
            return cmd_dashboard(args)
        from engine.cli.tune import cmd_tune

        return cmd_tune(args)
    except KeyboardInterrupt:
        print("\ninterrupted: run stopped, workers reaped", file=sys.stderr)
        return 130
