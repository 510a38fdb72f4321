"""in_order=False (tune/order.py): tried where a heavy tail of batch times can hold the loop back,
recommended only when it measures faster beyond its noise, never where the job keeps its order;
and carried by the snippet, the settings, the page's controls."""

import dataclasses
import json
import os
import statistics
import subprocess
import sys

import pytest

from dataloader_tuner.config import LoaderConfig
from dataloader_tuner.settings import recommended_config, tuned_values
from dataloader_tuner.tune import order
from dataloader_tuner.tune.claim import comparable
from dataloader_tuner.tune.same_settings import same_settings
from dataloader_tuner.dashboard.jobs import controls_from_settings, settings_from_controls
from tests.real.plain_loop import plain_rate

from .conftest import ROOT, dataset_path
from .test_tuner import trial

PICK = LoaderConfig(batch_size=4, num_workers=4, prefetch_factor=4)


def test_it_is_tried_only_for_a_heavy_tail_the_loop_waits_on():
    tail = [trial(4, 500.0, cv=2.5), trial(4, 520.0, cv=3.0)]
    assert order.worth_trying(tail, PICK, False, "2.13.0") == (True, None)
    assert order.worth_trying([trial(4, 500.0, cv=0.3)], PICK, False, "2.13.0") == (False, None)
    busy = [trial(4, 500.0, cv=2.5, idle=0.0)]  # the loop never waits: order costs nothing
    assert order.worth_trying(busy, PICK, False, "2.13.0") == (False, None)
    one_worker = LoaderConfig(batch_size=4, num_workers=1)
    assert order.worth_trying(tail, one_worker, False, "2.13.0") == (False, None)


def test_a_job_that_keeps_its_order_or_an_old_torch_is_told_why_not():
    tail = [trial(4, 500.0, cv=2.5)]
    tried, why = order.worth_trying(tail, PICK, True, "2.13.0")
    assert not tried and "you asked to keep the order" in why
    tried, why = order.worth_trying(tail, PICK, False, "2.5.1")
    assert not tried and "torch 2.5.1 does not have it" in why


def test_it_is_recommended_only_beyond_its_noise():
    ordered = [trial(4, 400.0, rate_ci=0.05), trial(4, 420.0, rate_ci=0.05)]
    faster = [trial(4, 800.0, rate_ci=0.05, in_order=False),
              trial(4, 790.0, rate_ci=0.05, in_order=False)]
    chosen, reason = order.decide(ordered, faster)
    assert chosen and reason.startswith("in_order=False: 795 samples/s out of order against "
                                        "410 in order")
    assert "keep in_order=True (tune --keep-order)" in reason
    alike = [trial(4, 415.0, rate_ci=0.05, in_order=False),
             trial(4, 425.0, rate_ci=0.05, in_order=False)]
    chosen, reason = order.decide(ordered, alike)
    assert not chosen and "did not pay beyond its noise" in reason
    chosen, reason = order.decide(ordered, [faster[0], None])
    assert not chosen and "no steady state" in reason


def test_the_choice_travels_with_the_settings_and_the_page():
    values = tuned_values({"num_workers": 4, "prefetch_factor": 4, "in_order": False})
    assert values["in_order"] is False
    assert tuned_values({"num_workers": 0, "in_order": False})["in_order"] is True
    config = recommended_config(LoaderConfig(batch_size=4), values)
    assert "in_order=False" in config.snippet()
    assert not same_settings(config, config.replace(in_order=True))
    searched = [dataclasses.replace(trial(4, 400.0), prefetch_factor=4, batch_size=4)]
    assert comparable(searched, config) == []  # an in-order trial is not this setting's
    controls = {"num_workers": 4, "pin_memory": False, "prefetch_factor": 4,
                "persistent_workers": False, "batch_size": 4,
                **{k: v for k, v in controls_from_settings(
                    {"num_workers": 4, "in_order": False}).items() if k == "in_order"}}
    assert controls["in_order"] is False
    assert settings_from_controls(controls)["in_order"] is False
    assert "in_order" not in settings_from_controls({**controls, "in_order": True})


@pytest.mark.slow  # ~90 s: a real tune, then plain loops
@pytest.mark.host_speed  # the tune and the plain loops run at different moments
def test_a_tune_recommends_it_where_plain_loops_confirm_it(tmp_path):
    """One sample in 200 takes 0.4 s: in order, the batches after it wait; the tune finds
    in_order=False faster, and plain DataLoader loops with its settings agree."""
    target = dataset_path("tail_heavy.py")
    run = subprocess.run(
        [sys.executable, "-m", "dataloader_tuner", "tune", target,
         "--max-workers", "4", "--json", "--db", str(tmp_path / "runs.sqlite")],
        capture_output=True, text=True, cwd=ROOT, env=dict(os.environ, PYTHONPATH=ROOT),
        timeout=400)
    doc = json.loads(run.stdout)
    assert doc["status"] == "ok", doc.get("error")
    recommended = doc["recommended"]
    assert recommended.get("in_order") is False, doc["reasons"]
    assert "in_order=False" in doc["snippet"]
    assert any(t["phase"] == "out_of_order" and t["in_order"] is False for t in doc["trials"])
    settings = {k: v for k, v in recommended.items() if k != "in_order"}
    gains = []
    for pair in range(2):
        rates = {}
        for keep in ((True, False) if pair % 2 == 0 else (False, True)):
            rates[keep] = plain_rate(target, 3.0, in_order=keep, **settings)["samples_per_s"]
        gains.append(rates[False] / rates[True])
    assert statistics.median(gains) > 1.2, gains


def test_a_job_that_keeps_its_order_gets_it_back_even_from_its_own_settings():
    from dataloader_tuner.child.claiming import delivery_order as _delivery_order
    from dataloader_tuner.tune.recommend import Recommendation
    from dataloader_tuner.tune.tuner import TuneOutcome

    from .test_tuner import limits

    rec = Recommendation({"num_workers": 4, "prefetch_factor": 4}, 500.0, 5.0, ("picked 4",))
    outcome = TuneOutcome([trial(4, 500.0, cv=3.0)], None, rec, limits())
    own = PICK.replace(in_order=False)  # the job's own setting, measured by nothing here
    final, kept = _delivery_order(None, own, outcome, True)
    assert final.in_order and kept.recommendation.kwargs["in_order"] is True
    assert kept.recommendation.reasons[-1] == ("in_order=True: you asked to keep the batches in "
                                               "order.")
