"""Finished results are typed and keep the JSON contract: built from recorded runs, written as
the documents the CLI prints, read back (also from older saved documents) as they were."""

import json

import pytest

from dataloader_tuner import protocol
from dataloader_tuner.config import LoaderConfig
from dataloader_tuner.analyse.diagnostic import Diagnostic
from dataloader_tuner.run.live import LiveRun
from dataloader_tuner.analyse.results import (PROFILE_KEYS, TUNE_KEYS, ProfileResult, TuneResult,
                            result_from_dict)
from dataloader_tuner.settings import recommended_config, recommended_settings, settings_file
from dataloader_tuner.store import RunStore
from tests.replay import load


def folded(name: str) -> LiveRun:
    """A recorded run's events folded as the runner folds them."""
    events, meta = load(name)
    live = LiveRun(meta["request"]["target"])
    for doc in events:
        live.apply(protocol.from_wire(doc))
    return live


def test_a_profile_result_round_trips_through_its_json_document():
    result = folded("small_map-profile").result("ok")
    assert isinstance(result, ProfileResult)
    doc = json.loads(json.dumps(result.to_dict()))
    assert tuple(doc) == tuple(k for k in PROFILE_KEYS if k not in ("error", "run_id"))
    assert doc["samples_per_s"] == result.samples_per_s > 0
    assert doc["workers"] and doc["system"]["cpus_usable"] >= 1
    back = ProfileResult.from_dict(doc)
    assert back == result
    assert all(isinstance(w, Diagnostic) for w in back.warnings)


def test_a_tune_result_carries_the_recommendation_and_round_trips():
    result = folded("small_map-tune").result("ok")
    assert isinstance(result, TuneResult) and result.status == "ok"
    assert result.recommended["num_workers"] in (0, 1, 2)
    assert result.headline_samples_per_s == result.expected_samples_per_s > 0
    doc = json.loads(json.dumps(result.to_dict()))
    assert tuple(doc) == tuple(k for k in TUNE_KEYS if k in doc)
    assert TuneResult.from_dict(doc) == result
    assert settings_file(result)["dataloader_kwargs"] == result.recommended


def test_a_tune_without_a_recommendation_is_an_error_that_says_so():
    live = folded("small_map-tune")
    live.tune_document = None
    result = live.result("ok")
    assert result.failed and result.error.type == "tune_incomplete"
    assert result.to_dict()["recommended"] is None


def test_a_failed_run_keeps_its_typed_error_in_the_document():
    result = folded("getitem_raises-profile").result("error")
    assert result.failed and result.error.type and result.error_message
    assert result.to_dict()["error"] == result.error.to_dict()


def test_documents_saved_by_older_versions_still_read():
    old = {"status": "ok", "target": "data.py", "samples_per_s": 12.5, "batches": 3,
           "warnings": [{"code": "retired_code", "message": "kept as saved"}]}
    result = result_from_dict("profile", old)
    assert result.samples_per_s == 12.5 and result.system is None and result.workers == ()
    assert result.warnings[0].code == "retired_code" and result.warnings[0].severity == "warning"
    with pytest.raises(ValueError, match="unknown diagnostic code"):
        Diagnostic.from_dict(old["warnings"][0])  # new diagnostics are still checked
    assert isinstance(result_from_dict("tune", {"status": "error", "target": "x"}), TuneResult)


def test_the_store_gives_back_typed_runs(tmp_path):
    store = RunStore(str(tmp_path / "runs.sqlite"))
    result = folded("small_map-profile").result("ok")
    run_id = store.create_run("profile", result.target, {})
    assert store.get_run(run_id).result is None  # still running
    store.finish_run(run_id, "ok", result, None)
    saved = store.get_run(run_id)
    assert saved.result == result and saved.samples_per_s == result.samples_per_s
    listed = store.list_runs()[0]
    assert listed.to_dict()["summary"] == result.to_dict() and listed.config is None


@pytest.mark.parametrize("recommended", [
    {"num_workers": 0},
    {"num_workers": 2, "pin_memory": True},
    {"num_workers": 3, "prefetch_factor": 4, "persistent_workers": True, "batch_size": 64},
])
def test_settings_and_config_follow_one_rule(recommended):
    base = {"batch_size": 32, "num_workers": 4, "prefetch_factor": 8,
            "persistent_workers": True, "shuffle": True}
    from_settings = LoaderConfig.from_settings(recommended_settings(base, recommended))
    from_config = recommended_config(LoaderConfig.from_settings(base), recommended)
    assert from_settings == from_config
    assert from_config.shuffle  # the user's other settings stay


def test_copy_times_without_batch_sizes_give_no_rate_not_a_crash():
    """Sizes are read on some batches only: copies timed on batches none of which had its bytes
    read still give their times (once, this divided by None)."""
    from dataloader_tuner.analyse import run_results

    from .records import make_batches

    timed = [b._replace(nbytes=None) for b in make_batches(20, h2d_ms=2.0)]
    transfer = run_results._transfer(timed)
    assert transfer is not None and transfer["copy_ms"]["p50"] == 2.0
    assert transfer["gb_per_s"] is None
    sized = run_results._transfer(make_batches(20, h2d_ms=2.0))  # 4096 bytes in 2 ms
    assert sized is not None and sized["gb_per_s"] == pytest.approx(4096 / 1e9 / 0.002)
