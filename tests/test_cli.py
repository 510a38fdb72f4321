"""The CLI as a user runs it: a real process, real JSON on stdout, real exit codes."""

import json
import re
import os
import subprocess
import sys

import pytest
import torch

from .conftest import ROOT, dataset_path


def cli(*args, db, env_extra=None):
    env = dict(os.environ, PYTHONPATH=ROOT, **(env_extra or {}))
    return subprocess.run([sys.executable, "-m", "dataloader_tuner", *args, "--db", db],
                          capture_output=True, text=True, env=env, cwd=ROOT, timeout=120)


# Where a CUDA GPU is visible the engine times copies; elsewhere it says why it could not.
GPU = torch.cuda.is_available()

REQUIRED = {"status", "config", "samples_per_s", "batches", "batch_latency_ms", "workers",
            "consumer_idle_frac", "input_wait", "transfer", "system", "warnings"}


def test_profile_json_is_one_document_with_the_contract(db_path):
    result = cli("profile", dataset_path("small_map.py"), "--num-workers", "1", "--seconds",
                 "1.5", "--json", db=db_path)
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)  # exactly one document: json.loads rejects trailing data
    assert REQUIRED <= doc.keys()
    assert doc["status"] == "ok" and doc["config"]["num_workers"] == 1
    assert set(doc["batch_latency_ms"]) >= {"p50", "p95", "max"}
    assert {"id", "pid", "busy_frac", "cpu_percent", "rss_mb", "batches"} <= doc["workers"][0].keys()
    if GPU:
        assert doc["transfer"]["copy_ms"]["p50"] > 0 and doc["not_measured"] is None
    else:
        assert doc["transfer"] is None and doc["not_measured"]


@pytest.mark.slow  # 3.5 s: the quick loop has the text mode's failure and --json's contract
def test_profile_text_and_the_runs_listing(db_path):
    result = cli("profile", dataset_path("with_step.py"), "--seconds", "1", db=db_path)
    assert result.returncode == 0, result.stderr
    assert "samples/s" in result.stdout and "input wait: " in result.stdout
    # (what the share is of: its denominator said, issue 66)
    assert "s: each epoch from its iter() to its last batch's step" in result.stdout
    assert "epoch start-up: " in result.stdout and "steady state: the loop waited" in result.stdout
    assert ("host-to-device copy: p50 " if GPU else "GPU: not measured: ") in result.stdout
    listing = cli("runs", "--json", db=db_path)
    runs = json.loads(listing.stdout)["runs"]
    assert len(runs) == 1 and runs[0]["status"] == "ok"
    assert "with_step.py" in cli("runs", db=db_path).stdout


def test_failed_dataset_exits_1_with_an_error_document(db_path):
    result = cli("profile", dataset_path("factory_raises.py"), "--json", db=db_path)
    assert result.returncode == 1
    doc = json.loads(result.stdout)
    assert doc["status"] == "error"
    assert doc["error"]["type"] == "target_factory_error"
    assert "FileNotFoundError" in doc["error"]["message"] and doc["error"]["details"]


def test_failed_dataset_text_mode_shows_headline_first(db_path):
    result = cli("profile", dataset_path("missing_import.py"), db=db_path)
    assert result.returncode == 1
    assert result.stdout.startswith("ERROR: Importing")
    assert "definitely_not_installed_pkg" in result.stdout


def test_bad_usage_exits_2_and_rejected_settings_exit_1(db_path):
    assert cli("profile", dataset_path("small_map.py"), "--num-workers", "-3", db=db_path).returncode == 2
    invalid = cli("profile", dataset_path("small_map.py"), "--prefetch-factor", "2", "--json",
                  db=db_path)
    assert invalid.returncode == 1  # settings DataLoader rejects: a failure, not bad usage
    assert "prefetch_factor only applies" in json.loads(invalid.stdout)["error"]["message"]
    assert cli("frobnicate", db=db_path).returncode == 2


@pytest.mark.slow  # 6.6 s: a real tune (the quick loop has the dashboard's, replayed)
def test_tune_json_recommends_and_writes_a_loadable_settings_file(db_path, tmp_path):
    from torch.utils.data import DataLoader

    from dataloader_tuner import load_settings

    out = tmp_path / "settings.json"
    result = cli("tune", dataset_path("small_map.py"), "--max-workers", "2", "--budget-s", "20",
                 "--json", "--out", str(out), db=db_path)
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["status"] == "ok"
    assert {"num_workers", "pin_memory", "batch_size"} <= doc["recommended"].keys()
    assert doc["recommended"]["pin_memory"] is False  # no GPU here
    assert doc["expected_samples_per_s"] > 0 and doc["baseline"]["samples_per_s"] > 0
    speedup = doc["baseline"]["speedup"]  # (None: the end's claim too wide to state)
    assert speedup is None or speedup == (doc["expected_samples_per_s"]
                                          / doc["baseline"]["samples_per_s"])
    assert len(doc["trials"]) >= 2 and all(t["samples_per_s"] > 0 for t in doc["trials"])
    assert doc["reasons"] and any("no GPU" in r for r in doc["reasons"])
    assert "num_workers=" in result.stderr  # progress lines went to stderr
    settings = load_settings(str(out))
    assert os.stat(out).st_mode & 0o777 == 0o600  # its owner's only (access.py)
    from tests.datasets.small_map import SmallMap

    assert len(list(DataLoader(SmallMap(), **settings))) > 0
    saved = json.loads(cli("runs", "--json", db=db_path).stdout)["runs"][0]
    assert saved["kind"] == "tune" and saved["summary"]["recommended"] == doc["recommended"]


@pytest.mark.slow  # a real tune: the JSON one covers the command in the quick loop
def test_tune_text_prints_the_code_line(db_path):
    result = cli("tune", dataset_path("small_map.py"), "--max-workers", "1", "--budget-s", "10",
                 db=db_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("DataLoader(dataset, batch_size=4")
    assert "expected:" in result.stdout
    assert re.search(r"tuned in [\d.]+ s over \d+ trials .*, [\d.]+x the ~\d+ s floor",
                     result.stdout), result.stdout


@pytest.mark.slow  # ~3 s: the same target errors as profile's (test_diagnostics)
def test_tune_bad_target_exits_1(db_path):
    result = cli("tune", dataset_path("two_classes.py"), "--json", db=db_path)
    assert result.returncode == 1
    assert json.loads(result.stdout)["error"]["type"] == "target_ambiguous"


@pytest.mark.host_speed  # its oversubscription warning needs the workers' CPU over their time
@pytest.mark.slow  # a real tune, then a profile of its file
def test_profile_of_a_settings_file_keeps_its_settings_and_trusts_its_worker_count(db_path,
                                                                                    tmp_path):
    """A tune's settings file profiled as is: no warning contradicts the count it measured."""
    settings = tmp_path / "settings.json"
    settings.write_text(json.dumps({"dataloader_kwargs": {"batch_size": 4, "num_workers": 3},
                                    "reasons": ["measured"]}))
    cpu_heavy = os.path.join(ROOT, "examples", "cpu_bound.py")
    trusted = cli("profile", cpu_heavy, "--settings", str(settings), "--seconds", "2", "--json",
                  db=db_path)
    doc = json.loads(trusted.stdout)
    assert doc["config"]["num_workers"] == 3 and doc["config"]["batch_size"] == 4
    assert "more_workers_than_cpus" not in {w["code"] for w in doc["warnings"]}
    # The same count, not known to pay: flagged. (--no-stacks: with the stack sampler on, the
    # CPU share these 3 workers' fetches read on 2 CPUs fell under the rule's 50% (81% off);
    # not yet understood, in the 2026-11-26 note.)
    untuned = cli("profile", cpu_heavy, "--num-workers", "3", "--batch-size", "4", "--seconds",
                  "2", "--no-stacks", "--json", db=db_path)
    assert "more_workers_than_cpus" in {w["code"] for w in json.loads(untuned.stdout)["warnings"]}
    missing = cli("profile", cpu_heavy, "--settings", str(tmp_path / "nope.json"), db=db_path)
    assert missing.returncode == 1 and "Cannot read the settings file" in missing.stdout


@pytest.mark.slow  # 3 s
def test_batch_size_none_from_the_command_line(db_path):
    result = cli("profile", dataset_path("stream.py"), "--batch-size", "none", "--seconds", "1",
                 "--json", db=db_path)
    doc = json.loads(result.stdout)
    assert doc["status"] == "ok" and doc["config"]["batch_size"] is None
    assert doc["counting"]["samples"].startswith("batch_size=None")
    # Items this fast have their making timed on a sample, and the output says on how many.
    timed_on = doc["counting"]["making_timed_on"]
    assert "% of batches (" in timed_on and "every 16th" in timed_on, timed_on


def test_the_parent_side_does_not_import_torch():
    """The CLI parent and the dashboard server only start and read runs: torch (seconds to
    import, hundreds of MB) stays in the engine's child process."""
    code = ("import sys\n"
            "import dataloader_tuner, dataloader_tuner.cli.main, dataloader_tuner.dashboard.jobs, "
            "dataloader_tuner.dashboard.live_page, dataloader_tuner.dashboard.history_page, "
            "dataloader_tuner.protocol, dataloader_tuner.settings, dataloader_tuner.system, "
            "dataloader_tuner.run.runner, dataloader_tuner.run.live, dataloader_tuner.store, "
            "dataloader_tuner.analyse.run_results, dataloader_tuner.analyse.text, "
            "dataloader_tuner.run.verify\n"
            "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.')))\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            cwd=ROOT, env=dict(os.environ, PYTHONPATH=ROOT), timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


SHM_64MB = {"DATALOADER_TUNER_SHM_MB": "64"}  # a container's default /dev/shm, rehearsed


@pytest.mark.slow  # a real run with 2 workers; the page's check before Start is in test_app
def test_a_run_whose_batches_would_not_fit_in_shm_is_warned_as_it_starts(db_path):
    """16 MB batches x 2 workers x prefetch 2 = 64 MB, all of a rehearsed 64 MB /dev/shm."""
    result = cli("profile", dataset_path("big_samples.py"), "--num-workers", "2", "--seconds",
                 "2", "--json", db=db_path, env_extra=SHM_64MB)
    assert result.returncode == 0, result.stderr
    before = [line for line in result.stderr.splitlines() if "[shm_too_small]" in line]
    assert before and "sample 0 x batch_size" in before[0] and "will die" in before[0]
    doc = json.loads(result.stdout)
    found = [w for w in doc["warnings"] if w["code"] == "shm_too_small"]
    assert found and found[0]["evidence"]["will_not_fit"]
    assert not found[0]["evidence"]["estimated"]  # the batches measured, once they came
    assert found[0]["evidence"]["in_flight_mb"] == pytest.approx(64.0, rel=0.01)


@pytest.mark.slow  # a real tune
def test_the_tuner_never_picks_more_workers_than_shm_holds(db_path):
    result = cli("tune", dataset_path("big_samples.py"), "--max-workers", "4", "--budget-s",
                 "15", "--json", db=db_path, env_extra=SHM_64MB)
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    workers = doc["recommended"]["num_workers"]
    prefetch = doc["recommended"].get("prefetch_factor") or 2
    assert workers * prefetch * 16 <= 32  # half of the 64 MB, the tuner's share
    assert not any(t["num_workers"] > 1 and t["phase"] in ("search", "confirm")
                   for t in doc["trials"])  # the cap stopped the search
    cap = doc["limits"]["memory_max_workers"]  # 0 or 1 as /dev/shm's own use leaves room
    assert cap in (0, 1) and workers <= cap
    assert any("Memory allows at most" in r for r in doc["reasons"])


@pytest.mark.host_speed  # its last trial's teardown within 1.5 s of the limit
@pytest.mark.slow  # a real tune of ~4 s: the limit's logic is in the quick loop (test_tuner)
def test_a_tune_with_a_time_limit_keeps_to_it_and_says_what_it_did_not_reach(db_path):
    """The plan is said before the first trial; the limit is hard, the end's claim included;
    the pick's first line says the predicted count was not measured."""
    result = cli("tune", dataset_path("slow_batches.py"), "--budget-s", "3", "--json",
                 db=db_path)
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    progress = result.stderr.splitlines()
    plan_line = next(i for i, line in enumerate(progress) if "this tune needs ~" in line)
    first_trial = next(i for i, line in enumerate(progress) if "num_workers=" in line)
    assert plan_line < first_trial and "will cut it short" in progress[plan_line]
    assert doc["tuning_seconds"] < 3 + 1.5, doc["tuning_seconds"]  # shutting the last down
    assert doc["reasons"][0].startswith("Not the predicted best: your 3 s time limit"), \
        doc["reasons"][0]
    assert doc["plan"]["budget_s"] == 3 and doc["plan"]["announced_s"] > 3
    assert doc["baseline"]["speedup"] is None or doc["baseline"]["speedup"] == 1.0


@pytest.mark.host_speed  # the first plan's aim against the tune's time
@pytest.mark.slow  # a real tune of ~100 s: its batches take ~1 s
def test_a_tune_of_slow_batches_takes_the_time_it_aims_at(db_path):
    """NOTE [ A tune's aim ]: ~1 s batches that wait (more workers pay up to the 4 allowed):
    the whole plan is minutes; the tune says the time it aims at and its whole plan's, takes
    what it said (within 25%), measures the count its model predicts, and from its claim's
    one pair, in the tune's process only, states the figures without a claim (NOTE [ A claim
    from two processes ]); what it left out, a reason says."""
    result = cli("tune", dataset_path("second_batches.py"), "--max-workers", "4", "--json",
                 db=db_path)
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    made = doc["plan"]
    line = next(line for line in result.stderr.splitlines() if "this tune aims at ~" in line)
    assert "runs it)" in line and made["whole_plan_s"] > 1.3 * made["aim_s"], (line, made)
    assert 0.75 < doc["tuning_seconds"] / made["announced_s"] < 1.25, (doc["tuning_seconds"],
                                                                       made)
    assert made["predicted_workers"] == 4 and doc["recommended"]["num_workers"] == 4
    baseline = doc["baseline"]
    if baseline["speedup"] is None:  # one pair: the second did not fit in the aim
        found = re.search(r"\(([\d.]+)x\) in the tune's process only", baseline["speedup_note"])
        assert found and float(found.group(1)) > 2.5, baseline
    else:  # both pairs fitted, one in each process
        assert baseline["speedup"] > 2.5 and "in two processes" in baseline["claimed_from"]
    assert not any("time limit" in r for r in doc["reasons"]), doc["reasons"]
    # the predicted count's neighbour measured, or its absence said
    measured = {t["num_workers"] for t in doc["trials"]}
    assert 3 in measured or any(r.startswith("The tune aimed at ~") for r in doc["reasons"])


@pytest.mark.host_speed  # an early estimate against the whole tune's time
@pytest.mark.slow  # a real tune of ~13 s
def test_a_tune_of_fast_batches_ends_within_what_it_announced(db_path):
    # ~0.045 ms batches, the module's 2 workers against 0: its 1-worker trials run to the trial
    # clock's 4 s cap (NOTE [ A budget in batches ]); announced at most ~5 s before, took 12-15
    noisy = os.path.join(os.path.dirname(__file__), "real", "noisy_worker.py")
    result = cli("tune", noisy, "--json", db=db_path)
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    made = doc["plan"]
    assert made["announced_s"] <= made["announced_at_most_s"], made
    # the at most is kept (NOTE [ An at most that holds ]), the checks after the claim counted
    assert doc["tuning_seconds"] <= made["announced_at_most_s"], (doc["tuning_seconds"], made)
    assert made["at_most_s"] <= made["announced_at_most_s"]  # never raised after the probes
    # NOTE [ The floor ]: the least any tune of it takes, under what this one took
    assert 0 < made["floor_s"] < doc["tuning_seconds"], (made, doc["tuning_seconds"])


@pytest.mark.host_speed  # the first batch's estimate against the tune's time
@pytest.mark.slow  # a real tune of ~25 s
def test_a_tune_without_a_limit_measures_the_count_its_model_predicts(db_path):
    result = cli("tune", dataset_path("slow_batches.py"), "--max-workers", "6", "--json",
                 db=db_path)
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    predicted = doc["plan"]["predicted_workers"]
    assert predicted == 6  # waiting work: as many workers as allowed
    assert predicted in {t["num_workers"] for t in doc["trials"]}
    assert doc["recommended"]["num_workers"] >= 5
    assert not any("time limit" in r for r in doc["reasons"])
    # announced before it was spent, and not far off
    assert 0.4 < doc["plan"]["announced_s"] / doc["tuning_seconds"] < 2.5, doc["plan"]


def test_fast_fetches_at_0_workers_read_their_cpu(db_path):
    """NOTE [ A fetch's CPU, read finely ] (instrument/probes.py): with the sampler's CPU timer
    armed in the main process, its CPU clock moves in 4 ms ticks; 0.5 ms fetches read 0.0 of
    CPU, and the profile named "overlap the waits for storage" for a dataset that only spins."""
    result = cli("profile", dataset_path("fast_spins.py"), "--num-workers", "0", "--seconds",
                 "2", "--json", db=db_path)
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    per_batch = doc["per_batch"]
    assert per_batch["fetch_cpu_ms"] >= 0.6 * per_batch["fetch_ms"], per_batch
    assert "overlap the waits for storage" not in [f["fix"] for f in doc["fixes"]], doc["fixes"]


@pytest.mark.parametrize("command", ["profile", "tune"])
@pytest.mark.parametrize("flag, value, said", [
    ("--timeout-s", "-1", "must be > 0, got -1.0"),  # (once taken: a run that failed at once)
    ("--timeout-s", "soon", "invalid positive_float value: 'soon'"),
    ("--batch-size", "0", "must be >= 1, got 0"),
    ("--step-ms", "-2", "must be >= 0, got -2.0"),
])
def test_a_bad_number_is_refused_with_what_it_must_be(command, flag, value, said, capsys):
    from dataloader_tuner.cli.main import build_parser

    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args([command, "data.py", flag, value])
    assert exited.value.code == 2 and f"argument {flag}: {said}" in capsys.readouterr().err
