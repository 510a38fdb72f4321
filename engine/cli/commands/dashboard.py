"""``dashboard``: serve the dashboard (Streamlit) on 127.0.0.1."""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys

from dataloader_tuner.cli.args import add_db

NAME = "dashboard"
HELP = "open the dashboard (Streamlit, on 127.0.0.1)"


def prepare_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--port", type=int, default=8501)
    add_db(parser)


def dashboard_command(port: int) -> list[str]:
    """``streamlit run`` on the dashboard's pages, kept off the network as .streamlit/ does
    for a checkout: the dashboard runs whatever module it is pointed at."""
    # Found, not imported: the engine never imports the dashboard (tests/test_layout.py).
    spec = importlib.util.find_spec("dataloader_tuner.dashboard.streamlit_app")
    assert spec is not None and spec.origin, "the dashboard is part of the package"
    return [sys.executable, "-m", "streamlit", "run", spec.origin, "--server.address",
            "127.0.0.1", "--server.port", str(port), "--server.headless", "true",
            "--server.fileWatcherType", "none", "--runner.postScriptGC", "false",
            "--browser.gatherUsageStats", "false", "--client.toolbarMode", "minimal"]


def run(args: argparse.Namespace) -> int:
    env = dict(os.environ)
    if args.db:
        env["DLTUNER_DB"] = args.db
    print(f"DataLoader Tuner on http://127.0.0.1:{args.port} (Ctrl-C stops it)", file=sys.stderr)
    sys.stdout.flush()
    sys.stderr.flush()
    # This process becomes the server: Ctrl-C and SIGTERM reach Streamlit itself, and no child
    # is left behind when a service manager stops the command.
    command = dashboard_command(args.port)
    os.execve(command[0], command, env)
    return 0  # not reached
