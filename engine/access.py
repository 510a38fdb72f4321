"""The dashboard's door: the secret token it opens with, and the files the tool writes kept to
their owner.

The dashboard runs the Python module it is pointed at, as the person who started it; on a
shared machine everyone can reach 127.0.0.1. ``dataloader-tuner dashboard`` makes a token (or
takes ``--token`` / DLTUNER_TOKEN), hands it to the server in its environment (never on a
command line, which every user can read with ``ps``) and prints the address with it; the
dashboard (dashboard/token_gate.py) lets in only a session that shows it. The run history, settings
files and traces hold what the user's jobs do: created readable by their owner only.
"""

from __future__ import annotations

import hmac
import os
import secrets
from typing import IO

TOKEN_ENV = "DLTUNER_TOKEN"  # the token the dashboard opens with
NO_TOKEN_ENV = "DLTUNER_NO_TOKEN"  # "1": it opens to anyone who reaches it (--no-token)
TOKEN_QUERY = "token"  # its name in the dashboard's address
LOOPBACK = ("127.0.0.1", "localhost", "::1")

PRIVATE_FILE = 0o600
PRIVATE_FOLDER = 0o700


def new_token() -> str:
    return secrets.token_urlsafe(24)


def tokens_match(offered: str, expected: str) -> bool:
    """Compared in constant time: how long a wrong guess takes tells nothing about the token."""
    return hmac.compare_digest(offered.encode(), expected.encode())


def dashboard_url(host: str, port: int | str, token: str | None) -> str:
    """The address to open (``token`` None: the dashboard takes none)."""
    return f"http://{host}:{port}/" + (f"?{TOKEN_QUERY}={token}" if token else "")


def private_folder(path: str) -> None:
    """``path`` made if missing, readable by its owner only (the folders above it as usual; a
    folder that exists is left as its owner set it)."""
    os.makedirs(path, mode=PRIVATE_FOLDER, exist_ok=True)


def private_file(path: str) -> None:
    """An empty file at ``path`` readable by its owner only, if there is none yet (SQLite gives
    a database's -wal and -shm files the database's own mode)."""
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, PRIVATE_FILE))
    except FileExistsError:
        pass


def open_private(path: str) -> IO[str]:
    """``open(path, "w")``, a new file created readable by its owner only (one that exists keeps
    its mode: its owner may have shared it on purpose)."""
    return os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, PRIVATE_FILE), "w",
                     encoding="utf-8")
