"""``dashboard``: serve the dashboard (Streamlit), on 127.0.0.1 and with a secret token.

The dashboard runs whatever module it is pointed at, as you (access.py): it opens only with
the token printed in its address. ``--host`` serves beyond this machine (with a token only),
``--no-token`` opens it to anyone who reaches it.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
from dataclasses import dataclass

from dataloader_tuner.access import (LOOPBACK, NO_TOKEN_ENV, TOKEN_ENV, dashboard_url,
                                     new_token)
from dataloader_tuner.cli.args import EXIT_USAGE, add_db

NAME = "dashboard"
HELP = "open the dashboard (Streamlit, on 127.0.0.1, with a secret token)"


def prepare_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--port", type=int, default=8501)
    parser.add_argument("--host", default="127.0.0.1",
                        help="the address to serve on (default 127.0.0.1: this machine only); "
                             "another needs the token")
    parser.add_argument("--token", default=None,
                        help=f"the token to open it with (default: ${TOKEN_ENV}, else a new "
                             "one each start)")
    parser.add_argument("--no-token", action="store_true",
                        help="open to anyone who can reach it (a single-user machine only)")
    add_db(parser)


@dataclass(frozen=True)
class Launch:
    command: list[str]
    env: dict[str, str]
    said: list[str]  # what to print before serving (the address, warnings)


def dashboard_command(port: int, host: str = "127.0.0.1") -> list[str]:
    """``streamlit run`` on the dashboard's pages, as .streamlit/ does for a checkout (no
    token here: a command line is readable by every user of the machine, `ps`)."""
    # Found, not imported: the engine never imports the dashboard (tests/test_layout.py).
    spec = importlib.util.find_spec("dataloader_tuner.dashboard.streamlit_app")
    assert spec is not None and spec.origin, "the dashboard is part of the package"
    return [sys.executable, "-m", "streamlit", "run", spec.origin, "--server.address",
            host, "--server.port", str(port), "--server.headless", "true",
            "--server.fileWatcherType", "none", "--runner.postScriptGC", "false",
            "--browser.gatherUsageStats", "false", "--client.toolbarMode", "minimal"]


def plan(args: argparse.Namespace, environ: dict[str, str]) -> Launch | str:
    """What to start and say, or why not (a usage error)."""
    env = dict(environ)
    if args.db:
        env["DLTUNER_DB"] = args.db
    remote = args.host not in LOOPBACK
    said = []
    if args.no_token:
        if remote:
            return (f"--no-token with --host {args.host} would let anyone who can reach this "
                    "machine run code as you: serve on 127.0.0.1 (the default) or keep the token")
        env[NO_TOKEN_ENV] = "1"
        env.pop(TOKEN_ENV, None)
        token = None
        said.append("Warning: --no-token: anyone on this machine can open the dashboard and run "
                    "Python code as you, read your run history and ask your watched jobs to "
                    "tune. Use it only where you are the machine's only user.")
    else:
        token = args.token or env.get(TOKEN_ENV) or new_token()
        env[TOKEN_ENV] = token
        env.pop(NO_TOKEN_ENV, None)
    if remote:
        said.append(f"Warning: serving on {args.host}: anyone who can reach port {args.port} "
                    "and has the token can run Python code as you, read your run history and "
                    "ask your watched jobs to tune, over plain HTTP (the token travels "
                    "unencrypted). An SSH tunnel keeps it on 127.0.0.1: ssh -L "
                    f"{args.port}:127.0.0.1:{args.port} you@this-machine.")
    shown_host = "127.0.0.1" if args.host in ("0.0.0.0", "::", "") else args.host
    said.append(f"DataLoader Tuner on {dashboard_url(shown_host, args.port, token)} "
                "(Ctrl-C stops it)")
    return Launch(dashboard_command(args.port, args.host), env, said)


def run(args: argparse.Namespace) -> int:
    launch = plan(args, dict(os.environ))
    if isinstance(launch, str):
        print(f"dataloader-tuner dashboard: {launch}", file=sys.stderr)
        return EXIT_USAGE
    for line in launch.said:
        print(line, file=sys.stderr)
    sys.stdout.flush()
    sys.stderr.flush()
    # This process becomes the server: Ctrl-C and SIGTERM reach Streamlit itself, and no child
    # is left behind when a service manager stops the command.
    os.execve(launch.command[0], launch.command, launch.env)
    return 0  # not reached
