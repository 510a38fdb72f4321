"""The Training jobs page's logic (dashboard/job_board.py) against a real history: rates of
running runs, torchrun jobs grouped by job and loader, and asking a job to tune."""

import sqlite3

from dataloader_tuner import RunStore, protocol
from dataloader_tuner.run.live import LiveRun
from dataloader_tuner.dashboard import job_board
from dataloader_tuner.analyse.ranks import RankSummary

from .records import make_batches
from .test_rank_view import report


def _rank(rank: int, job: str = "job-1", world: int = 2) -> dict:
    return {"rank": rank, "world_size": world, "local_rank": rank, "local_world_size": world,
            "node_rank": 0, "job_id": job}


def _watched(store: RunStore, label: str = "train", rank: dict | None = None,
             batches: int = 40, period_s: float = 0.01) -> int:
    run_id = store.create_run("watch", "train.py", {}, label=label, script="train.py",
                              rank=rank)
    store.record_event(run_id, protocol.Batches(
        [b.to_row() for b in make_batches(batches, period_s=period_s)]))
    return run_id


def _queries(store: RunStore) -> list[str]:
    """Every SQL statement the store's connection (this thread's) runs from now on."""
    seen: list[str] = []
    conn: sqlite3.Connection = store._conn()
    conn.set_trace_callback(seen.append)
    return seen


def test_recent_batches_are_each_run_s_last_ones_in_order(tmp_path):
    store = RunStore(str(tmp_path / "runs.sqlite"))
    first, second = _watched(store, batches=30), _watched(store, batches=5)
    recent = store.recent_batches([first, second, 999], last=10)
    assert [b.seq for b in recent[first]] == list(range(20, 30))
    assert [b.seq for b in recent[second]] == list(range(5))
    assert recent[999] == [] and store.recent_batches([], 10) == {}
    assert recent[first] == store.batches(first, last=10)


def test_the_board_reads_every_running_run_s_rate_in_one_query(tmp_path):
    """Three running runs at 8 samples per 10 ms and one ended with its result: one query for
    the runs, one for all the running ones' batches and one for the windows among them
    (record/windows.py), however many run."""
    store = RunStore(str(tmp_path / "runs.sqlite"))
    running = [_watched(store) for _ in range(3)]
    ended = _watched(store, period_s=0.02)
    store.finish_run(ended, "ok", LiveRun.stored(store, ended).result("ok"), None)
    store.create_run("profile", "data.py", {})  # the engine's own runs are not on this page
    seen = _queries(store)
    board = job_board.read_board(store)
    assert [run.id for run in board.runs] == [ended, *running[::-1]]  # newest first
    selects = [q for q in seen if q.lstrip().upper().startswith("SELECT")]
    assert len(selects) == 3, selects
    for run_id in running:
        assert abs(board.rates[run_id] - 800) < 40, board.rates  # 8 samples every 10 ms
    assert board.rates[ended] == board.runs[0].samples_per_s
    seen.clear()
    jobs_only = job_board.read_board(store, live_rates=False)  # the ranks view: no batches read
    assert jobs_only.runs == board.runs and len(seen) == 1
    assert abs(board.rates[ended] - 400) < 20


def test_the_board_lists_ended_runs_without_reading_their_saved_results(tmp_path, monkeypatch):
    """Its rates come from the headline each run keeps beside its result: parsing the saved
    results of the 500 runs listed was ~0.15 s of the page's first render at 10,000 runs
    (bench/history_scale.py). A run an older version ended (no headline kept) is still read."""
    import dataloader_tuner.store as store_module

    store = RunStore(str(tmp_path / "runs.sqlite"))
    ended = [_watched(store, period_s=0.01 * (i + 1)) for i in range(3)]
    for run_id in ended:
        store.finish_run(run_id, "ok", LiveRun.stored(store, run_id).result("ok"), None)
    with sqlite3.connect(store.path) as conn:  # as an older version left it
        conn.execute("UPDATE runs SET samples_per_s = NULL WHERE id = ?", (ended[0],))
    expected = {run.id: run.samples_per_s for run in store.list_runs(10, kind="watch")}
    assert all(expected.values())
    parsed = []
    monkeypatch.setattr(store_module, "_result_of", lambda kind, saved: parsed.append(kind)
                        or store_module.result_from_dict(kind, store_module.body_json(saved)))
    board = job_board.read_board(store)
    assert board.rates == expected
    assert parsed == ["watch"]  # the older run's only


def test_a_torchrun_job_is_grouped_by_job_and_loader_and_seen_from_its_ranks(tmp_path):
    store = RunStore(str(tmp_path / "runs.sqlite"))
    for rank in (0, 1):
        _watched(store, "train", _rank(rank))
        _watched(store, "val", _rank(rank))
    _watched(store, "train", _rank(0, job="job-2", world=4))  # one rank: no job view yet
    _watched(store, "train")  # not a torchrun job
    board = job_board.read_board(store)
    assert {key: len(ranks) for key, ranks in board.jobs().items()} == {
        ("job-1", "val"): 2, ("job-1", "train"): 2, ("job-2", "train"): 1}
    seen = _queries(store)
    shown = job_board.job_views(store, board)
    assert sorted(job.key for job in shown) == [("job-1", "train"), ("job-1", "val")]
    for job in shown:
        assert [r.summary.rank for r in job.view.ranks] == [0, 1] and job.world_size == 2
        assert "each rank's own run" in job.source
    batch_reads = [q for q in seen if "FROM batches" in q]
    assert len(batch_reads) == 1, batch_reads  # every rank's batches at once


def test_asking_a_job_to_tune_asks_every_running_rank_of_that_loader(tmp_path):
    store = RunStore(str(tmp_path / "runs.sqlite"))
    train = [_watched(store, "train", _rank(rank)) for rank in (0, 1)]
    val = _watched(store, "val", _rank(0))
    alone = _watched(store, "train")
    asked = job_board.request_tune(store, store.get_run(train[1]))
    assert sorted(asked) == train
    assert [store.tune_requested(r) for r in (*train, val, alone)] == [True, True, False, False]
    assert job_board.request_tune(store, store.get_run(alone)) == [alone]


def test_recent_batches_of_more_runs_than_one_query_holds(tmp_path, monkeypatch):
    import dataloader_tuner.store as store_module

    monkeypatch.setattr(store_module, "COMPOUND_LIMIT", 2)
    store = RunStore(str(tmp_path / "runs.sqlite"))
    runs = [_watched(store, batches=10 + i) for i in range(5)]
    recent = store.recent_batches(runs, last=3)
    for i, run_id in enumerate(runs):
        assert [b.seq for b in recent[run_id]] == [7 + i, 8 + i, 9 + i]


def test_the_page_opens_on_the_newest_job_s_first_loader(tmp_path):
    """A job watching "train" then "val" (which sits between epochs) opens on "train"; an
    ended run is not preferred over running ones; another process's job is not mixed in."""
    store = RunStore(str(tmp_path / "runs.sqlite"))
    assert job_board.read_board(store).shown_first() is None
    ended = _watched(store, label="old")
    store.finish_run(ended, "ok", LiveRun.stored(store, ended).result("ok"), None)
    assert job_board.read_board(store).shown_first() == ended  # nothing running: the newest
    train = _watched(store, label="train")
    val = _watched(store, label="val")
    assert job_board.read_board(store).shown_first() == train
    store.finish_run(train, "ok", LiveRun.stored(store, train).result("ok"), None)
    assert job_board.read_board(store).shown_first() == val
    other = _watched(store, label="train")  # a second job, in another process
    store._conn().execute("UPDATE runs SET pid = pid + 1 WHERE id = ?", (other,))
    assert job_board.read_board(store).shown_first() == other


def _two_ranks_ended(store: RunStore) -> tuple[list[int], RankSummary]:
    """Ranks 0 and 1 of one job, each run ended here with its 40 batches, and rank 0's own
    final report as it would gather it."""
    runs = [_watched(store, "train", _rank(rank)) for rank in (0, 1)]
    for run_id in runs:
        store.finish_run(run_id, "ok", LiveRun.stored(store, run_id).result("ok"), None)
    return runs, report(0, status="ok", batches=40, world_size=2, rate=800.0,
                        wait=LiveRun.stored(store, runs[0]).result("ok").consumer_idle_frac)


def test_rank_0_s_last_view_takes_a_rank_s_final_figures_from_its_own_run_here(tmp_path):
    """Ray Train ends every rank at once: rank 0 last heard rank 1 at 20 of its 40 batches,
    starved. Rank 1's own run in this history ended (NOTE [ Runs ended without a word ]):
    its final figures replace that report, and no rank is named from the partial one. A rank
    whose run is not here (another node) keeps its last report, and is not compared."""
    store = RunStore(str(tmp_path / "runs.sqlite"))
    runs, rank0 = _two_ranks_ended(store)
    partial = report(1, status="running", batches=20, world_size=2, rate=400.0, wait=0.6)
    store.record_rank_reports(runs[0], [(100.0, rank0), (99.0, partial)])
    board = job_board.read_board(store)
    (job,) = job_board.job_views(store, board)
    shown = {state.summary.rank: state for state in job.view.ranks}
    assert shown[1].summary.batches == 40 and shown[1].state == "finished"
    assert "Gathered by rank 0" in job.source
    assert job.view.straggler is None  # the two alike, once both are final
    # Rank 1 elsewhere (its run not in this history): its report kept, and compared with none.
    store2 = RunStore(str(tmp_path / "node0.sqlite"))
    alone = _watched(store2, "train", _rank(0))
    store2.finish_run(alone, "ok", LiveRun.stored(store2, alone).result("ok"), None)
    ended = store2.get_run(alone).ended_at
    store2.record_rank_reports(alone, [(ended, rank0), (ended - 1.0, partial)])
    other = RunStore(str(tmp_path / "node0.sqlite"))
    (job,) = job_board.job_views(other, job_board.read_board(other))
    shown = {state.summary.rank: state for state in job.view.ranks}
    assert shown[1].summary.batches == 20 and shown[1].state == "running"
    assert "no final report reached it" in shown[1].note
    assert job.view.straggler is None  # (the partial report, compared: "starved")
    assert isinstance(shown[1].summary, RankSummary)


def test_a_rank_whose_reports_never_reached_rank_0_is_shown_from_its_own_run_here(tmp_path):
    """A Ray Train job shorter than the first report's 2 s: rank 0 gathered its own final
    report only, and Ray ended rank 1 before any of its reports reached rank 0 (CI: the job's
    view showed one rank of two). Rank 1's run in this history ended with its 40 batches: the
    view shows it so, not an earlier attempt's run of rank 1 under the same job id."""
    store = RunStore(str(tmp_path / "runs.sqlite"))
    earlier = _watched(store, "train", _rank(1), batches=10)
    store.finish_run(earlier, "error", LiveRun.stored(store, earlier).result("error"), None)
    runs, rank0 = _two_ranks_ended(store)
    store.record_rank_reports(runs[0], [(100.0, rank0)])
    (job,) = job_board.job_views(store, job_board.read_board(store))
    assert "Gathered by rank 0" in job.source
    assert [(state.summary.rank, state.state, state.summary.batches)
            for state in job.view.ranks] == [(0, "finished", 40), (1, "finished", 40)]
