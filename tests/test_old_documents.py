"""A run history and ``--json`` documents written by an older version (commit 7ee371f, of
2026-11-23: then ``python -m engine``, before watched jobs, ranks and typed results) still read,
and read as the types today's code uses. Made by that version with:

    profile tests/datasets/small_map.py --num-workers 1 --seconds 1.5 --step-ms 2 --json --db H
    profile tests/broken/collate_raises.py --seconds 1 --json --db H
    tune tests/datasets/small_map.py --budget-s 8 --max-workers 2 --json --db H
"""

import json
import os
import shutil

import pytest

from dataloader_tuner import ProfileResult, RunStore, TuneResult
from dataloader_tuner.analyse.results import result_from_dict
from dataloader_tuner.errors import RunError
from dataloader_tuner.record.cards import Consumer, DatasetCard
from dataloader_tuner.record.trials import TrialResult
from dataloader_tuner.run.live import LiveRun

OLD = os.path.join(os.path.dirname(__file__), "fixtures", "old")


def old_json(name: str) -> dict:
    with open(os.path.join(OLD, name)) as f:
        return json.load(f)


def test_an_old_profile_document_reads_as_typed_values_and_writes_back_the_same():
    doc = old_json("profile-2026-11-23.json")
    result = result_from_dict("profile", doc)
    assert isinstance(result, ProfileResult) and result.status == "ok"
    assert isinstance(result.dataset, DatasetCard)
    assert result.dataset.class_name.endswith("SmallMap")
    assert result.consumer == Consumer("simulated", 2.0)
    assert result.samples_per_s == doc["samples_per_s"] > 0
    written = result.to_dict()
    # Everything it had is written back as it was (today's fields come as None beside it).
    assert {k: written[k] for k in doc} == doc


def test_an_old_failed_profile_keeps_its_error_as_its_class():
    doc = old_json("profile-error-2026-11-23.json")
    result = result_from_dict("profile", doc)
    assert result.failed and isinstance(result.error, RunError)
    assert result.error.type == doc["error"]["type"] == "dataset_error"
    assert result.error_message == doc["error"]["message"]
    assert result.to_dict()["error"] == doc["error"]


def test_an_old_tune_document_reads_its_trials_as_trials():
    doc = old_json("tune-2026-11-23.json")
    result = result_from_dict("tune", doc)
    assert isinstance(result, TuneResult) and result.recommended == doc["recommended"]
    assert len(result.trials) == len(doc["trials"]) > 0
    assert all(isinstance(t, TrialResult) for t in result.trials)
    assert [t.samples_per_s for t in result.trials] == [t["samples_per_s"] for t in doc["trials"]]
    for old, again in zip(doc["trials"], result.to_dict()["trials"]):
        assert {k: again[k] for k in old} == old  # each trial's figures as they were saved


def test_an_old_history_file_opens_lists_and_replays(tmp_path):
    path = str(tmp_path / "history.sqlite")
    shutil.copy(os.path.join(OLD, "history-2026-11-23.sqlite"), path)
    store = RunStore(path)  # brought to today's tables
    runs = {run.id: run for run in store.list_runs()}
    assert [runs[i].kind for i in sorted(runs)] == ["profile", "profile", "tune"]
    assert [runs[i].status for i in sorted(runs)] == ["ok", "error", "ok"]
    profile = store.get_run(1)
    assert isinstance(profile.result, ProfileResult) and profile.result.samples_per_s > 0
    assert isinstance(profile.dataset, DatasetCard)
    assert isinstance(store.get_run(2).result.error, RunError)
    tune = store.get_run(3)
    assert isinstance(tune.result, TuneResult) and tune.result.trials
    # Its batches replay into a live view whose summary agrees with the one saved
    live = LiveRun.stored(store, 1)
    assert live.consumer == Consumer("simulated", 2.0)
    assert len(live.batches) == profile.result.batches
    again = live.profile_result("ok")  # (its rows moved, to the microsecond: store/compact.py)
    assert again.samples_per_s == pytest.approx(profile.result.samples_per_s, rel=1e-6)
    assert store._conn().execute("SELECT COUNT(*) FROM batches").fetchone()[0] == 0
    listed = json.loads(json.dumps([run.to_dict() for run in store.list_runs()]))  # runs --json
    assert listed[-1]["summary"]["samples_per_s"] == profile.result.samples_per_s
