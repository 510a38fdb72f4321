"""Each rank reports its loader through the job's own torch.distributed store (a real TCPStore
on loopback here, as torchrun's agent serves it); rank 0 gathers every rank's reports into its
history, keeps the others' records when one dies, and says so."""

import time
from datetime import timedelta

import pytest
from torch.distributed import TCPStore

from dataloader_tuner import RunStore
from dataloader_tuner.analyse.ranks import job_view
from dataloader_tuner.watcher import job_report
from dataloader_tuner.analyse.ranks import report_key
from dataloader_tuner.watcher.job_report import RankReporter, job_store
from dataloader_tuner.watcher.rank_identity import RankIdentity
from dataloader_tuner.run.recorder import Recorder
from dataloader_tuner.run.sinks import HistorySink
from dataloader_tuner.record.columns import NO_STEP_TIMES
from dataloader_tuner.record.rows import BatchMeta


@pytest.fixture
def server():
    return TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                    timeout=timedelta(seconds=5))


def client(port: int) -> TCPStore:
    return TCPStore("127.0.0.1", port, is_master=False, wait_for_workers=False,
                    timeout=timedelta(seconds=5))


def rank_of(rank: int, tmp_path, port: int, step_s: float = 0.004):
    """Rank ``rank`` of a 2-rank job, each on a "node" with its own history file, with 100
    batches in its recorder (as the recorder keeps them after writing them)."""
    history = RunStore(str(tmp_path / f"node{rank}.sqlite"))
    run_id = history.create_run("watch", "train.py", {}, label="train")
    t0 = time.monotonic() - 1.0
    recorder = Recorder(HistorySink(history, run_id), t0, keep_recent=True)
    for seq in range(100):  # 2 ms wait on rank 0, 8 ms on rank 1 (its loader is slow)
        wait = 0.002 if rank == 0 else 0.008
        asked = t0 + seq * (wait + step_s)  # (as the loop took it: recorder.recent's batches)
        meta = BatchMeta(0, 1, asked, wait, 0.0, None, 16, None, None)
        recorder.recent.append((seq, 0, asked, asked + wait, asked + wait + step_s, meta,
                                NO_STEP_TIMES))
    identity = RankIdentity(rank, 2, 0, 1, rank, "job-1")
    return history, run_id, RankReporter(identity, "train", recorder, history, run_id,
                                         connect=lambda: client(port))


def test_rank_0_gathers_every_rank_s_reports_into_its_history(tmp_path, server):
    history0, run0, rank0 = rank_of(0, tmp_path, server.port)
    history1, run1, rank1 = rank_of(1, tmp_path, server.port)
    rank1.recorder.ledger.asking_since = time.monotonic() - 5.0  # its loop has sat in next() 5 s
    rank0.report("running")  # before rank 1 has said anything: only its own
    assert [s.rank for _, s in history0.rank_reports(run0)] == [0]
    rank1.report("running")
    rank0.report("running")
    latest = history0.rank_reports(run0)
    assert [(s.rank, s.node, s.seq) for _, s in latest] == [(0, 0, 2), (1, 1, 1)]
    assert history1.rank_reports(run1) == []  # only rank 0 gathers
    one = latest[1][1]
    assert one.batches == 100 and abs(one.input_wait_frac - 0.008 / 0.012) < 0.02
    assert one.node_cpus >= 1 and one.pid > 0 and one.shm_total_mb > 0
    assert 5.0 <= one.waiting_for_batch_s < 6.0 and latest[0][1].waiting_for_batch_s is None
    rank0.report("running")  # rank 1 said nothing new: its report is not written twice
    assert [(s.rank, s.seq) for _, s in history0.rank_reports(run0)] == [(0, 3), (1, 1)]
    # The kept series: a rank's report every 30 s (and its final one), for trends.
    assert [s.rank for _, s in history0.rank_reports(run0, latest=False)] == [0, 1]
    view = job_view(latest, time.time(), collecting=True)
    assert view.straggler[0] == 1 and "starved" in view.straggler[1]
    assert [n.node for n in view.nodes] == [0, 1]


def test_a_rank_that_dies_is_shown_lost_and_the_others_records_stay(tmp_path, server,
                                                                   monkeypatch):
    monkeypatch.setattr(job_report, "FINAL_WAIT_S", 0.5)
    history0, run0, rank0 = rank_of(0, tmp_path, server.port)
    _, _, rank1 = rank_of(1, tmp_path, server.port)
    rank1.report("running")
    rank0.report("running")
    # rank 1 is killed: no final report. Rank 0 ends; it waited for rank 1's final word.
    started = time.monotonic()
    rank0.finish("ok")
    assert 0.4 < time.monotonic() - started < 3.0
    latest = history0.rank_reports(run0)
    assert [s.status for _, s in latest] == ["ok", "running"]
    ended_at = time.time() + job_report.REPORT_S * 10  # looked at later, as the page would
    states = {s.summary.rank: s for s in job_view(latest, ended_at, False).ranks}
    assert states[0].state == "finished" and states[1].state == "lost"
    assert states[1].summary.batches == 100  # its last report kept


def test_a_rank_that_finishes_in_time_is_not_waited_for(tmp_path, server):
    history0, run0, rank0 = rank_of(0, tmp_path, server.port)
    _, _, rank1 = rank_of(1, tmp_path, server.port)
    rank1.finish("ok")
    started = time.monotonic()
    rank0.finish("ok")
    assert time.monotonic() - started < job_report.FINAL_WAIT_S
    assert [s.status for _, s in history0.rank_reports(run0)] == ["ok", "ok"]


def test_an_unreachable_store_never_reaches_the_training_job(tmp_path, capsys):
    history = RunStore(str(tmp_path / "runs.sqlite"))
    run_id = history.create_run("watch", "train.py", {}, label="train")

    def refused():
        raise ConnectionRefusedError("no store")

    reporter = RankReporter(RankIdentity(1, 2, 1, 2, 0, "j"), "train",
                            Recorder(HistorySink(history, run_id), time.monotonic(), keep_recent=True), history, run_id,
                            connect=refused)
    reporter.report("running")
    reporter.report("running")
    reporter.finish("ok")
    err = capsys.readouterr().err
    assert err.count("cannot report to the job's store") == 1 and "no store" in err


def test_torchrun_s_own_store_is_found_from_its_environment(server, monkeypatch):
    monkeypatch.setenv("TORCHELASTIC_USE_AGENT_STORE", "True")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(server.port))
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "2")
    store = job_store()
    store.set(report_key("train", 3), "x")
    assert server.get("dataloader-tuner/2/train/3") == b"x"  # a restarted job reports afresh
    monkeypatch.delenv("TORCHELASTIC_USE_AGENT_STORE")
    assert job_store() is None  # no torchrun store, no process group: nothing to report to
