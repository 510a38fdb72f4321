"""Each page in Streamlit's AppTest (no browser).

Behind the pages, the engine's runs are replays of real runs recorded in tests/recordings
(tests/replay.py): the pages, the job board, RunHandle, LiveRun and the store all run as they
do for real, without a child process or torch, so these tests take seconds. One test also runs
for real (marked slow), and tests/test_browser.py drives the whole real stack.

AppTest does not fire ``run_every`` fragments on its own; ``settle`` re-runs the page the way
the browser's timer would until the job board is idle.
"""

import json
import os
import time
from typing import Callable

import pytest
import streamlit as st
from streamlit.testing.v1 import AppTest

from dataloader_tuner.dashboard.shared import get_jobs
from dataloader_tuner import RunRequest, RunStore, run_to_completion
from dataloader_tuner.run import runner
from dataloader_tuner.store.retention import SavedLimits
from dataloader_tuner.ui import saved_history_limits

from .conftest import ROOT, dataset_path
from .replay import replayed_starter

HISTORY_SCRIPT = "from dataloader_tuner.dashboard import history_page\nhistory_page.render()\n"


@pytest.fixture(params=["replay"])
def app_env(request, tmp_path, monkeypatch):
    """A fresh database and job board; runs replayed unless the test asks for "real"."""
    if request.param == "replay":
        monkeypatch.setattr(runner, "child_starter", replayed_starter())
    db = str(tmp_path / "runs.sqlite")
    monkeypatch.setenv("DLTUNER_DB", db)
    monkeypatch.setenv("DLTUNER_AUTOSTART", "0")
    monkeypatch.setenv("DLTUNER_TOKEN", APP_TOKEN)  # the session below enters with it
    monkeypatch.delenv("DLTUNER_NO_TOKEN", raising=False)
    monkeypatch.chdir(ROOT)
    st.cache_resource.clear()  # a fresh job board on this test's database
    yield db
    get_jobs().stop_all()
    st.cache_resource.clear()


APP_TOKEN = "the-token-of-these-tests"


def live_app() -> AppTest:
    at = AppTest.from_file(os.path.join(ROOT, "app.py"), default_timeout=90)
    at.query_params["token"] = APP_TOKEN
    return at.run()


def settle(at: AppTest, timeout_s: float = 120.0) -> AppTest:
    deadline = time.monotonic() + timeout_s
    while get_jobs().busy() and time.monotonic() < deadline:
        time.sleep(0.5)
    at.run()
    assert not get_jobs().busy(), "the job did not finish in time"
    return at.run()


def button(at: AppTest, label: str):
    return next(b for b in at.button if b.label == label)


def texts(at: AppTest) -> str:
    parts = [e.value for kind in ("markdown", "success", "info", "warning", "error", "caption")
             for e in getattr(at, kind)]
    return "\n".join(str(p) for p in parts)


def chart_titles(at: AppTest) -> list[str]:
    return [json.loads(c.proto.spec)["layout"]["title"]["text"] for c in at.get("plotly_chart")]


def set_target(at: AppTest, target: str) -> AppTest:
    at.text_input(key="target").input(target)
    return at.run()


def press(label: str, target: str, **controls) -> AppTest:
    """Open the Live page on ``target``, set controls (``ctl_`` keys without the prefix; the
    consumer first, since it enables the step input), press ``label``, wait for the job."""
    at = set_target(live_app(), target)
    if "consumer" in controls:
        at = at.radio(key="ctl_consumer").set_value(controls.pop("consumer")).run()
    for name, value in controls.items():
        at.number_input(key=f"ctl_{name}").set_value(value)
    at = at.run()
    button(at, label).click()
    return settle(at.run())


def test_live_page_opens_on_the_demo_dataset(app_env):
    at = live_app()
    assert not at.exception
    assert at.text_input(key="target").label == "Dataset module"
    assert at.text_input(key="target").value == "dataloader_tuner.demo"
    assert "FeatureDataset" in at.success[0].value
    assert "No run yet" in texts(at)
    assert button(at, "Stop").disabled and not button(at, "Start").disabled
    assert at.radio(key="ctl_consumer").value == "train_step"
    assert at.number_input(key="ctl_batch_size").value == 16  # the module's batch_size


def test_start_streams_a_run_and_shows_every_chart(app_env):
    at = set_target(live_app(), dataset_path("small_map.py"))
    at.number_input(key="ctl_seconds").set_value(2.0)
    at.number_input(key="ctl_num_workers").set_value(2)
    at = at.radio(key="ctl_consumer").set_value("simulated").run()
    at = at.number_input(key="ctl_step_ms").set_value(2.0).run()
    button(at, "Start").click()
    at = settle(at.run())
    assert not at.exception
    metrics = {m.label: m.value for m in at.metric}
    assert float(metrics["samples/s"]) > 0
    assert metrics["input-bound?"] in ("not", "moderately", "highly")
    titles = chart_titles(at)
    for name in ("Batch latency", "Worker utilization", "GPU idle gaps"):
        assert any(name in t for t in titles), (name, titles)
    page = texts(at)
    assert "Pinned-memory transfer" in page and "not measured" in page
    assert "ok" in page and "num_workers=2" in at.code[0].value
    assert get_jobs().store.list_runs()[0].status == "ok"
    # once it ended, how far this machine can go for the dataset (docs/ceiling.md)
    ceiling = get_jobs().store.list_runs()[0].result.ceiling
    assert ceiling["sentence"] in page and "What would raise the ceiling" in titles


def test_a_bad_target_shows_an_error_card_and_the_page_stays_usable(app_env):
    at = set_target(live_app(), dataset_path("syntax_error.py"))
    assert not at.exception
    assert "Syntax error" in at.error[0].value and "line 3" in at.error[0].value
    assert button(at, "Start").disabled and button(at, "Tune").disabled
    at = set_target(at, dataset_path("small_map.py"))
    assert not at.error and "SmallMap" in at.success[0].value


def test_a_failing_run_shows_the_worker_error(app_env):
    at = press("Start", dataset_path("getitem_raises.py"), num_workers=2)
    assert not at.exception
    assert at.error and "worker" in at.error[0].value.lower()
    assert get_jobs().store.list_runs()[0].status == "error"


@pytest.mark.parametrize("app_env", ["replay", pytest.param("real", marks=pytest.mark.slow)],
                         indirect=True)
def test_tune_recommends_and_apply_verifies(app_env):
    at = press("Tune", dataset_path("small_map.py"), consumer="none", max_workers=2,
               verify_seconds=1.0)
    assert not at.exception
    assert any(s.value == "Recommendation" for s in at.subheader)
    assert any("Tune: throughput against num_workers" in t for t in chart_titles(at))
    assert any(c.value.startswith("DataLoader(dataset") for c in at.code)
    assert any("announced as it started" in c.value for c in at.caption)
    tuned = get_jobs().tune_result(get_jobs().tune)
    # where the trials' time went, where any was sampled (small_map's batches are quick)
    assert ("Where the trials' time went" in [e.label for e in at.expander]) == bool(
        tuned.stacks)
    recommended = tuned.recommended
    button(at, "Apply recommended settings").click()
    at = at.run()
    assert at.number_input(key="ctl_num_workers").value == recommended["num_workers"]
    assert "Applied" in texts(at)
    at = settle(at)
    assert not at.exception
    applied = next(s.value for s in at.success if "Applied" in s.value)
    assert "with the new settings" in applied and "median of 2 runs" in applied
    assert "Throughput over time" in chart_titles(at)
    # A second tab opens on that job: its target and the applied settings, not the demo's.
    other = live_app()
    assert other.text_input(key="target").value == dataset_path("small_map.py")
    assert other.number_input(key="ctl_num_workers").value == recommended["num_workers"]
    assert "Applied to" in texts(other)


def test_a_tune_says_its_ceiling_what_would_raise_it_and_where_its_time_went(app_env):
    """A tune that learnt the cost (known_stages: 1 ms of CPU a sample, 2 CPUs): the ceiling's
    sentence, the what-if chart, and the trials' profile with its speedscope download."""
    at = press("Tune", dataset_path("known_stages.py"), consumer="none", max_workers=4)
    assert not at.exception
    tuned = get_jobs().tune_result(get_jobs().tune)
    assert tuned.ceiling["binding"] == "cpu"
    assert tuned.ceiling["sentence"] in texts(at)
    assert "What would raise the ceiling" in chart_titles(at)
    fixes = next(t.value for t in at.dataframe if "fix" in t.value.columns)
    assert any(f.startswith("cache what ") for f in fixes["fix"])  # its largest own function
    assert "Where the loader's time goes (sampled)" in chart_titles(at)
    assert "Where the trials' time went" in [e.label for e in at.expander]
    assert any("speedscope" in b.proto.label for b in at.get("download_button"))


def test_history_page_empty_then_compares_and_exports(app_env):
    at = AppTest.from_string(HISTORY_SCRIPT, default_timeout=60).run()
    assert not at.exception and "No runs saved yet" in at.info[0].value
    # its size and its limits, and how to keep it there (store/retention.py)
    assert " MB of its 4 GB limit; runs are kept 180 days after they end" in texts(at)
    store = RunStore(app_env)
    for workers in (0, 1):
        run_to_completion(RunRequest(target=dataset_path("small_map.py"), seconds=1.0,
                                     settings={"batch_size": 4, "num_workers": workers}),
                          store)
    at = AppTest.from_string(HISTORY_SCRIPT, default_timeout=60).run()
    assert not at.exception
    assert len(at.dataframe) >= 1 and len(at.selectbox) == 3
    assert {m.label for m in at.metric} >= {"samples/s", "p50 wait", "input wait"}
    titles = chart_titles(at)
    assert "Throughput over time" in titles and "Batch latency: distribution compared" in titles
    assert at.get("download_button")


def test_history_limits_are_set_on_the_page_and_kept_in_the_history(app_env):
    """NOTE [ Keeping the history within its limits ]: the page saves them in the history, where
    every job writing there reads them; the page then shows them."""
    at = AppTest.from_string(HISTORY_SCRIPT, default_timeout=60).run()
    inputs = {n.label: n for n in at.number_input}
    inputs["Size limit (GB, 0: none)"].set_value(1.5)
    inputs["Keep runs for (days after they end, 0: always)"].set_value(30.0)
    at.button[0].click().run()
    assert not at.exception
    assert saved_history_limits(app_env) == SavedLimits(1.5, 30.0)
    assert "of its 1.5 GB limit; runs are kept 30 days after they end" in texts(at)
    assert any("Saved in this history" in s.value for s in at.success)


def test_history_shows_where_a_runs_time_went(app_env):
    """The sampled stages and functions of a stored run (docs/profile.md): the icicle, the
    stage table and the functions, from the saved result alone. One run in the history is
    both sides of the comparison (their charts once shared a key: the page raised)."""
    run_to_completion(RunRequest(target=dataset_path("known_stages.py"), seconds=1.5,
                                 settings={"num_workers": 2}), RunStore(app_env))
    at = AppTest.from_string(HISTORY_SCRIPT, default_timeout=60).run()
    assert not at.exception
    assert "Where the loader's time goes (sampled)" in chart_titles(at)
    assert "Where the time goes" in texts(at)
    tables = [t.value for t in at.dataframe]
    stages = next(t for t in tables if "stage" in t.columns and "share %" in t.columns)
    assert stages["stage"].iloc[0] == "your __getitem__"
    functions = next(t for t in tables if "function" in t.columns)
    assert "read_bytes" in set(functions["function"])
    exports = [b for b in at.get("download_button") if "speedscope" in b.proto.label]
    assert len(exports) == 2  # one a side


def test_history_shows_a_failed_run_with_its_headline(app_env):
    store = RunStore(app_env)
    run_to_completion(RunRequest(target=dataset_path("getitem_raises.py"), seconds=1.0), store)
    at = AppTest.from_string(HISTORY_SCRIPT, default_timeout=60).run()
    assert not at.exception
    assert at.error and "KeyError" in at.error[0].value


def broken(name: str) -> str:
    return os.path.join(ROOT, "tests", "broken", name)


@pytest.mark.parametrize("target,phrase", [
    (dataset_path("missing_import.py"), "definitely_not_installed_pkg"),
    (dataset_path("two_classes.py"), "several Dataset classes"),
    (dataset_path("nothing_here.py"), "make_dataset"),
    (dataset_path("factory_raises.py"), "raised"),
])
def test_target_problems_show_an_error_card(app_env, target, phrase):
    at = set_target(live_app(), target)
    assert not at.exception
    assert at.error and phrase in at.error[0].value
    assert button(at, "Start").disabled


@pytest.mark.parametrize("target,workers,phrase", [
    (broken("ragged_shapes.py"), 0, "cannot stack samples of different shapes"),
    (broken("worker_bus_error.py"), 2, "shared memory"),
    (broken("iter_raises.py"), 2, "connection to the shard server was reset"),
    (broken("stuck_in_main.py"), 2, "[6, 7]"),
])
def test_run_failures_show_an_error_card_and_the_page_stays_usable(app_env, target, workers,
                                                                   phrase):
    at = press("Start", target, consumer="none", num_workers=workers, timeout_s=2.0)
    assert not at.exception
    assert any(phrase in e.value for e in at.error), [e.value for e in at.error]
    at = set_target(at, dataset_path("small_map.py"))  # and the next run can start
    assert not at.exception and not button(at, "Start").disabled


def test_pitfalls_show_with_their_fix(app_env):
    at = press("Start", broken("shared_rng.py"), consumer="none", num_workers=2, seconds=2.0)
    assert not at.exception
    assert any("duplicated_random_streams" in w.value for w in at.warning)
    assert any("worker_init_fn" in c.value for c in at.code)


def test_the_controls_start_from_the_modules_own_settings(app_env):
    at = set_target(live_app(), dataset_path("with_kwargs.py"))
    assert at.number_input(key="ctl_num_workers").value == 2
    assert at.number_input(key="ctl_batch_size").value == 6
    assert at.checkbox(key="ctl_persistent_workers").value is True
    button(at, "Start").click()
    at = at.run()
    handle = get_jobs().run
    deadline = time.monotonic() + 60
    while handle.live.config is None and time.monotonic() < deadline:
        time.sleep(0.2)
    get_jobs().stop_all()
    assert handle.live.config["shuffle"] is True and handle.live.config["drop_last"] is True


WATCHED_SCRIPT = "from dataloader_tuner.dashboard import watched_page\nwatched_page.render()\n"


def test_watched_jobs_are_listed_and_shown_live(app_env):
    """A loader watched in this process (real workers, the real store): the page lists the job
    while it runs and shows its figures; once ended, its saved result."""
    from torch.utils.data import DataLoader

    from dataloader_tuner import watch

    from .test_watch import Indices

    at = AppTest.from_string(WATCHED_SCRIPT, default_timeout=60).run()
    assert any("No watched jobs yet" in i.value for i in at.info)
    watched = watch(DataLoader(Indices(), batch_size=8, num_workers=2), name="train",
                    db=app_env)
    for _ in range(3):
        for _batch in watched:
            time.sleep(0.002)  # a step
    deadline = time.monotonic() + 10.0  # its recorder's next flush or two (0.6 s unloaded)
    while True:
        time.sleep(0.3)
        at = AppTest.from_string(WATCHED_SCRIPT, default_timeout=60).run()
        assert not at.exception
        page = " ".join(m.value for m in at.markdown)
        if "**running**" in page or time.monotonic() > deadline:
            break
    assert "**train**" in page and "**running**" in page and "pid" in page
    metrics = {m.label: m.value for m in at.metric}
    assert float(metrics["samples/s"].rstrip("k")) > 0
    listed = at.dataframe[0].value  # the jobs table: a running run's rate from its batches
    assert list(listed["status"]) == ["running"] and listed["samples/s"][0] > 0
    watched.close()
    at = AppTest.from_string(WATCHED_SCRIPT, default_timeout=60).run()
    assert "**ok**" in " ".join(m.value for m in at.markdown)
    titles = chart_titles(at)
    for name in ("Batch latency", "Worker utilization", "GPU idle gaps"):
        assert any(t.startswith(name) for t in titles), (name, titles)
    saved = get_jobs().store.list_runs()[0].result  # its ceiling, where its figures tell one
    assert saved.ceiling is None or saved.ceiling["sentence"] in texts(at)


def test_an_ended_run_s_charts_read_its_latest_batches_and_say_so(app_env, monkeypatch):
    """A long job's page reads at most ENDED_BATCHES_SHOWN of its rows (a day's job has
    millions); its figures are its saved result's, of every batch."""
    from torch.utils.data import DataLoader

    from dataloader_tuner import watch
    from dataloader_tuner.dashboard import watched_page

    monkeypatch.setattr(watched_page, "ENDED_BATCHES_SHOWN", 40)
    watched = watch(DataLoader(range(400), batch_size=4), name="train", db=app_env)
    for _batch in watched:
        time.sleep(0.002)
    watched.close()
    at = AppTest.from_string(WATCHED_SCRIPT, default_timeout=60).run()
    page = " ".join(m.value for m in at.markdown)
    assert "100 batches (charted: the most recent 40)" in page, page
    assert any(t.startswith("Batch latency") for t in chart_titles(at))
    saved = get_jobs().store.list_runs()[0].result
    assert saved.batches == 100 and {m.label: m.value for m in at.metric}["samples/s"]


def test_a_watched_loader_whose_workers_are_not_timed_says_which_part_and_why(app_env, capfd):
    """A StatefulDataLoader over a list (a builtin: its workers' copies cannot be timed) with 2
    workers: the job's output and its page say what is not measured, and why."""
    stateful = pytest.importorskip("torchdata.stateful_dataloader")
    from dataloader_tuner import watch

    watched = watch(stateful.StatefulDataLoader(list(range(40)), batch_size=4, num_workers=2),
                    name="train", db=app_env)
    assert [len(batch) for batch in watched] == [4] * 10
    watched.close()
    why = "StatefulDataLoader makes its own iterators, and its dataset (a list) cannot be timed"
    assert f"train: not timed inside its workers: {why}" in capfd.readouterr().err
    at = AppTest.from_string(WATCHED_SCRIPT, default_timeout=60).run()
    assert not at.exception
    assert f"Not timed inside its workers: {why}" in texts(at)


def test_tune_this_job_asks_the_running_job_to_tune_in_place(app_env, monkeypatch, tmp_path):
    from torch.utils.data import DataLoader

    from .test_inplace import watch_leaping
    from .test_watch import Indices

    watched = watch_leaping(DataLoader(Indices(64), batch_size=8, num_workers=1), name="train",
                            db=app_env, settings_out=str(tmp_path / "chosen.json"))
    list(watched)
    # (each wait below ends as soon as it is met: the recorder's flushes come every 0.25 s
    # unloaded, later on a busy host)
    at = page_once(lambda at: any(b.label == "Tune this job" for b in at.button))
    button(at, "Tune this job").click()
    at = at.run()
    assert not at.exception and any(b.label == "Tuning requested" for b in at.button)
    deadline = time.monotonic() + 15.0
    while not watched.history.tune_requested and time.monotonic() < deadline:
        time.sleep(0.05)  # the job's next flush sees the request
    assert watched.history.tune_requested
    for _ in range(6):
        list(watched)  # epochs: the search runs from the next one
    assert watched.search is not None and watched.search.measured
    page_once(lambda at: any("Tuning in place" in m.value for m in at.markdown))
    watched.close()


def page_once(shown: Callable[[AppTest], bool], within_s: float = 15.0) -> AppTest:
    """The watched-jobs page, run again until ``shown`` holds for it (a failure after
    ``within_s``)."""
    deadline = time.monotonic() + within_s
    while True:
        at = AppTest.from_string(WATCHED_SCRIPT, default_timeout=60).run()
        assert not at.exception
        if shown(at):
            return at
        assert time.monotonic() < deadline, texts(at)
        time.sleep(0.1)


def test_a_torchrun_job_s_ranks_are_shown_side_by_side_with_the_straggler(app_env,
                                                                           monkeypatch):
    """Two ranks of one job (torchrun's environment, as each rank gets it), rank 1's steps
    three times longer: the page names rank 1 and why."""
    from torch.utils.data import DataLoader

    from dataloader_tuner import watch

    from .test_watch import Indices

    loaders = []
    for rank in (0, 1):
        for name, value in {"RANK": rank, "WORLD_SIZE": 2, "LOCAL_RANK": rank,
                            "LOCAL_WORLD_SIZE": 2, "GROUP_RANK": 0,
                            "TORCHELASTIC_RUN_ID": "job-1"}.items():
            monkeypatch.setenv(name, str(value))
        loaders.append(watch(DataLoader(Indices(640), batch_size=8), name="train", db=app_env))
    for rank, loader in enumerate(loaders):
        for _batch in loader:
            time.sleep(0.002 if rank == 0 else 0.006)
        loader.close()
    at = AppTest.from_string(WATCHED_SCRIPT, default_timeout=60).run()
    assert not at.exception
    assert any("2 of 2 ranks" in m.value for m in at.markdown)
    warning = " ".join(w.value for w in at.warning)
    assert "rank 1's steps are slower" in warning, warning


def test_a_job_across_nodes_is_shown_from_rank_0_s_gathered_reports(app_env):
    """Rank 0's history holds every rank's reports (as gathered through the job's store): the
    page shows the ranks of both nodes, each node's load, the starved rank and a lost one, and
    where each rank's loader's time goes, merged over the job."""
    from dataloader_tuner import RunStore
    from dataloader_tuner.analyse.ranks import RankSummary
    from dataloader_tuner.run.live import LiveRun

    store = RunStore(app_env)
    rank = {"rank": 0, "world_size": 3, "local_rank": 0, "local_world_size": 2,
            "node_rank": 0, "job_id": "job-9"}
    run_id = store.create_run("watch", "train.py", {}, label="train", script="train.py",
                              rank=rank)

    def report(r, node, wait, status, cpu, **profile):
        return RankSummary("train", r, 3, r % 2, node, f"host{node}", 10 + r, 4, status, 30.0,
                           900, 0.01, 500.0, wait, 8.0, 0.6, 800.0, cpu, 8, 120.0, 4096.0,
                           **profile)

    now = time.time()
    shards = {"profile_s": 20.0, "stages": [["read", 0.7], ["decode", 0.3]],
              "top_functions": [["_read_shard", "data.py:12", 0.68, "read"]]}
    store.record_rank_reports(run_id, [(now, report(0, 0, 0.04, "ok", 30.0)),
                                       (now, report(1, 0, 0.05, "ok", 30.0)),
                                       (now - 20, report(2, 1, 0.60, "running", 99.0,
                                                         **shards))])
    store.finish_run(run_id, "stopped", LiveRun.stored(store, run_id).result("stopped"), None)
    at = AppTest.from_string(WATCHED_SCRIPT, default_timeout=60).run()
    assert not at.exception
    assert any("Job `job-9`, loader train: 3 of 3 ranks, 2 node(s)" in m.value
               for m in at.markdown)
    ranks, nodes = (frame.value for frame in at.dataframe[1:3])
    assert list(ranks["state"]) == ["finished", "finished", "lost"]
    assert list(nodes["CPU %"]) == [30.0, 99.0] and list(nodes["ranks"]) == ["0, 1", "2"]
    warning = " ".join(w.value for w in at.warning)
    assert "rank 2 is starved for data" in warning and "no CPU to spare" in warning
    assert "Its loader spends 68% in _read_shard (read, data.py:12)" in warning
    assert list(ranks["loader's time goes"])[2] == "68% in _read_shard (read, data.py:12)"
    assert any("Where all ranks' loaders' time goes" in c.value and "read 70%" in c.value
               for c in at.caption)


def test_settings_whose_batches_would_not_fit_in_shm_are_warned_before_start(app_env,
                                                                              monkeypatch):
    monkeypatch.setenv("DATALOADER_TUNER_SHM_MB", "64")  # a container's default, rehearsed
    at = set_target(live_app(), dataset_path("big_samples.py"))
    assert not any("shm_too_small" in w.value for w in at.warning)  # 0 workers: no shm used
    at.number_input(key="ctl_num_workers").set_value(2)
    at = at.run()
    warned = [w.value for w in at.warning if "shm_too_small" in w.value]
    assert warned and "64 MB" in warned[0] and "sample 0 x batch_size" in warned[0]
    assert not get_jobs().busy()  # nothing started: the warning comes before Start


@pytest.mark.host_speed  # the chart's median rate against the run's
@pytest.mark.slow  # 3.2 s: the quick loop has a fast watched job's windows on its page
def test_history_shows_a_fast_run_from_its_windows(app_env):
    """A run whose batches were kept in windows (record/windows.py): its throughput over time
    reads the windows, not the 1 row in 16 kept (a sixteenth of the rate)."""
    store = RunStore(app_env)
    target = os.path.join(ROOT, "tests", "real", "long_tail.py")
    run_to_completion(RunRequest(target=target, seconds=1.5, sample_stacks=False), store)
    run = store.list_runs(1)[0]
    assert store.windows(run.id)  # the run is one this test is about
    at = AppTest.from_string(HISTORY_SCRIPT, default_timeout=60).run()
    assert not at.exception
    specs = [json.loads(c.proto.spec) for c in at.get("plotly_chart")]
    figures = {spec["layout"]["title"]["text"]: spec for spec in specs}
    throughput = figures["Throughput over time"]["data"][0]["y"]
    steady = sorted(throughput)[len(throughput) // 2]
    assert 0.7 < steady / run.samples_per_s < 1.3, (steady, run.samples_per_s)


def test_a_fast_watched_job_says_its_rows_are_windows(app_env):
    """A watched loader making thousands of batches a second (record/windows.py): the
    Training jobs page counts its batches, not its rows, and says a row is one batch, not a
    window, with the rate from which they were kept so."""
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    from dataloader_tuner import watch

    data = TensorDataset(torch.randn(32 * 3000, 4), torch.arange(32 * 3000))
    watched = watch(DataLoader(data, batch_size=32), name="fast", db=app_env)
    count = sum(1 for _ in range(3) for _batch in watched)
    watched.close()
    at = AppTest.from_string(WATCHED_SCRIPT, default_timeout=60).run()
    assert not at.exception
    page = " ".join(m.value for m in at.markdown)
    assert f"{count:,} batches" in page, page
    assert "a row is one batch, not a window" in texts(at)
