"""A real Streamlit server in a subprocess, for the browser tests and bench/dashboard_cpu.py."""

from __future__ import annotations

import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CHROMIUM_PATH = "/usr/bin/chromium"  # Debian's package; `playwright install` cannot download here
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class Server:
    process: subprocess.Popen
    url: str
    log_path: str
    token: str  # the dashboard opens only with it (dataloader_tuner.access)

    def page(self, path: str = "") -> str:
        """A page's address, with the token."""
        return f"{self.url}/{path}?token={self.token}"

    def log(self) -> str:
        with open(self.log_path, errors="replace") as f:
            return f.read()


def start_server(port: int, db_path: str, autostart: bool = False,
                 timeout_s: float = 60.0, log_path: str | None = None) -> Server:
    token = secrets.token_urlsafe(24)
    env = dict(os.environ, DLTUNER_DB=db_path, DLTUNER_AUTOSTART="1" if autostart else "0",
               DLTUNER_TOKEN=token)
    log_path = log_path or db_path + ".server.log"
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "streamlit", "run", "app.py", "--server.port", str(port),
             "--server.headless", "true", "--browser.gatherUsageStats", "false"],
            cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
        )
    server = Server(process, f"http://127.0.0.1:{port}", log_path, token)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"streamlit exited with {process.returncode}:\n{server.log()}")
        try:
            with urllib.request.urlopen(server.url + "/_stcore/health", timeout=1) as reply:
                if reply.status == 200:
                    return server
        except OSError:
            time.sleep(0.3)
    stop_server(server)
    raise RuntimeError(f"streamlit did not answer within {timeout_s} s:\n{server.log()}")


def stop_server(server: Server, timeout_s: float = 10.0) -> None:
    """SIGTERM lets the server stop its runs (atexit); the engine's children also watch for
    their parent's death. SIGKILL only if it does not leave in time."""
    if server.process.poll() is None:
        server.process.send_signal(signal.SIGTERM)
        try:
            server.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            server.process.kill()
            server.process.wait()
