"""The trainers that build the DataLoader themselves, watched in one line with their own
packages: accelerate's prepared loader, the Hugging Face Trainer (tiny models from local
configs; nothing downloaded) and Lightning, alone and under DDP. Each runs as a real training
script, and the figures are checked against the loop's own clock."""

import json
import statistics
import os
import sys
import time

import psutil
import pytest
import torch
from torch.utils.data import DataLoader

import streamlit as st
from streamlit.testing.v1 import AppTest

from dataloader_tuner import RunStore, watch
from dataloader_tuner.watcher.shutdown import _watched

from .browser import free_port
from .conftest import ROOT
from .jobs import reap_orphans, run_job
from .test_app import WATCHED_SCRIPT


def script(name: str, *args: str, cwd: str = ROOT) -> dict:
    """What the training script printed last, as JSON, and its stderr (as "stderr")."""
    # (a DDP job's ranks on loopback only: KNOWLEDGE.md)
    job = run_job([sys.executable, os.path.join(ROOT, "tests", "trainers", name), *args],
                  cwd=cwd, env=dict(os.environ, PYTHONPATH=ROOT, HF_HUB_OFFLINE="1",
                                    MASTER_ADDR="127.0.0.1", GLOO_SOCKET_IFNAME="lo"))
    assert job.returncode == 0, job.stderr[-3000:]
    printed = json.loads([line for line in job.stdout.splitlines() if line.startswith("{")][-1])
    return {**printed, "stderr": job.stderr}


def runs_by_label(db_path: str) -> dict:
    return {run.label: run for run in RunStore(db_path).list_runs()}


@pytest.mark.slow  # two training scripts with 2 workers each
@pytest.mark.host_speed
def test_accelerate_prepared_loader_is_watched_with_its_workers(db_path):
    """``watch(accelerator.prepare(loader))`` gives the job its DataLoaderShard back, the same
    batches in the same order, and the run the workers' figures; its input wait (each
    epoch's start-up and the end the shard waits for before its last batch) agrees with the
    loop's own clock within 5% (issue 66). What lies between: accelerate's ``send_to_device``
    (~50 us a batch, in the step by design, as a loop's own ``.to(device)``: attach.py) and
    the tool's own few tens of us a batch. The free of the batch the loop lets go of (a
    worker's tensors unmap their shared memory, ~15-50 us each whatever their size) was
    outside the tool's wait before, 0.957 of the loop's clock; held and freed inside it, one
    wait later for a wrapper asking one batch ahead, 0.966-0.970 (bench/trainer_clocks.py;
    NOTE [ A batch freed where the loop's clock has it ])."""
    plain = script("accelerate_loop.py", db_path, "--unwatched")
    watched = script("accelerate_loop.py", db_path)
    assert watched["type"] == "DataLoaderShard"
    assert watched["received"] == plain["received"]
    run = runs_by_label(db_path)["train"]
    doc = run.result.to_dict()
    assert run.framework == "accelerate" and doc["batches"] == 48 and doc["epochs"] == 2
    assert sorted(w["id"] for w in doc["workers"]) == [0, 1]
    assert all(w["busy_frac"] and w["batches"] == 24 for w in doc["workers"])
    waited, loop_waited = doc["input_wait"]["waited_s"], watched["waited_s"]
    assert abs(waited - loop_waited) <= 0.05 * loop_waited + 0.002, (doc["input_wait"], watched)


@pytest.mark.host_speed  # its wait share against the loop's own clock
@pytest.mark.slow  # two accelerate loops of 80 epochs (~30 s)
def test_accelerate_prepared_loader_is_tuned_in_place(db_path, tmp_path):
    """``watch(accelerator.prepare(loader), tune=True)``: worker counts tried inside the
    shard, the batches the loop gets unchanged (same samples, same order, every epoch), the
    choice said and saved; the tuned epochs' input wait agrees with the loop's own clock."""
    epochs = "80"  # (the search took 18 to 40 of them here)
    plain = script("accelerate_loop.py", db_path, "--unwatched", "--tune", epochs, cwd=tmp_path)
    tuned = script("accelerate_loop.py", db_path, "--tune", epochs, cwd=tmp_path)
    assert tuned["type"] == "DataLoaderShard"
    assert tuned["received"] == plain["received"]
    assert "tuned in place: DataLoader(dataset, batch_size=8" in tuned["stderr"]
    assert (tmp_path / "dataloader-tuner-train.json").exists()
    doc = runs_by_label(db_path)["train"].result.to_dict()
    assert doc["batches"] == 24 * 80
    assert abs(doc["input_wait"]["share"] - tuned["wait_share"]) <= 0.02, (
        doc["input_wait"], tuned["wait_share"])


@pytest.mark.host_speed  # the Trainer's own work between steps scales with the host
@pytest.mark.slow  # a real Trainer run: 2 epochs, 2 evaluations
def test_hugging_face_trainer_loaders_are_watched_in_one_line(db_path, tmp_path, monkeypatch):
    loop = script("hf_trainer.py", db_path, str(tmp_path / "out"))
    assert loop["ended"] == ["ok", "ok"]  # with train(), not at the script's exit
    runs = runs_by_label(db_path)
    train, evaluation = runs["train"], runs["eval"]
    assert {train.framework, evaluation.framework} == {"Hugging Face Trainer"}
    doc = train.result.to_dict()
    assert doc["batches"] == 32 and doc["epochs"] == 2  # 128 samples of 8, twice
    assert sorted(w["id"] for w in doc["workers"]) == [0, 1]
    # The recommendation in the form the Trainer takes it.
    assert doc["snippet"].startswith("TrainingArguments(..., dataloader_num_workers=2")
    # Each evaluation built its loader anew: one run goes on over both (2 x 32 / 8).
    assert evaluation.result.to_dict()["batches"] == 8
    assert evaluation.result.to_dict()["epochs"] == 2
    # The loop's clock (the Trainer's events) also holds its own work between steps.
    waited = doc["input_wait"]["waited_s"]
    assert abs(waited - loop["waited_s"]) <= 0.15 * loop["waited_s"], (doc["input_wait"], loop)
    # The Training jobs page lists both, named by the trainer that built them.
    at = training_jobs_page(db_path, monkeypatch)
    assert list(at.dataframe[0].value["built by"]) == ["Hugging Face Trainer"] * 2
    assert "(built by Hugging Face Trainer)" in " ".join(m.value for m in at.markdown)
    st.cache_resource.clear()


def training_jobs_page(db_path: str, monkeypatch) -> AppTest:
    monkeypatch.setenv("DLTUNER_DB", db_path)
    st.cache_resource.clear()
    at = AppTest.from_string(WATCHED_SCRIPT, default_timeout=60).run()
    assert not at.exception
    return at


@pytest.mark.slow  # a Lightning training: 2 epochs, a validation after each
def test_a_lightning_fit_without_workers_ends_normally(db_path):
    """Both loaders at num_workers=0: the fetch runs in the job's own process, which samples
    itself. Lightning puts every signal's handler back as a fit ends, before any callback
    hears of it: with the sampler's timer on SIGPROF the job died there of "Profiling timer
    expired" (4 runs in 6; cpu_timer.py)."""
    for _ in range(3):
        loop = script("lightning_fit.py", db_path, "--no-workers")  # (exit 0, its JSON)
        assert len(loop["received"]) == 48 and loop["ended"][-2:] == ["ok", "ok"]


@pytest.mark.host_speed  # the loop's clock against the tool's, a slow fork of workers between
@pytest.mark.slow  # two Lightning trainings: 2 epochs, a validation after each
def test_lightning_loaders_are_watched_by_one_callback(db_path, monkeypatch):
    """``Trainer(callbacks=[WatchLoaders()])``: the train and val loaders, as Lightning
    prepared them, with their workers; the same batches in the same order as unwatched; the
    input wait against the loop's own clock (Lightning's hooks)."""
    plain = script("lightning_fit.py", db_path, "--unwatched")
    loop = script("lightning_fit.py", db_path)
    # (each sample's draw too: the workers ran Lightning's worker_init_fn, set after the
    # loader was handed over, as unwatched)
    assert loop["received"] == plain["received"]
    assert loop["ended"] == ["ok", "ok"]  # with the fit, not at the script's exit
    runs = runs_by_label(db_path)
    train, val = runs["train"], runs["val"]
    assert {train.framework, val.framework} == {"Lightning"}
    doc = train.result.to_dict()
    assert doc["batches"] == 48 and doc["epochs"] == 2  # 192 samples of 8, twice
    assert sorted((w["id"], w["batches"]) for w in doc["workers"]) == [(0, 24), (1, 24)]
    assert doc["snippet"].startswith("DataLoader(")  # for the DataModule's train_dataloader
    # The hooks' clock misses the first epoch's iter() (made in Lightning's setup, before any
    # hook; it forked the workers in 0.03-0.25 s here): the tool's first batch waited at least
    # what the hooks saw, and the rest within 10% and 25 ms of the hooks' clock. Lightning runs
    # its hooks between the later epochs' iter() and first batch: the tool's start-up is the
    # wait in both, the hooks' clock's too.
    rows = RunStore(db_path).batches(train.id)
    startups = [row.wait_s for row in rows if row.seq in (0, 24)]
    assert startups[0] >= loop["startups_s"][0] - 0.002, (startups, loop["startups_s"])
    waited_after_first = doc["input_wait"]["waited_s"] - startups[0]
    loop_after_first = loop["waited_s"] - loop["startups_s"][0]
    assert abs(waited_after_first - loop_after_first) <= 0.1 * loop_after_first + 0.025, (
        doc["input_wait"], loop)
    assert abs(startups[1] - loop["startups_s"][1]) <= 0.25 * loop["startups_s"][1] + 0.005, (
        startups, loop["startups_s"])
    # The sanity check's 2 batches, then 6 after each epoch: one run, three epochs.
    assert val.result.to_dict()["batches"] == 14 and val.result.to_dict()["epochs"] == 3
    at = training_jobs_page(db_path, monkeypatch)
    assert list(at.dataframe[0].value["built by"]) == ["Lightning"] * 2
    assert "(built by Lightning)" in " ".join(m.value for m in at.markdown)
    st.cache_resource.clear()


@pytest.mark.slow  # a Lightning fit of 3 epochs with 2 workers, twice
@pytest.mark.parametrize("persistent", [False, True], ids=["restarted", "persistent"])
@pytest.mark.host_speed
def test_the_wait_agrees_with_lightning_s_own_profiler(persistent, db_path):
    """Lightning's SimpleProfiler times each fetch of its training loop; the tool's wait of
    each batch agrees with it. (Once the watched loop held each batch until the next came, and
    freeing it, 3 MB of a worker's shared memory, fell inside Lightning's next fetch, outside
    the tool's wait: 0.7-1.1 ms a batch, the tool 26% under the profiler here.) An epoch's
    first batch waits for iter() too, starting the workers, which the profiler leaves out."""
    doc = script("lightning_clock.py", db_path, *(["--persistent"] if persistent else []))
    lightning, tool, n = doc["lightning_s"], doc["tool_s"], doc["batches_per_epoch"]
    assert len(lightning) == len(tool) == 3 * n
    later = [i for i in range(len(tool)) if i % n]  # all but each epoch's first
    gaps_ms = [1000 * abs(lightning[i] - tool[i]) for i in later]
    assert statistics.median(gaps_ms) < 0.3, gaps_ms
    # The sums over all but the two farthest apart: on a loaded 2-core host the job's thread
    # is now and then taken off its core for a few ms between Lightning's clock and the
    # tool's (CI once read 7 ms apart over 21 fetches of ~2 ms; here 0.04-0.14 ms a fetch,
    # and one of 0.73 in 84). What this guards, a share of every fetch missed, shows in all.
    kept = sorted(later, key=lambda i: abs(lightning[i] - tool[i]))[:-2]
    lightning_s, tool_s = sum(lightning[i] for i in kept), sum(tool[i] for i in kept)
    assert abs(tool_s - lightning_s) <= 0.05 * lightning_s + 0.001, (tool_s, lightning_s,
                                                                     gaps_ms)
    firsts = [i for i in range(len(tool)) if i % n == 0]
    assert all(tool[i] >= lightning[i] - 0.001 for i in firsts), (
        [tool[i] for i in firsts], [lightning[i] for i in firsts])
    # An epoch's first batch as Lightning lives it: its fetcher's iter() (the workers
    # starting, outside the profiler's clock) and then its first fetch: the tool's first wait
    # within 5% of the two (issue 66)
    iters = doc["iters_s"]
    assert len(iters) == 3, iters
    lived = sum(iters) + sum(lightning[i] for i in firsts)
    assert abs(sum(tool[i] for i in firsts) - lived) <= 0.05 * lived + 0.003, (
        [tool[i] for i in firsts], [lightning[i] for i in firsts], iters)


@pytest.mark.slow  # a Hugging Face Trainer run of 2 epochs with 2 workers, twice
@pytest.mark.parametrize("persistent", [False, True], ids=["restarted", "persistent"])
@pytest.mark.host_speed
def test_the_wait_agrees_with_the_hugging_face_trainer_s_fetches(persistent, db_path, tmp_path):
    """The Trainer's fetches (``next()`` on its epoch iterator, in ``get_batch_samples``),
    timed in the job, against the tool's input wait of the train loader: within 5%. (Its
    accelerate wrapper asks one batch ahead: the waits line up one batch apart, the sums
    agree; 0.987 of the fetches' time in both here.)"""
    doc = script("hf_clock.py", db_path, str(tmp_path / "out"),
                 *(["--persistent"] if persistent else []))
    fetched_s, waited_s = sum(doc["fetches_s"]), sum(doc["tool_s"])
    assert doc["tool_batches"] == 32 and len(doc["fetches_s"]) == 32
    assert abs(waited_s - fetched_s) <= 0.05 * fetched_s, (waited_s, fetched_s)


@pytest.mark.slow  # a DDP job: 2 ranks on gloo, each with 2 workers
def test_lightning_ddp_ranks_are_one_job_with_their_distributed_samplers(db_path):
    """Lightning's own launcher sets no RANK: each rank is told from the trainer, and rank 0
    gathers both through the job's process-group store. Each rank's loader is the one Lightning
    made again with a DistributedSampler: half the samples each."""
    before = {p.pid for p in psutil.Process().children()}
    loop = script("lightning_fit.py", db_path, "--ddp")
    # Lightning's launcher does not wait for its other ranks: rank 1 may outlive rank 0 by a
    # moment (and each rank's fork server), handed to this process to reap.
    reap_orphans(before)
    assert len(loop["received"]) == 24  # rank 0: 96 samples of 8, twice
    store = RunStore(db_path)
    train = [run for run in store.list_runs() if run.label == "train"]
    assert sorted(run.rank["rank"] for run in train) == [0, 1]
    assert len({run.rank["job_id"] for run in train}) == 1
    assert all(run.result.to_dict()["batches"] == 24 for run in train)
    assert all(len(run.result.to_dict()["workers"]) == 2 for run in train)
    rank0 = next(run for run in train if run.rank["rank"] == 0)
    reports = {summary.rank: summary for _, summary in store.rank_reports(rank0.id)}
    assert sorted(reports) == [0, 1] and {s.status for s in reports.values()} == {"ok"}
    assert all(s.batches == 24 for s in reports.values())


def launcher(name: str, port: int) -> list[str]:
    """The command that starts 2 ranks of a script on this machine, on loopback."""
    if name == "torchrun":
        return [sys.executable, "-m", "torch.distributed.run", "--local-addr", "127.0.0.1",
                "--nnodes", "1", "--nproc-per-node", "2", "--rdzv-backend", "c10d",
                "--rdzv-endpoint", f"127.0.0.1:{port}"]
    # accelerate's multi-process launcher is torchrun's; its --cpu would want MPI for two
    # processes: the script's use_cpu makes them CPU (gloo) ranks.
    return [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu",
            "--num_processes", "2", "--num_machines", "1", "--main_process_ip", "127.0.0.1",
            "--main_process_port", str(port), "--mixed_precision", "no",
            "--dynamo_backend", "no"]


@pytest.mark.slow  # a 2-rank job of the Hugging Face Trainer
@pytest.mark.parametrize("name", ["torchrun", "accelerate launch"])
def test_hugging_face_trainer_ranks_are_one_job(name, db_path, tmp_path):
    """Under torchrun or ``accelerate launch`` each rank's train and eval loaders are its runs,
    and rank 0 gathers both ranks of each into the job's view."""
    before = {p.pid for p in psutil.Process().children()}
    job = run_job(
        [*launcher(name, free_port()), os.path.join(ROOT, "tests", "trainers", "hf_trainer.py"),
         db_path, str(tmp_path / "out")],
        cwd=tmp_path,
        env=dict(os.environ, PYTHONPATH=ROOT, HF_HUB_OFFLINE="1", GLOO_SOCKET_IFNAME="lo",
                 OMP_NUM_THREADS="1"))
    assert job.returncode == 0, job.stderr[-3000:]
    reap_orphans(before)  # each rank's fork server and resource tracker (hf_trainer.py)
    store = RunStore(db_path)
    runs = store.list_runs()
    # 128 samples over 2 ranks in batches of 8, twice; 32 over 2 ranks, twice
    for label, batches in (("train", 16), ("eval", 4)):
        ranks = {run.rank["rank"]: run for run in runs if run.label == label}
        assert sorted(ranks) == [0, 1], [(run.label, run.rank) for run in runs]
        assert all(run.result.to_dict()["batches"] == batches for run in ranks.values())
        assert all(len(run.result.to_dict()["workers"]) == 2 for run in ranks.values())
        reports = {s.rank: s for _, s in store.rank_reports(ranks[0].id)}
        assert sorted(reports) == [0, 1]
        assert [s.batches for s in reports.values()] == [batches, batches]


class Tagged(DataLoader):
    """A user's subclass that adds to the loader and keeps DataLoader's iterator."""

    def describe(self) -> str:
        return f"{len(self)} batches"


class Doubling(DataLoader):
    """A user's subclass whose own __iter__ takes DataLoader's batches and works on them."""

    def __iter__(self):
        for batch in super().__iter__():
            yield batch * 2


class OwnIterator(DataLoader):
    """...and one whose __iter__ makes its batches itself."""

    def __iter__(self):
        for start in range(0, len(self.dataset), self.batch_size):
            yield torch.tensor(self.dataset[start:start + self.batch_size])


@pytest.mark.slow  # 2 persistent workers
def test_a_subclass_keeping_dataloaders_iterator_is_watched_inside_itself(db_path):
    loader = Tagged(list(range(40)), batch_size=4, num_workers=2, persistent_workers=True)
    watched = watch(loader, name="tagged", db=db_path)
    assert watched is loader and watched.describe() == "10 batches"
    epochs = [[int(b.sum()) for b in watched] for _ in range(2)]
    assert epochs[0] == epochs[1] == [sum(range(i, i + 4)) for i in range(0, 40, 4)]
    run = RunStore(db_path).list_runs()[0]
    deadline = time.monotonic() + 10
    while len(RunStore(db_path).batches(run.id)) < 20 and time.monotonic() < deadline:
        time.sleep(0.1)  # the recorder's next flush
    rows = RunStore(db_path).batches(run.id)
    assert len(rows) == 20 and {r.worker_id for r in rows} == {0, 1}  # made by its workers
    assert {r.epoch for r in rows} == {0, 1}
    _watched[-1].close()  # (a job's end does it) its workers stop, its own iterators again
    assert "_get_iterator" not in loader.__dict__
    assert [int(b.sum()) for b in loader][:2] == [6, 22]
    loader._iterator = None


def test_a_subclass_with_its_own_iterator_is_timed_from_the_loops_side(db_path, capsys):
    loader = OwnIterator(list(range(8)), batch_size=4)
    watched = watch(loader, name="own", db=db_path)
    assert watched is not loader and [int(b.sum()) for b in watched] == [6, 22]
    assert "timed" in watched.unprobed_reason or "loop" in watched.unprobed_reason
    assert torch.equal(next(iter(loader)), torch.tensor([0, 1, 2, 3]))  # its own, untouched


def test_a_subclass_whose_iter_takes_dataloaders_batches_is_watched_inside(db_path):
    """Its __iter__ stays its own (the loop gets the doubled batches); the batches it takes
    from DataLoader's iterator come from the watcher's probed copy, with their worker."""
    loader = Doubling(list(range(16)), batch_size=4, num_workers=1)
    watched = watch(loader, name="doubling", db=db_path)
    assert watched is loader
    assert [int(b.sum()) for b in watched] == [2 * sum(range(i, i + 4)) for i in range(0, 16, 4)]
    run = _watched[-1]
    run.close()
    rows = RunStore(db_path).batches(run.run_id)
    assert len(rows) == 4 and {r.worker_id for r in rows} == {0} and rows[0].fetch_s is not None
