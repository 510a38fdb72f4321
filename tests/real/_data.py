"""Deterministic fixture data, generated once into a cache folder and published atomically.

``fixture_dir(name, build)`` returns ``<DLTUNER_FIXTURE_DIR or $TMP/dltuner-fixtures>/<name>``.
On first use ``build(tmp)`` fills a private temporary folder next to it, which is then renamed
into place in one step: a concurrent process (a second test, a DataLoader worker) sees either
no folder or a complete one, never half-written files. If two processes build at once, the
first rename wins and the loser throws its copy away. Put a version in ``name`` and bump it
when the generator changes, so a stale cache is never read.

Generation belongs in ``make_dataset()`` (the parent process), never in ``__getitem__``.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from typing import Callable


def fixture_root() -> str:
    return os.environ.get("DLTUNER_FIXTURE_DIR",
                          os.path.join(tempfile.gettempdir(), "dltuner-fixtures"))


def fixture_dir(name: str, build: Callable[[str], None] | None = None) -> str:
    """The folder for fixture ``name``, built by ``build(folder)`` on first use."""
    final = os.path.join(fixture_root(), name)
    if os.path.isdir(final):
        return final
    os.makedirs(fixture_root(), exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=f".{name}.tmp-", dir=fixture_root())
    try:
        if build is not None:
            build(tmp)
        try:
            os.rename(tmp, final)  # atomic; fails if another process published first
        except OSError:
            if not os.path.isdir(final):
                raise
    finally:
        if os.path.isdir(tmp):
            shutil.rmtree(tmp, ignore_errors=True)
    return final
