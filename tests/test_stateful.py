"""torchdata's StatefulDataLoader (torchtitan's; accelerate's stateful loaders), watched: a
checkpoint taken mid-epoch while watched resumes in a fresh process with exactly the batches
left, and tuning in place, which its state forbids, says so naming it."""

import json
import os
import subprocess
import sys

import pytest
import torch

from dataloader_tuner import RunStore

from .conftest import ROOT

pytest.importorskip("torchdata.stateful_dataloader")  # requirements-test.txt installs it

# One epoch of 100 shuffled items in batches of 1 over 2 workers: 37 batches, a checkpoint,
# and (in a fresh process) the rest. argv: DB STATE_PATH take|resume [--tune]
RESUMABLE = """
import json, sys, torch
from torchdata.stateful_dataloader import StatefulDataLoader
from dataloader_tuner import watch

db, state, mode = sys.argv[1], sys.argv[2], sys.argv[3]
loader = StatefulDataLoader(list(range(100)), batch_size=1, shuffle=True, num_workers=2,
                            generator=torch.Generator().manual_seed(7))
if mode == "resume":
    loader.load_state_dict(torch.load(state, weights_only=False))
watched = watch(loader, name="train", db=db, tune="--tune" in sys.argv)
seen = []
for batch in watched:
    seen.append(int(batch[0]))
    if mode == "take" and len(seen) == 37:
        torch.save(watched.state_dict(), state)
        break
watched.close()
print(json.dumps(seen))
"""


def _job(db_path: str, state: str, mode: str, *more: str) -> tuple[list[int], str]:
    done = subprocess.run([sys.executable, "-c", RESUMABLE, db_path, state, mode, *more],
                          cwd=ROOT, env=dict(os.environ, PYTHONPATH=ROOT),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1]), done.stderr


@pytest.mark.slow  # two processes, each with torch and 2 workers
def test_a_checkpoint_taken_while_watched_resumes_with_exactly_the_batches_left(db_path,
                                                                                tmp_path):
    state = str(tmp_path / "loader.pt")
    first, _ = _job(db_path, state, "take")
    rest, _ = _job(db_path, state, "resume")
    assert len(first) == 37 and len(rest) == 63
    assert sorted(first + rest) == list(range(100))  # none repeated, none lost
    from torchdata.stateful_dataloader import StatefulDataLoader

    unwatched = StatefulDataLoader(list(range(100)), batch_size=1, shuffle=True, num_workers=2,
                                   generator=torch.Generator().manual_seed(7))
    # (its order depends on num_workers: the same loader, unwatched, in one go)
    assert first + rest == [int(b[0]) for b in unwatched]
    runs = RunStore(db_path).list_runs()
    assert sorted(run.result.batches for run in runs) == [37, 63]


@pytest.mark.slow
def test_tuning_a_stateful_loader_in_place_is_off_and_says_what_would_break(db_path,
                                                                            tmp_path):
    seen, said = _job(db_path, str(tmp_path / "loader.pt"), "take", "--tune")
    assert len(seen) == 37
    assert ("tuning in place is off: StatefulDataLoader keeps its iterator's place for "
            "state_dict() and load_state_dict()") in said, said
    assert "resume at the wrong batch" in said


def test_a_subclass_without_state_is_told_apart_from_a_plain_loader():
    from dataloader_tuner.watcher.in_place_tuning import not_rebuilt_reason

    class Mine(torch.utils.data.DataLoader):
        def _get_iterator(self):
            return super()._get_iterator()

    assert not_rebuilt_reason(Mine([1, 2])).startswith(
        "Mine is a DataLoader subclass that makes its own iterators")
    assert "could not be rebuilt" in not_rebuilt_reason(torch.utils.data.DataLoader([1]))
