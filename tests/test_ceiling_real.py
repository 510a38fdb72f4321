"""The ceiling and a what-if against plain loops (issue: "the stated ceiling on a CPU-bound
fixture agrees within 15% with the best of a plain grid of worker counts"; "the predicted gain
of removing [a stage] agrees within 15% with a measurement of the same dataset with that stage
removed"). known_stages: 1 ms of CPU a sample in three named functions, decode_sample half
of it."""

from __future__ import annotations

import json

import pytest

from tests.real.plain_loop import plain_rate

from .conftest import dataset_path
from .test_cli import cli

pytestmark = pytest.mark.slow  # a tune (~12 s) and two plain grids (~30 s each)

AGREE = 0.15
GRID = (0, 1, 2, 3, 4)
SECONDS = 2.5


def grid_best(monkeypatch, skip: str = "") -> float:
    """The best samples/s of plain loops over GRID (persistent workers, as the pick)."""
    monkeypatch.setenv("KNOWN_STAGES_SKIP", skip)
    rates = [plain_rate(dataset_path("known_stages.py"), SECONDS, num_workers=n,
                        **({"persistent_workers": True} if n else {}))["samples_per_s"]
             for n in GRID]
    return max(rates)


def test_the_ceiling_and_a_stage_removed_agree_with_plain_grids(tmp_path, monkeypatch):
    monkeypatch.delenv("KNOWN_STAGES_SKIP", raising=False)
    done = cli("tune", dataset_path("known_stages.py"), "--json", db=str(tmp_path / "runs.db"))
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    ceiling = doc["ceiling"]
    assert ceiling["binding"] == "cpu", ceiling  # 2 CPUs spinning
    best = grid_best(monkeypatch)
    assert ceiling["samples_per_s"] == pytest.approx(best, rel=AGREE), (ceiling, best)

    gone = next(w for w in doc["what_if"] if w["change"] == "decode_sample gone")
    without = grid_best(monkeypatch, skip="decode_sample")
    measured_gain = without / best
    predicted = gone["predicted_samples_per_s"] / ceiling["samples_per_s"]
    assert predicted == pytest.approx(measured_gain, rel=AGREE), (
        gone, without, best, measured_gain)
    # and no fix for a stage the profile did not find: only the functions it saw
    named = {w["function"] for w in doc["what_if"] if w["function"]}
    assert named <= {"decode_sample", "augment", "read_bytes", "_spin"}, named
