"""torchdata's StatefulDataLoader (torchtitan's; accelerate's stateful loaders), watched: a
checkpoint taken mid-epoch while watched resumes in a fresh process with exactly the batches
left, and tuning in place, which its state forbids, says so naming it."""

import gc
import json
import os
import subprocess
import sys
from typing import Any

import pytest
import torch

from dataloader_tuner import RunStore, watch

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


def _job(db_path: str, state: str, mode: str, *more: str, program: str = RESUMABLE
         ) -> tuple[list[int], str]:
    done = subprocess.run([sys.executable, "-c", program, db_path, state, mode, *more],
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
    assert ("tuning in place is off: StatefulDataLoader's state_dict() records num_workers, "
            "and its load_state_dict() takes only a state of the same count") in said, said
    assert "would not load in your script as written" in said


def test_what_the_reason_says_breaks_does_break_in_torchdata():
    """A state taken at 2 workers does not load into the same loader at 1 (the switch the
    in-place search would make): the reason above is torchdata's own rule."""
    from torchdata.stateful_dataloader import StatefulDataLoader

    def made(workers: int) -> StatefulDataLoader:
        return StatefulDataLoader(list(range(20)), batch_size=2, num_workers=workers)

    taken = made(2)
    iterator = iter(taken)
    next(iterator)
    state = taken.state_dict()
    del iterator
    switched = made(1)
    switched.load_state_dict(state)
    with pytest.raises(AssertionError):
        next(iter(switched))


def test_a_subclass_without_state_is_told_apart_from_a_plain_loader():
    from dataloader_tuner.watcher.in_place_tuning import not_rebuilt_reason

    class Mine(torch.utils.data.DataLoader):
        def _get_iterator(self):
            return super()._get_iterator()

    assert not_rebuilt_reason(Mine([1, 2])).startswith(
        "Mine is a DataLoader subclass that makes its own iterators")
    assert "could not be rebuilt" in not_rebuilt_reason(torch.utils.data.DataLoader([1]))


# The same checkpoint over a Dataset class of its own (a real fetch: ~3 ms a sample), its
# workers probed on the loader's instance; resumed watched or not. argv: as RESUMABLE's, plus
# watched|plain for the resume.
PROBED = """
import json, sys, time, torch
from torch.utils.data import Dataset
from torchdata.stateful_dataloader import StatefulDataLoader
from dataloader_tuner import watch

class Slow(Dataset):
    def __len__(self):
        return 100
    def __getitem__(self, i):
        time.sleep(0.003)
        return i

db, state, mode = sys.argv[1], sys.argv[2], sys.argv[3]
loader = StatefulDataLoader(Slow(), batch_size=4, shuffle=True, num_workers=2,
                            generator=torch.Generator().manual_seed(7))
if mode == "resume":
    loader.load_state_dict(torch.load(state, weights_only=False))
watched = watch(loader, name="train", db=db) if "plain" not in sys.argv else loader
seen = []
for batch in watched:
    seen.extend(int(i) for i in batch)
    if mode == "take" and len(seen) == 40:
        torch.save(watched.state_dict(), state)
        break
assert loader.collate_fn.__name__ == "default_collate", loader.collate_fn  # as it was set
if watched is not loader:
    watched.close()
print(json.dumps(seen))
"""


@pytest.mark.slow  # three processes, each with torch and 2 workers
def test_a_stateful_loader_is_watched_inside_its_workers_and_resumes_exactly(db_path, tmp_path):
    """Its workers' rows and the fetch inside them, as a plain DataLoader's (before: the loop's
    side only); a checkpoint taken while watched resumes with exactly the batches left, in a
    process that watches it and in one that does not."""
    state = str(tmp_path / "loader.pt")
    first, _ = _job(db_path, state, "take", program=PROBED)
    watched_rest, _ = _job(db_path, state, "resume", program=PROBED)
    plain_rest, _ = _job(db_path, state, "resume", "plain", program=PROBED)
    assert len(first) == 40 and watched_rest == plain_rest and len(plain_rest) == 60
    assert sorted(first + plain_rest) == list(range(100))
    runs = sorted(RunStore(db_path).list_runs(), key=lambda run: run.id)
    assert [run.result.batches for run in runs] == [10, 15]
    for run in runs:
        result = run.result
        assert {w["id"] for w in result.workers} == {0, 1}, result.workers
        assert all(w["batches"] > 0 for w in result.workers)
        # 4 samples of ~3 ms each: the fetch is timed inside the workers, apart from collate
        assert result.per_batch["fetch_ms"] >= 10, result.per_batch
        assert result.per_batch["collate_ms"] < result.per_batch["fetch_ms"]
        assert "leading dimension" not in result.counting["samples"]


@pytest.mark.slow  # 2 s: the batch holding sample 40 takes 1.6 s
def test_a_stateful_loaders_late_batch_is_named_with_its_worker_and_stack(db_path):
    """As a plain DataLoader's (tests/test_stalls.py): the worker making a late batch and where
    its stack is; its sample indices are the subclass's sampler's, not read."""
    from torchdata.stateful_dataloader import StatefulDataLoader

    from tests.datasets.slow_indices import SlowOnAFew

    loader = watch(StatefulDataLoader(SlowOnAFew(), batch_size=4, num_workers=2), name="train",
                   db=db_path)
    seen = [int(batch[0, 0]) for batch in loader]
    result = loader.close()
    assert seen == list(range(0, 200, 4))
    late = {w.code: w for w in result.warnings}["overdue_batch"]
    (batch,) = late.evidence["batches"]
    assert batch["seq"] == 10 and batch["worker_id"] == 0 and batch["took_s"] >= 1.5
    assert "slow_indices.py" in late.evidence["stack"] and "__getitem__" in late.evidence["stack"]


class Numbered(torch.utils.data.Dataset):
    """Sample i is 8 copies of i (a class of its own: a list's cannot be timed in workers)."""

    def __len__(self):
        return 200

    def __getitem__(self, index):
        return torch.full((8,), float(index))


def _shard_epochs(db_path: str | None) -> tuple[list[int], list[int], list[int], Any]:
    """accelerate's stateful shard of Numbered, 2 workers, shuffled: an epoch, 80 samples of
    the next and a checkpoint, and what a fresh shard loaded from it gives; watched where
    ``db_path`` is given (the run's result returned too)."""
    from accelerate import Accelerator
    from accelerate.utils import DataLoaderConfiguration

    from dataloader_tuner.watcher.shutdown import _watched

    accelerator = Accelerator(cpu=True, dataloader_config=DataLoaderConfiguration(
        use_stateful_dataloader=True))

    def prepared():
        return accelerator.prepare(torch.utils.data.DataLoader(
            Numbered(), batch_size=4, num_workers=2, shuffle=True,
            generator=torch.Generator().manual_seed(3)))

    shard = prepared()
    if db_path is not None:
        assert watch(shard, name="shard", db=db_path) is shard  # the job keeps its shard
    first = [int(sample[0]) for batch in shard for sample in batch]
    seen: list[int] = []
    for batch in shard:
        seen += [int(sample[0]) for sample in batch]
        if len(seen) == 80:
            state = shard.state_dict()
            break
    result = _watched[-1].close() if db_path is not None else None
    assert "__iter__" not in shard.base_dataloader.__dict__  # its own again
    resumed = prepared()
    resumed.load_state_dict(state)
    rest = [int(sample[0]) for batch in resumed for sample in batch]
    del shard, resumed
    gc.collect()  # (the broken-off epoch's workers end with its loader)
    return first, seen, rest, result


@pytest.mark.slow  # four shards of 2 workers
def test_accelerates_stateful_loader_is_watched_inside_its_workers_and_resumes_exactly(
        db_path):
    """accelerate's use_stateful_dataloader shard stands in for the StatefulDataLoader it holds
    without being a DataLoader (before: "not watched", an AttributeError). It is watched inside
    its own object, asking the StatefulDataLoader for each epoch through an ``__iter__`` set on
    it (attach.py): the workers' rows come from the epochs made with the probes (not the first:
    the shard made that one's iterator for state_dict() when it was made), and the batches, the
    checkpoint and what resumes from it are those of the shard unwatched."""
    *plain, _ = _shard_epochs(None)
    *watched, result = _shard_epochs(db_path)
    assert watched == plain and len(plain[0]) == 200 and len(plain[2]) == 120
    assert result.epochs == 2 and {w["id"] for w in result.workers} == {0, 1}
    assert sum(w["batches"] for w in result.workers) >= 20  # the second epoch's
    assert result.per_batch["fetch_ms"] is not None


def test_probes_on_a_lazy_subclass_stay_set_until_its_iterator_is_made():
    """A subclass whose __iter__ is a generator (litdata's) makes its iterator at the first
    next(): the probes are set until then, and put back there, or when the epoch ends
    without it (own_iterators.py)."""
    from torch.utils.data._utils.collate import default_collate

    from dataloader_tuner.record.ledger import samples_of
    from dataloader_tuner.watcher.own_iterators import ProbedOnInstance

    class Lazy(torch.utils.data.DataLoader):
        def __iter__(self):
            yield from super().__iter__()

    loader = Lazy(list(range(6)), batch_size=2)
    probes = ProbedOnInstance(loader)
    batches, probed = probes.iterator()
    assert probed and loader.collate_fn is not default_collate  # not made yet
    batch, meta = next(batches)
    # (samples_of: a batch this process's timer left untimed has its count in a plain tuple,
    # as a test run before this one in the same process can leave it)
    assert batch.tolist() == [0, 1] and samples_of(meta) == 2
    assert loader.collate_fn is default_collate and loader.worker_init_fn is None
    probes.iterator()  # never started...
    probes.put_back()  # ...and its epoch over
    assert loader.collate_fn is default_collate


class ResumableDataLoader(torch.utils.data.DataLoader):
    """Many repositories' own: counts the batches it yields on top of DataLoader's iterator
    (MosaicML streaming's StreamingDataLoader does the same) and skips as many on resume."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.skip = self.yielded = 0

    def __iter__(self):
        self.yielded, skip, self.skip = self.skip, self.skip, 0
        for position, batch in enumerate(super().__iter__()):
            if position >= skip:
                self.yielded += 1
                yield batch

    def state_dict(self):
        return {"yielded": self.yielded}

    def load_state_dict(self, state):
        self.skip = state["yielded"]


@pytest.mark.slow  # four loaders of 2 workers
def test_a_repositorys_resumable_loader_is_watched_in_place_and_resumes_exactly(db_path):
    """Its __iter__ takes DataLoader's batches (super().__iter__()): watched inside its own
    object, its workers' rows recorded, and its count, checkpoint and resume as unwatched."""
    def epochs(watched: bool) -> tuple[list[int], list[int], Any]:
        def made():
            return ResumableDataLoader(Numbered(), batch_size=4, num_workers=2, shuffle=True,
                                       generator=torch.Generator().manual_seed(5))

        loader = made()
        if watched:
            assert watch(loader, name="resumable", db=db_path) is loader
        seen: list[int] = []
        for batch in loader:
            seen += [int(sample[0]) for sample in batch]
            if len(seen) == 60:
                state = loader.state_dict()
                break
        from dataloader_tuner.watcher.shutdown import _watched

        result = _watched[-1].close() if watched else None
        resumed = made()
        resumed.load_state_dict(state)
        rest = [int(sample[0]) for batch in resumed for sample in batch]
        del loader, resumed
        gc.collect()
        return seen, rest, result

    *plain, _ = epochs(False)
    *watched, result = epochs(True)
    assert watched == plain and sorted(plain[0] + plain[1]) == list(range(200))
    assert {w["id"] for w in result.workers} == {0, 1} and result.batches == 15
