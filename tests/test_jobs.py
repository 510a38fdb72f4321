"""The dashboard's job board and before/after verification, with real runs (no Streamlit)."""

import pytest

from dataloader_tuner.dashboard.jobs import (
    LIVE_WINDOW_BATCHES,
    Jobs,
    controls_from_settings,
    request_from_controls,
    tune_request,
    verification_requests,
)
from dataloader_tuner.dashboard.live_page import CONTROL_DEFAULTS
from dataloader_tuner import RunStore
from dataloader_tuner.run import runner
from dataloader_tuner.settings import recommended_settings
from dataloader_tuner.run.live import LiveRun
from dataloader_tuner.run.verify import Verification

from .conftest import dataset_path
from .records import make_batches
from .replay import replayed_starter


def controls(**changes):
    return {**CONTROL_DEFAULTS, **changes}


def test_controls_become_a_request():
    request = request_from_controls("t.py", controls(num_workers=0, prefetch_factor=4,
                                                     persistent_workers=True, consumer="none"))
    assert request.settings["prefetch_factor"] is None
    assert not request.settings["persistent_workers"]
    assert request.step_ms == 0.0  # "none": no consumer even if the module has a train_step
    sim = request_from_controls("t.py", controls(num_workers=2, consumer="simulated", step_ms=7))
    assert sim.step_ms == 7.0 and sim.settings["prefetch_factor"] == 2
    assert request_from_controls("t.py", controls(consumer="train_step")).step_ms is None


def test_tune_reports_against_the_controls_settings():
    request = tune_request("t.py", controls(num_workers=3, budget_s=12, max_workers=8))
    assert request.kind == "tune" and request.budget_s == 12 and request.max_workers == 8
    assert request.settings["num_workers"] == 3  # the baseline is the settings it starts from
    assert request.local_world_size == 1
    node = tune_request("t.py", controls(local_world_size=4))  # "Ranks on this machine"
    assert node.local_world_size == 4


def test_self_batching_control_sends_batch_size_none():
    request = request_from_controls("t.py", controls(self_batching=True, batch_size=64))
    assert request.settings["batch_size"] is None
    assert controls_from_settings({"batch_size": None, "num_workers": 2})["self_batching"]


def test_controls_follow_the_module_settings():
    values = controls_from_settings({"batch_size": 16, "num_workers": 3, "prefetch_factor": 4,
                                     "persistent_workers": True, "shuffle": True})
    assert values == {"batch_sampler": False, "self_batching": False, "batch_size": 16,
                      "num_workers": 3,
                      "pin_memory": False, "prefetch_factor": 4, "persistent_workers": True,
                      "in_order": True, "one_thread": False, "keep_freed": False}


def test_recommended_settings_reset_what_the_tuner_left_out():
    base = {"batch_size": 16, "num_workers": 4, "prefetch_factor": 8, "persistent_workers": True}
    settings = recommended_settings(base, {"num_workers": 2, "pin_memory": False})
    assert settings["num_workers"] == 2 and settings["prefetch_factor"] is None
    assert not settings["persistent_workers"] and settings["batch_size"] == 16
    assert recommended_settings(base, {"num_workers": 0})["prefetch_factor"] is None
    tuned = tune_request("t.py", controls(num_workers=4))
    before, after = verification_requests(tuned, {"num_workers": 1}, 2.0)
    assert before.kind == after.kind == "verify" and before.seconds == 2.0
    assert before.settings["num_workers"] == 4 and after.settings["num_workers"] == 1


def test_live_view_of_a_long_run_is_its_recent_window():
    live = LiveRun("t.py")
    live.batches = make_batches(LIVE_WINDOW_BATCHES + 500)
    live.resources = [{"t": 0.0, "pid": 1, "role": "main", "worker_id": None,
                       "cpu_percent": 1.0, "rss_mb": 1.0},
                      {"t": 1e9, "pid": 1, "role": "main", "worker_id": None,
                       "cpu_percent": 2.0, "rss_mb": 2.0}]
    recent = live.recent(LIVE_WINDOW_BATCHES)
    assert len(recent.batches) == LIVE_WINDOW_BATCHES and recent.warmup_batches == 1
    assert recent.batches[0].seq == 500 and len(recent.resources) == 1
    assert len(live.batches) == LIVE_WINDOW_BATCHES + 500  # the run itself is untouched
    assert live.recent(10**9) is live


def test_inspect_describes_or_explains(db_path, monkeypatch):
    monkeypatch.setattr(runner, "child_starter", replayed_starter())  # recorded real checks
    jobs = Jobs(RunStore(db_path))
    ok = jobs.inspect(dataset_path("small_map.py"))
    assert ok.ok and ok.dataset is not None and ok.dataset.class_name.endswith("SmallMap")
    assert jobs.inspect(dataset_path("small_map.py")) is ok  # cached while the file is unchanged
    bad = jobs.inspect(dataset_path("missing_import.py"))
    assert not bad.ok and "definitely_not_installed_pkg" in (bad.error or {})["message"]
    assert jobs.store.list_runs() == []  # checking a target is not a run


def test_one_job_at_a_time(db_path, monkeypatch):
    # A recorded 2 s run, replayed at its own pace: still going when the second starts.
    monkeypatch.setattr(runner, "child_starter", replayed_starter(pace=1.0))
    jobs = Jobs(RunStore(db_path))
    run = request_from_controls(dataset_path("small_map.py"), controls(seconds=2.0,
                                                                       num_workers=2))
    first = jobs.start_run(run)
    second = jobs.start_run(run)
    assert first.state.done and not second.state.done
    assert jobs.busy()
    jobs.stop_in_background().join(5)
    assert not jobs.busy() and second.state.value == "stopped"


def test_verification_measures_both_settings_interleaved(db_path, monkeypatch):
    """Four runs, before and after taking turns (replays of a recorded real run: the
    interleaving and the arithmetic are what is tested here)."""
    monkeypatch.setattr(runner, "child_starter", replayed_starter())
    store = RunStore(db_path)
    base = request_from_controls(dataset_path("small_map.py"), controls(seconds=1.0,
                                                                        consumer="none"))
    before, after = verification_requests(base, {"num_workers": 1}, 1.0)
    shown = []
    verification = Verification(before, after, store, rounds=2, on_run=shown.append).start()
    assert verification.wait(120) == "ok"
    result = verification.result()
    assert [arm for arm, _ in verification.runs] == ["before", "after", "before", "after"]
    assert len(shown) == 4
    assert len(result.before.samples_per_s_rounds) == 2
    assert result.speedup == pytest.approx(result.after.samples_per_s
                                           / result.before.samples_per_s)
    labels = sorted(run.label for run in store.list_runs())
    assert labels == ["after", "after", "before", "before"]


def test_verification_checks_the_claimed_speedup():
    from dataloader_tuner.run.verify import check_claim

    claim = {"speedup": 2.0, "speedup_pct": 6.0}
    assert "within the ±15% allowed" in check_claim(claim, 1.9)
    assert "more than the ±15%" in check_claim(claim, 1.4)
    assert "claimed no speedup" in check_claim({"speedup": None, "speedup_note": "too short"}, 1.2)
    assert check_claim(claim, None) is None


def test_a_module_batch_sampler_means_no_batch_size_from_the_page():
    values = controls_from_settings({"batch_sampler": "BatchSampler(...)", "num_workers": 0})
    request = request_from_controls("t.py", controls(**values))
    assert "batch_size" not in request.settings
    assert "batch_size" not in recommended_settings(request.settings, {"num_workers": 2})
