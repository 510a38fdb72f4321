"""watch(loader): a training loop's own DataLoader, measured in its own process and saved to the
run history while it trains, without changing what the loop receives."""

import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import time

import psutil
import pytest
import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler, IterableDataset

from dataloader_tuner import ProfileResult, RunStore, watch
from dataloader_tuner.run.live import LiveRun

from .conftest import EXAMPLES, ROOT


class Indices(Dataset):
    """Sample i is the tensor [i]: batches show exactly which samples the loop received."""

    def __init__(self, n: int = 96) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int):
        return torch.tensor([index])


class Stream(IterableDataset):
    def __iter__(self):
        return iter(torch.arange(40).view(-1, 1))


class OwnLoader(DataLoader):
    """A DataLoader subclass with its own iteration, not DataLoader's: the watcher cannot
    promise a rebuilt copy behaves the same (one that takes DataLoader's is watched inside
    itself: test_trainers)."""

    def __iter__(self):
        indices = list(self.batch_sampler)
        for batch in indices:
            yield self.collate_fn([self.dataset[i] for i in batch])


def epochs_of(loader, epochs: int = 2) -> list[list[int]]:
    return [[int(i) for batch in loader for i in batch.flatten()] for _ in range(epochs)]


def shuffled(workers: int) -> DataLoader:
    return DataLoader(Indices(), batch_size=8, shuffle=True, num_workers=workers,
                      generator=torch.Generator().manual_seed(7))


@pytest.mark.parametrize("workers", [0, 2])
def test_the_loop_receives_the_same_batches_in_the_same_order(db_path, workers):
    watched = watch(shuffled(workers), name="train", db=db_path)
    seen = epochs_of(watched)
    result = watched.close()
    assert seen == epochs_of(shuffled(workers))  # same seed, unwatched: identical order
    for epoch in seen:
        assert sorted(epoch) == list(range(96))  # every sample once per epoch
    assert seen[0] != seen[1]  # and a fresh shuffle each epoch, as without the watcher
    assert isinstance(result, ProfileResult) and result.status == "ok"
    assert result.batches == 24 and result.epochs == 2
    assert watched.probed is not None and result.counting["samples"].startswith("exact")


def slow_start(worker_id: int) -> None:
    time.sleep(0.3)  # a worker that takes its time to start (opening files, importing)


def test_each_epochs_start_up_is_waited_for_as_the_loop_lives_it(db_path):
    """iter() starting the workers and their first batch: the epoch's first row waits it all,
    as a loop's own clock around ``for batch in loader`` sees it."""
    loader = DataLoader(Indices(32), batch_size=8, num_workers=1, worker_init_fn=slow_start)
    watched = watch(loader, db=db_path)
    own_waits = []
    for _ in range(3):
        asked = time.monotonic()
        for _batch in watched:
            own_waits.append(time.monotonic() - asked)
            asked = time.monotonic()
    watched.close()
    batches = RunStore(db_path).batches(watched.run_id)
    firsts = [b for b in batches if b.seq % 4 == 0]
    assert len(batches) == 12 and all(b.wait_s >= 0.3 for b in firsts)
    for own, row in zip(own_waits, batches):  # the loop's clock and the tool's agree
        assert row.wait_s == pytest.approx(own, abs=0.02)


def test_each_worker_is_probed_once_and_every_epochs_workers_offer_their_stacks(db_path):
    """A loader's workers have their thread pools and generators read until each worker has
    been read once with nothing new to inherit (the next epochs' workers run the same code,
    forked from the same process: reading them again held up each epoch's first batch); each
    epoch's workers still offer their stacks to a hang report; a change in what workers
    inherit (here a generator on the dataset) has the next ones read again."""
    dataset = Indices(32)
    watched = watch(DataLoader(dataset, batch_size=8, num_workers=2), db=db_path)

    def probes_after(epochs: int) -> list[dict]:
        for _ in range(epochs):
            for _batch in watched:
                pass
        watched.recorder.flush()
        store = RunStore(db_path)
        try:
            return LiveRun.stored(store, watched.run_id).probes
        finally:
            store.close()

    try:
        # (the first epoch's own lazy imports may have the second read again)
        settled = probes_after(2)
        assert {p["worker_id"] for p in settled} == {0, 1}
        assert all("pools" in p["probe"] and "rng_used" in p["probe"] for p in settled)
        stacks_before = set(os.listdir(watched.checks.stacks_dir))
        assert len(probes_after(3)) == len(settled)  # three more epochs, nothing read again
        stacks = set(os.listdir(watched.checks.stacks_dir)) - stacks_before
        assert len([name for name in stacks if name.endswith(".stack")]) == 6
        assert vars(dataset) == {"n": 32}  # the user's dataset untouched
        dataset.rng = random.Random(0)
        again = probes_after(1)[len(settled):]
        assert sorted(p["worker_id"] for p in again) == [0, 1]
    finally:
        watched.close()


def test_a_loader_that_could_not_be_probed_keeps_its_persistent_workers(db_path, monkeypatch):
    """Timed from the loop's side only (a copy with probes could not be made), a loader with
    persistent workers keeps them from epoch to epoch, as unwatched (they were shut down at the
    first epoch's end, and the second failed on a closed queue)."""
    import dataloader_tuner.watcher.epoch_iterators as watcher

    monkeypatch.setattr(watcher, "instrumented", lambda loader, any_class=False:
                        (None, "no copy for this test"))
    loader = DataLoader(Indices(32), batch_size=8, num_workers=2, persistent_workers=True)
    watched = watch(loader, db=db_path)
    try:
        assert epochs_of(watched, 3) == [list(range(32))] * 3
        assert all(worker.is_alive() for worker in loader._iterator._workers)
    finally:
        watched.close()
        loader._iterator._shutdown_workers()  # the job's own, as its exit would


class SlowSamples(Indices):
    """Each sample takes 2 ms to read, as a small JPEG decode does."""

    def __getitem__(self, index: int):
        time.sleep(0.002)
        return torch.tensor([index])


def imagenet_style_loop(loader, epochs: int = 3, step_s: float = 0.01) -> float:
    """pytorch/examples' imagenet ``train()``: ``data_time`` runs from the end of the last step
    (or the epoch's start, before ``iter()``) to the batch in hand, ``batch_time`` the whole
    iteration; the time between epochs (validation here) is in neither. Its own wait share."""
    data_time = batch_time = 0.0
    for _ in range(epochs):
        end = time.time()
        for _batch in loader:
            data_time += time.time() - end
            time.sleep(step_s)
            batch_time += time.time() - end
            end = time.time()
        time.sleep(0.05)  # validation
    return data_time / batch_time


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.host_speed
def test_input_wait_agrees_with_a_loop_that_times_its_own_data_wait(db_path, workers):
    """Short epochs, so each epoch's start-up is a real share of the loop's time: the headline
    wait includes it, within 2 points of the loop's own clock."""
    loader = DataLoader(SlowSamples(64), batch_size=8, num_workers=workers,
                        worker_init_fn=slow_start if workers else None)
    watched = watch(loader, db=db_path)
    own = imagenet_style_loop(watched)
    result = watched.close()
    wait = result.input_wait
    assert wait["share"] == pytest.approx(own, abs=0.02)
    assert wait["epochs_started"] == 3 and result.epochs == 3
    assert wait["loop_is"].startswith("each epoch from its iter() to its last batch's step")
    if workers:  # three start-ups of 0.3 s each, against ~0.1 s of steps per epoch
        assert wait["startup_first_s"] >= 0.3 and wait["startup_share"] > 0.5
        assert result.input_bound == "highly input-bound"


def test_it_iterates_like_the_loader(db_path):
    sampler = DistributedSampler(Indices(), num_replicas=1, rank=0, shuffle=True, seed=3)
    watched = watch(DataLoader(Indices(), batch_size=10, sampler=sampler), db=db_path)
    assert len(watched) == 10 and watched.batch_size == 10 and watched.dataset.n == 96
    watched.sampler.set_epoch(1)  # a DistributedSampler stays reachable
    first = next(iter(watched))  # a loop that breaks early...
    assert first.shape == (10, 1)
    assert sorted(int(i) for b in watched for i in b.flatten()) == list(range(96))  # ...restarts
    for i, _batch in enumerate(watched):  # the last batch of a loop that breaks is recorded
        if i == 4:
            break
    watched.close()
    runs = RunStore(db_path).list_runs()
    assert runs[0].kind == "watch" and runs[0].status == "ok" and runs[0].label == "loader"
    assert len(RunStore(db_path).batches(watched.run_id)) == 1 + 10 + 5


def test_an_iterable_and_a_subclass_are_counted_from_the_batches(db_path):
    stream = watch(DataLoader(Stream(), batch_size=8), name="stream", db=db_path)
    assert [len(b) for b in stream] == [8] * 5
    assert stream.close().steady_batches == 4  # after the one warm-up batch
    own = watch(OwnLoader(Indices(), batch_size=12), name="own", db=db_path)
    assert [len(b) for b in own] == [12] * 8
    result = own.close()
    assert own.probed is None and own.unprobed_reason.startswith(
        "OwnLoader makes its own iterators with its own __iter__, which may read or change")
    assert result.samples_per_s and "OwnLoader" in result.counting["samples"]
    batches = RunStore(db_path).batches(own.run_id)
    assert sum(b.samples for b in batches) == 96 and batches[0].nbytes is None


def test_without_a_gpu_it_says_what_was_not_measured(db_path):
    if torch.cuda.is_available():
        pytest.skip("a GPU is visible")
    watched = watch(shuffled(0), db=db_path)
    epochs_of(watched, 1)
    result = watched.close()
    assert result.transfer is None and result.gpu_idle is None
    assert "no CUDA GPU" in result.not_measured


def run_script(db_path: str, *args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, os.path.join(EXAMPLES, "train_watched.py"), "--db", db_path, *args],
        cwd=ROOT, env=dict(os.environ, PYTHONPATH=ROOT), stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, start_new_session=True)


def reap_orphans(timeout_s: float = 5.0) -> None:
    """The killed job's workers lose their parent; this process (a subreaper once the engine
    has run here) adopts them: wait for them as their parent would have."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            time.sleep(0.05)


def wait_for_batches(store: RunStore, job: subprocess.Popen, timeout_s: float = 60.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and job.poll() is None:
        runs = [r for r in store.list_runs() if r.label == "train"]
        if runs and store.batches(runs[0].id):
            return runs[0]
        time.sleep(0.2)
    raise AssertionError(f"no batches from the job: {job.poll()} {job.stderr.read()}")


@pytest.mark.slow
def test_a_real_training_script_streams_its_runs_while_it_trains(db_path):
    store = RunStore(db_path)
    job = run_script(db_path, "--epochs", "2", "--samples", "2048", "--step-ms", "5")
    try:
        live = wait_for_batches(store, job)
        assert live.status == "running" and live.pid == job.pid
        assert live.script.endswith("train_watched.py")
        out, err = job.communicate(timeout=120)
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait()
    assert job.returncode == 0, err
    printed = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    assert [p["name"] for p in printed] == ["train", "val"]
    train, val = (store.get_run(p["run_id"]) for p in printed)
    assert train.status == val.status == "ok"
    assert train.result.batches == 2 * 32 and train.result.epochs == 2  # 2048 / 64 per epoch
    assert {w["id"] for w in train.result.workers} == {0, 1}
    assert train.result.consumer_idle_frac is not None and train.result.input_bound
    assert store.resources(train.id)


@pytest.mark.slow
def test_a_killed_job_leaves_a_readable_run_marked_lost(db_path):
    store = RunStore(db_path)
    job = run_script(db_path, "--epochs", "50", "--step-ms", "5")
    try:
        run = wait_for_batches(store, job)
        time.sleep(0.6)  # a few flushes
    finally:
        os.killpg(job.pid, signal.SIGKILL)
        job.communicate()
        reap_orphans()
    assert store.get_run(run.id).status == "running"  # nobody said goodbye...
    deadline = time.monotonic() + 15  # ...and its writer is gone, silent for a few seconds
    while run.id not in store.mark_lost_runs() and time.monotonic() < deadline:
        time.sleep(0.5)
    lost = store.get_run(run.id)
    assert lost.status == "lost" and lost.ended_at is not None and lost.result is None
    assert len(store.batches(run.id)) > 0  # the data up to the last flush is kept


TERMINATED = """
import sys, time
from torch.utils.data import DataLoader
from dataloader_tuner import watch
loader = watch(DataLoader(list(range(64)), batch_size=8, num_workers=2, persistent_workers=True),
               name="train", db=sys.argv[1])
while True:
    for batch in loader:
        time.sleep(0.01)
"""


@pytest.mark.slow
def test_a_job_stopped_with_sigterm_ends_its_run_as_stopped(db_path):
    """torchrun stops a failed job's other ranks with SIGTERM (schedulers do, on preemption):
    the run ends "stopped", written, instead of being found lost later; the job still dies of
    the signal, and its workers with it."""
    store = RunStore(db_path)
    job = subprocess.Popen([sys.executable, "-c", TERMINATED, db_path], cwd=ROOT,
                           env=dict(os.environ, PYTHONPATH=ROOT), stderr=subprocess.PIPE,
                           text=True, start_new_session=True)
    try:
        run = wait_for_batches(store, job)
        workers = psutil.Process(job.pid).children()
        assert len(workers) == 2
        job.send_signal(signal.SIGTERM)
        job.wait(timeout=30)
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait()
    assert job.returncode == -signal.SIGTERM  # the signal's own ending, as without the tool
    stopped = store.get_run(run.id)
    assert stopped.status == "stopped" and stopped.result.batches >= 8
    assert psutil.wait_procs(workers, timeout=10)[1] == []  # its workers went too


DONE_THEN_SAVING = """
import sys, time
from torch.utils.data import DataLoader
from dataloader_tuner import watch
loader = watch(DataLoader(list(range(64)), batch_size=8, num_workers=2), name="train",
               db=sys.argv[1])
for epoch in range(2):
    for batch in loader:
        time.sleep(0.01)
print("trained", flush=True)
time.sleep(120)  # saving, uploading: the launcher's SIGTERM comes after the loop is done
"""


@pytest.mark.slow
def test_a_job_ended_by_sigterm_after_its_loop_is_done_is_recorded_finished(db_path):
    """Slurm and Kubernetes send SIGTERM when a job's time is up, however far it got: a loop
    whose every epoch ran out had finished, and its run ends "ok" with every batch (before:
    "stopped"); the process still dies of it."""
    store = RunStore(db_path)
    job = subprocess.Popen([sys.executable, "-c", DONE_THEN_SAVING, db_path], cwd=ROOT,
                           env=dict(os.environ, PYTHONPATH=ROOT), stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert job.stdout.readline().strip() == "trained"
        job.send_signal(signal.SIGTERM)
        job.wait(timeout=30)
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
        job.communicate()
    # Dead of the signal, or of the backstop's SIGKILL where the signal reached another
    # thread than the sleeping main one (NOTE [ Ending watched runs on SIGTERM ])
    assert job.returncode in (-signal.SIGTERM, -signal.SIGKILL)
    (run,) = store.list_runs()
    assert run.status == "ok" and run.result.batches == 16 and run.result.epochs == 2


BLOCKED_IN_C = """
import ctypes, sys
from torch.utils.data import DataLoader
from dataloader_tuner import watch
loader = watch(DataLoader(list(range(64)), batch_size=8), name="train", db=sys.argv[1])
for batch in loader:
    pass
for batch in loader:  # blocked in C (as in a collective waiting for a dead peer): glibc's
    ctypes.CDLL(None).system(b"sleep 120")  # system() waits on, through signals
"""


@pytest.mark.slow
def test_a_job_blocked_in_c_code_still_stops_on_sigterm(db_path):
    """Python runs a SIGTERM handler only between bytecodes: a main thread blocked in C would
    have outlived torchrun's SIGTERM until its SIGKILL 30 s later. The signal also wakes a
    thread that ends the runs and the process within a few seconds."""
    store = RunStore(db_path)
    job = subprocess.Popen([sys.executable, "-c", BLOCKED_IN_C, db_path], cwd=ROOT,
                           env=dict(os.environ, PYTHONPATH=ROOT), stderr=subprocess.PIPE,
                           text=True, start_new_session=True)
    try:
        run = wait_for_batches(store, job)
        time.sleep(1.0)  # in the system() call by now
        job.send_signal(signal.SIGTERM)
        started = time.monotonic()
        job.wait(timeout=20)
        took = time.monotonic() - started
    finally:
        os.killpg(job.pid, signal.SIGKILL)  # the orphaned "sleep 120"
        job.wait()
        reap_orphans()
    assert job.returncode == -signal.SIGKILL and took < 10
    assert store.get_run(run.id).status == "stopped"


def test_a_job_that_dies_of_an_exception_ends_its_run_as_an_error(db_path):
    code = ("import torch\n"
            "from torch.utils.data import DataLoader\n"
            "from dataloader_tuner import watch\n"
            f"loader = watch(DataLoader(list(range(64)), batch_size=8), name='t', db={db_path!r})\n"
            "for i, batch in enumerate(loader):\n"
            "    if i == 3:\n"
            "        raise ValueError('loss is nan')\n")
    job = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         env=dict(os.environ, PYTHONPATH=ROOT), timeout=120)
    assert job.returncode == 1 and "loss is nan" in job.stderr
    run = RunStore(db_path).list_runs()[0]
    assert run.status == "error" and run.error["type"] == "watched_job_failed"
    assert "ValueError: loss is nan" in run.error["message"]
    # The batches handed to the loop: three stepped through, and the fourth, whose step raised
    # (recorded when the loop let go of the loader).
    assert len(RunStore(db_path).batches(run.id)) == 4


def test_a_failed_write_is_retried_not_lost_nor_doubled(db_path, monkeypatch, capsys):
    """The history fails after a flush's rows went in, before the flush's end: nothing of that
    flush is kept, and the retry writes each batch once."""
    import dataloader_tuner.store as store_module

    watched = watch(shuffled(0), name="retry", db=db_path)
    real = store_module.write_event
    failing = {"on": True}

    def flaky(conn, run_id, event):
        real(conn, run_id, event)
        if failing["on"] and type(event).__name__ == "Batches":
            raise sqlite3.OperationalError("database is locked")

    monkeypatch.setattr(store_module, "write_event", flaky)  # (as the store calls it)
    epochs_of(watched, 1)
    watched.recorder.flush(sample=True)  # fails after its rows: they stay in the buffer
    assert watched.recorder.pending() == 12 and "could not write" in capsys.readouterr().err
    assert RunStore(db_path).batches(watched.run_id) == []  # rolled back, not half written
    failing["on"] = False
    watched.close()
    seqs = [b.seq for b in RunStore(db_path).batches(watched.run_id)]
    assert seqs == list(range(12))  # every batch, written later, once


def test_a_run_that_ends_while_its_start_reads_the_machine_does_not_wait_for_that(
        db_path, monkeypatch):
    """The run's first record (the machine's load, watched over 0.2 s on the recorder's
    thread) is cut short when the run ends first: a short evaluation or a test's run ended
    up to 0.2 s late. Lengthened to a minute here: close() must not wait it out."""
    from dataloader_tuner import system

    monkeypatch.setattr(system, "LOAD_INTERVAL_S", 60.0)
    watched = watch(DataLoader(Indices(16), batch_size=8), db=db_path)
    assert len([batch for batch in watched]) == 2
    started = time.monotonic()
    result = watched.close()
    assert time.monotonic() - started < 4.0  # the recorder's join gives up at 5 s
    assert result is not None and result.batches == 2
    stored = LiveRun.stored(RunStore(db_path), watched.run_id)
    assert stored.dataset is not None and stored.dataset.class_name.endswith("Indices")


def test_the_card_of_a_watched_loader_says_whether_the_job_chose_its_sampler():
    from torch.utils.data import BatchSampler, SequentialSampler, WeightedRandomSampler

    from dataloader_tuner.watcher.loader import _own_sampler

    data = torch.arange(16)
    own_batches = BatchSampler(SequentialSampler(data), 4, False)
    assert not _own_sampler(DataLoader(data, batch_size=4))
    assert not _own_sampler(DataLoader(data, batch_size=4, shuffle=True))
    assert not _own_sampler(DataLoader(data, batch_size=None))
    assert _own_sampler(DataLoader(data, sampler=WeightedRandomSampler([1.0] * 16, 16)))
    assert _own_sampler(DataLoader(data, batch_sampler=[[0, 1], [2, 3]]))
    assert not _own_sampler(DataLoader(data, batch_sampler=own_batches))  # as DataLoader builds


SHM_FILLS = """
import os, sys, time, torch
from torch.utils.data import DataLoader, Dataset
from dataloader_tuner import watch

class Big(Dataset):
    def __len__(self): return 64
    def __getitem__(self, i): return torch.zeros(1 << 20)  # 4 MB: 16 MB in flight

loader = watch(DataLoader(Big(), batch_size=1, num_workers=2, persistent_workers=True),
               name="shm", db=sys.argv[1])
path, start = f"/dev/shm/dataloader-tuner-test-{os.getpid()}", time.monotonic()
until = None  # 3 s after the fill: the resource samples that see it (a loaded CI host once
try:          # took until the end of a fixed 4.5 s to start, and no sample followed the fill)
    while until is None or time.monotonic() < until:
        for batch in loader:
            time.sleep(0.002)
            if until is None and time.monotonic() - start > 1.5:
                with open(path, "wb") as f:  # another job's 36 MB
                    f.write(bytes(36 << 20))
                until = time.monotonic() + 3.0
                print("FILLED", file=sys.stderr, flush=True)
finally:
    if os.path.exists(path):
        os.remove(path)
loader.close()
"""


@pytest.mark.slow  # a 4.5 s training job
def test_a_watched_job_is_told_as_dev_shm_fills_while_it_runs(db_path):
    """16 MB of batches in flight fit a rehearsed 64 MB /dev/shm at the start; another job's
    36 MB file taken mid-run leaves them less than twice their size: said on the job's stderr
    then (not before), and kept in the run's warnings after the file is gone."""
    job = subprocess.run([sys.executable, "-c", SHM_FILLS, db_path], cwd=ROOT,
                         capture_output=True, text=True, timeout=120,
                         env=dict(os.environ, PYTHONPATH=ROOT, DATALOADER_TUNER_SHM_MB="64"))
    assert job.returncode == 0, job.stderr[-2000:]
    before, _, after = job.stderr.partition("FILLED")
    assert "Batches in flight" not in before and "Batches in flight (2 workers x prefetch 2" \
        in after, job.stderr[-2000:]
    run = RunStore(db_path).list_runs()[0]
    found = [w for w in run.result.to_dict()["warnings"] if w["code"] == "shm_too_small"]
    assert found and found[0]["evidence"]["during_run"], run.result.to_dict()["warnings"]
