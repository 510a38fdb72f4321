"""The trainers that build the DataLoader themselves, watched in one line with their own
packages: accelerate's prepared loader and the Hugging Face Trainer (tiny models from local
configs; nothing downloaded). Each runs as a real training script, and the figures are checked
against the loop's own clock."""

import json
import os
import subprocess
import sys
import time

import pytest
import torch
from torch.utils.data import DataLoader

import streamlit as st
from streamlit.testing.v1 import AppTest

from dataloader_tuner import RunStore, watch
from dataloader_tuner.watcher.loader import _watched

from .conftest import ROOT
from .test_app import WATCHED_SCRIPT


def script(name: str, *args: str) -> dict:
    job = subprocess.run([sys.executable, os.path.join(ROOT, "tests", "trainers", name), *args],
                         cwd=ROOT, capture_output=True, text=True, timeout=300,
                         env=dict(os.environ, PYTHONPATH=ROOT, HF_HUB_OFFLINE="1"))
    assert job.returncode == 0, job.stderr[-3000:]
    return json.loads(job.stdout.strip().splitlines()[-1])


def runs_by_label(db_path: str) -> dict:
    return {run.label: run for run in RunStore(db_path).list_runs()}


@pytest.mark.slow  # two training scripts with 2 workers each
def test_accelerate_prepared_loader_is_watched_with_its_workers(db_path):
    """``watch(accelerator.prepare(loader))`` gives the job its DataLoaderShard back, the same
    batches in the same order, and the run the workers' figures; its input wait (each
    epoch's start-up and the end the shard waits for before its last batch) agrees with the
    loop's own clock within 2 points."""
    plain = script("accelerate_loop.py", db_path, "--unwatched")
    watched = script("accelerate_loop.py", db_path)
    assert watched["type"] == "DataLoaderShard"
    assert watched["received"] == plain["received"]
    run = runs_by_label(db_path)["train"]
    doc = run.result.to_dict()
    assert run.framework == "accelerate" and doc["batches"] == 48 and doc["epochs"] == 2
    assert sorted(w["id"] for w in doc["workers"]) == [0, 1]
    assert all(w["busy_frac"] and w["batches"] == 24 for w in doc["workers"])
    assert abs(doc["input_wait"]["share"] - watched["wait_share"]) <= 0.02, (
        doc["input_wait"], watched)


@pytest.mark.slow  # a real Trainer run: 2 epochs, 2 evaluations
def test_hugging_face_trainer_loaders_are_watched_in_one_line(db_path, tmp_path, monkeypatch):
    loop = script("hf_trainer.py", db_path, str(tmp_path / "out"))
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
    monkeypatch.setenv("DLTUNER_DB", db_path)
    st.cache_resource.clear()
    at = AppTest.from_string(WATCHED_SCRIPT, default_timeout=60).run()
    assert not at.exception
    assert list(at.dataframe[0].value["built by"]) == ["Hugging Face Trainer"] * 2
    assert "(built by the Hugging Face Trainer)" in " ".join(m.value for m in at.markdown)
    st.cache_resource.clear()


class Tagged(DataLoader):
    """A user's subclass that adds to the loader and keeps DataLoader's iterator."""

    def describe(self) -> str:
        return f"{len(self)} batches"


class OwnIterator(DataLoader):
    def __iter__(self):
        for batch in super().__iter__():
            yield batch


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
