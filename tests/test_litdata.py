"""litdata's StreamingDataLoader over chunks optimised here (what Lightning's streaming users
run): watched inside its workers, the probes set on its instance (NOTE [ Probing a loader that
makes its own iterators ]), and a checkpoint taken while watched resumes with exactly the
batches left, watched or not."""

import json
import os
import subprocess
import sys

import psutil
import pytest

from dataloader_tuner import RunStore

from .conftest import ROOT
from .jobs import reap_orphans

pytest.importorskip("litdata")  # scripts/test.sh installs it (without its torchvision)

ITEMS = 64
# argv: DB CHUNKS STATE take|resume watched|plain; 24 items taken, then a checkpoint
JOB = """
import json, sys, torch
from litdata import StreamingDataLoader, StreamingDataset
from dataloader_tuner import watch

db, chunks, state, mode, how = sys.argv[1:6]
loader = StreamingDataLoader(StreamingDataset(chunks), batch_size=4, num_workers=2)
if mode == "resume":
    loader.load_state_dict(torch.load(state, weights_only=False))
watched = watch(loader, name=mode, db=db) if how == "watched" else loader
seen = []
for batch in watched:
    seen.extend(int(i) for i in batch["index"])
    if mode == "take" and len(seen) == 24:
        torch.save(watched.state_dict(), state)
        break
assert loader.collate_fn.__class__.__name__ == "StreamingDataLoaderCollateFn"  # its own again
if watched is not loader:
    watched.close()
print(json.dumps(seen))
"""


def _run(*args: str, code: str | None = None) -> str:
    """The job's output, once what it left to end on its own has (litdata's processes outlive
    it by a moment and, orphaned, are handed to this process, the suite's subreaper)."""
    before = {p.pid for p in psutil.Process().children()}
    command = [sys.executable, *(["-c", code] if code else []), *args]
    done = subprocess.run(command, cwd=ROOT, env=dict(os.environ, PYTHONPATH=ROOT),
                          capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    reap_orphans(before, timeout=60)
    return done.stdout


@pytest.mark.slow  # litdata's optimize, then five jobs with torch and 2 workers each
def test_a_litdata_loader_is_watched_inside_its_workers_and_resumes_exactly(db_path, tmp_path):
    chunks = str(tmp_path / "chunks")
    _run("-m", "tests.datasets.litdata_items", chunks, str(ITEMS))

    def job(mode: str, how: str, state: str) -> list[int]:
        out = _run(db_path, chunks, state, mode, how, code=JOB)
        return json.loads(out.strip().splitlines()[-1])

    plain_state, watched_state = str(tmp_path / "plain.pt"), str(tmp_path / "watched.pt")
    plain = [job("take", "plain", plain_state), job("resume", "plain", plain_state)]
    assert len(plain[0]) == 24 and sorted(plain[0] + plain[1]) == list(range(ITEMS))
    assert job("take", "watched", watched_state) == plain[0]
    assert job("resume", "watched", watched_state) == plain[1]
    assert job("resume", "plain", watched_state) == plain[1]
    runs = {run.label: run for run in RunStore(db_path).list_runs()}
    assert runs["take"].result.batches == 6 and runs["resume"].result.batches == 10
    for run in runs.values():
        assert run.status == "ok"
        assert {w["id"] for w in run.result.workers} == {0, 1}, run.result.workers
        assert run.result.per_batch["fetch_ms"] is not None
        assert "leading dimension" not in run.result.counting["samples"]
