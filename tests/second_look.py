"""One more profile where a sampled share disagrees with its reference: the agreement tests
compare two samplers (or a sampler and a clock) over ~1,000 looks, and on this 2-core host a
busy neighbour moves one run's shares by 5-9 points (CI, 2026-12-01: decode 0.554 against a
known 0.5; 0.625 against py-spy's 0.536 on the same loop, each passing when rerun). A sampler
that is wrong is wrong twice, so a test fails only where a fresh run disagrees as well, and the
first run's figures are printed (pytest -rP) for the note that asks why."""

from __future__ import annotations

from pathlib import Path
from typing import Callable, TypeVar

Run = TypeVar("Run")


def agreeing_on_a_second_look(tmp_path: Path, profile: Callable[[Path], Run],
                              check: Callable[[Run], None]) -> Run:
    """``check(profile(folder))``, each run in a folder of its own under ``tmp_path``; where
    the check fails, a second run is checked and its failure raised."""
    def run(attempt: int) -> Run:
        folder = tmp_path / f"try{attempt}"
        folder.mkdir()
        return profile(folder)

    first = run(0)
    try:
        check(first)
        return first
    except AssertionError as disagreement:
        print(f"first look disagreed, looking again: {disagreement}")
    second = run(1)
    check(second)
    return second
