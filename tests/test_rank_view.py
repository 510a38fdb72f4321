"""A job's ranks side by side: each rank's state, each node's load, and the straggler named
with the cause its numbers show."""

from dataclasses import replace

from dataloader_tuner.record.rows import BatchRecord
from dataloader_tuner.analyse.hotspots import SampledProfile
from dataloader_tuner.analyse.batch_log import window_figures
from dataloader_tuner.analyse.ranks import (RankSummary, job_stages, job_view, memory_growth,
                                            node_loads, profile_fields, rank_states,
                                            slowest_rank, summary_from_batches)
from dataloader_tuner import protocol
from dataloader_tuner.instrument import probes
from dataloader_tuner.run.sinks import HistorySink
from dataloader_tuner.store import RunStore


def report(rank, node=0, rate=1000.0, wait=0.05, step=10.0, **more) -> RankSummary:
    fields = dict(loader="train", rank=rank, world_size=4, local_rank=rank % 2, node=node,
                  host=f"node{node}", pid=100 + rank, seq=5, status="running", elapsed_s=60.0,
                  batches=500, last_batch_age_s=0.01, samples_per_s=rate, input_wait_frac=wait,
                  step_ms=step, worker_busy_frac=0.5, memory_mb=900.0, node_cpu_pct=40.0,
                  node_cpus=8, shm_used_mb=100.0, shm_total_mb=4096.0)
    fields.update(more)
    return RankSummary(**fields)


def test_a_report_survives_its_trip_through_the_store_as_json():
    summary = report(3, node=1)
    text = summary.to_json()
    assert RankSummary.from_json(text) == summary
    assert RankSummary.from_json(text.encode()) == summary  # store.get gives bytes
    assert len(text) < 700  # what every rank sends every 2 s


# A worker's sampled stacks (sampler.Sampled): 3 s reading a shard, 1 s decoding, 0.1 s collating
FETCH = (probes.__file__, 180, "TimedMapDataset.__getitems__", 180)
COLLATE = (probes.__file__, 326, "TimedCollate.__call__", 326)
WORKER = ("/torch/utils/data/_utils/worker.py", 240, "_worker_loop", 240)
SHARDS = ("/job/shards.py", 40, "Shards.__getitem__", 40)
SAMPLED = [
    ("main", (("/job/shards.py", 12, "_read_shard", 12), SHARDS, FETCH, WORKER), 3.0, 3.0, 600),
    ("main", (("/site/PIL/Image.py", 900, "Image.convert", 900), SHARDS, FETCH, WORKER),
     1.0, 1.0, 200),
    ("main", (("/torch/utils/data/_utils/collate.py", 200, "default_collate", 200), COLLATE,
              WORKER), 0.1, 0.1, 20),
]


def sampled_summary():
    profile = SampledProfile()
    profile.add(4242, SAMPLED)
    return profile.merged()


def test_a_rank_s_report_says_where_its_loader_s_time_goes():
    fields = profile_fields(sampled_summary())
    assert fields["profile_s"] == 4.1
    assert [stage for stage, _ in fields["stages"]] == ["your __getitem__", "decode", "collate"]
    function, where, share, stage = fields["top_functions"][0]  # by its own time
    assert (function, where, stage) == ("_read_shard", "shards.py:12", "your __getitem__")
    assert share == round(3.0 / 4.1, 4)
    # (torch's default_collate is the loader's plumbing, not ranked; __getitem__ spent nothing
    # itself)
    assert [f[0] for f in fields["top_functions"][1:]] == ["Image.convert"]
    summary = report(3, node=1, **fields)
    text = summary.to_json()
    assert RankSummary.from_json(text) == summary and len(text) < 1200
    assert profile_fields({**sampled_summary(), "enough": False}) == {}  # too few looks: none


def test_the_job_s_stages_weigh_each_rank_by_the_work_it_sampled():
    busy = report(0, stages=[["decode", 0.8], ["collate", 0.2]], profile_s=30.0)
    light = report(1, stages=[["read", 1.0]], profile_s=10.0)
    unsampled = report(2)
    assert job_stages([busy, light, unsampled]) == [("decode", 0.6), ("read", 0.25),
                                                     ("collate", 0.15)]
    assert job_stages([unsampled]) == []
    assert job_view([(0.0, busy), (0.0, light)], 1.0, True).stages[0] == ("decode", 0.6)


def test_a_starved_rank_is_told_with_the_function_its_loader_spends_most_in():
    """ "rank 3 is starved" becomes "rank 3 spends 70% in _read_shard" (issue: where each
    sample's time goes, on the Training jobs page)."""
    where = profile_fields(sampled_summary())
    ranks = [report(0, 0, 500, 0.05), report(1, 0, 501, 0.04),
             report(2, 1, 499, 0.45, **where), report(3, 1, 500, 0.06)]
    rank, why = slowest_rank(ranks)
    assert rank == 2 and "Its loader spends 73% in _read_shard (your __getitem__, shards.py:12)" \
        in why, why


def test_a_rank_s_history_keeps_its_stacks_for_its_reports(tmp_path):
    store = RunStore(str(tmp_path / "runs.db"))
    run_id = store.create_run("watch", "train.py", {})
    keeping, not_keeping = HistorySink(store, run_id, keep_stacks=True), HistorySink(store, run_id)
    for sink in (keeping, not_keeping):
        sink.write([protocol.Profiled(4242, 0, SAMPLED[:2]), protocol.Profiled(4243, 1, SAMPLED[2:])])
    summary = keeping.sampled()
    assert summary is not None and summary["processes"] == 2 and summary["seconds"] == 4.1
    assert not_keeping.sampled() is None


def test_in_a_synchronised_job_the_starved_rank_is_named_by_its_input_wait():
    """Every rank runs at the job's pace (they meet at each all-reduce): the rates cannot tell,
    the input wait can."""
    ranks = [report(0, 0, 500, 0.05), report(1, 0, 501, 0.04), report(2, 1, 499, 0.45),
             report(3, 1, 500, 0.06)]
    rank, why = slowest_rank(ranks)
    assert rank == 2 and "starved" in why and "45%" in why and "node 1" in why


def test_a_rank_that_outpaces_the_others_is_not_named_starved_for_its_short_steps():
    """Not in step (ranks that share no collective): rank 0's 2 ms steps make its fetch a
    larger part of its time (23% against 10%: CI), yet it runs 2.4 times as fast as rank 1,
    whose slower steps are the ones named."""
    ranks = [report(0, rate=3400.0, wait=0.23, step=2.1), report(1, rate=1400.0, wait=0.10,
                                                                 step=6.2)]
    rank, why = slowest_rank(ranks)
    assert rank == 1 and "steps are slower" in why, why
    assert "like theirs" not in why  # (10% against 23%)
    # Of the ranks that keep pace, the one that waits most: not passed over for the fast one
    ranks = [report(0, rate=3000.0, wait=0.50), report(1, rate=1000.0, wait=0.45),
             report(2, rate=2000.0, wait=0.05)]
    rank, why = slowest_rank(ranks)
    assert rank == 1 and "starved" in why and "45%" in why, why


def test_a_starved_rank_on_a_saturated_node_is_blamed_on_the_node_s_cpus():
    ranks = [report(0, 0, 500, 0.05), report(1, 0, 500, 0.05),
             report(2, 1, 500, 0.40, node_cpu_pct=98.0), report(3, 1, 500, 0.06,
                                                                 node_cpu_pct=97.0)]
    rank, why = slowest_rank(ranks)
    assert rank == 2 and "no CPU to spare (98% busy against 40% on the others)" in why


def test_a_starved_rank_whose_memory_climbs_is_blamed_on_its_memory():
    series = [report(1, memory_mb=900 + 20 * t, elapsed_s=float(t)) for t in range(0, 120, 2)]
    rank, why = slowest_rank([report(0, wait=0.02), report(1, wait=0.5)], {1: series})
    assert rank == 1 and "memory is growing (1200 MB a minute)" in why
    assert memory_growth(series[:5]) is None  # too short to call a trend
    flat = [report(1, memory_mb=900.0 + (t % 3), elapsed_s=float(t)) for t in range(120)]
    assert memory_growth(flat) is None


def test_a_rank_with_slow_steps_is_named_for_its_steps():
    ranks = [report(0, rate=1000.0, step=10.0), report(1, rate=700.0, step=14.5)]
    rank, why = slowest_rank(ranks)
    assert rank == 1 and "steps are slower" in why and "14.5 ms" in why


def test_ranks_within_the_noise_name_nobody():
    assert slowest_rank([report(0, rate=1000.0, wait=0.1), report(1, rate=970.0, wait=0.12)]
                        ) is None
    assert slowest_rank([report(0)]) is None


def test_states_silent_lost_stalled_and_final():
    now = 1000.0
    latest = [(now - 1, report(0)), (now - 25, report(1)),
              (now - 1, report(2, last_batch_age_s=45.0)),
              (now - 1, report(3, status="ok"))]
    states = {s.summary.rank: s for s in rank_states(latest, now, collecting=True)}
    assert states[0].state == "running"
    assert states[1].state == "silent" and "no report for 25 s" in states[1].note
    assert states[2].state == "stalled" and "no batch for 45 s" in states[2].note
    assert states[3].state == "finished"
    # Once rank 0 has stopped gathering, a rank that never sent its final word was lost.
    # Once rank 0 has stopped gathering (it waits 3 s for final reports; live ranks report
    # every 2 s): a rank silent longer sent no final word and was lost, one heard lately was
    # still running.
    ended = {s.summary.rank: s for s in rank_states(latest, now, collecting=False)}
    assert ended[1].state == "lost"
    assert "sent no final report" in ended[1].note and "25 s before" in ended[1].note
    assert ended[0].state == "running" and "still running when rank 0" in ended[0].note
    assert ended[3].state == "finished"
    # A whole job idle (validation, checkpointing): nobody is called stalled.
    idle = [(now, report(r, last_batch_age_s=60.0)) for r in range(3)]
    assert {s.state for s in rank_states(idle, now, True)} == {"running"}


def test_a_rank_stuck_in_its_loader_is_told_from_the_ranks_waiting_for_it():
    """One rank's loader hangs: it sits in next(), the others sit in their all-reduce. Every
    rank's last batch is equally old; where each one waits tells them apart."""
    now = 1000.0
    latest = [(now, report(0, last_batch_age_s=50.0)),
              (now, report(1, last_batch_age_s=50.0, waiting_for_batch_s=49.0)),
              (now, report(2, last_batch_age_s=50.0))]
    states = {s.summary.rank: s for s in rank_states(latest, now, True)}
    assert states[1].state == "stalled" and "waiting for a batch for 49 s" in states[1].note
    assert states[0].state == "running" and "in its step for 50 s" in states[0].note
    rank, why = slowest_rank([s for _, s in latest])
    assert rank == 1 and "waiting 49 s for a batch" in why
    assert slowest_rank([s for _, s in latest], stalled_s=60.0) is None  # not yet that long


def test_nodes_are_seen_through_their_ranks_reports():
    loads = node_loads([report(0, 0, node_cpu_pct=91.0),
                        report(1, 0, node_cpu_pct=95.0, memory_mb=1000.0),
                        report(2, 1, shm_used_mb=2048.0)])
    assert [(n.node, n.ranks) for n in loads] == [(0, (0, 1)), (1, (2,))]
    assert loads[0].cpu_pct == 93.0 and loads[0].saturated  # the median of its ranks' views
    assert not loads[1].saturated
    assert loads[0].memory_mb == 1900.0 and loads[1].shm_used_mb == 2048.0


def test_a_node_whose_shm_fills_is_warned_while_the_job_runs():
    calm, full = node_loads([report(0, 0, shm_used_mb=10.0, shm_total_mb=64.0),
                             report(1, 1, shm_used_mb=58.0, shm_total_mb=64.0)])
    assert calm.shm_warning() is None
    warning = full.shm_warning()
    assert warning is not None and "91% full (58 of 64 MB)" in warning
    assert "--shm-size" in warning and "prefetch_factor" in warning


def test_figures_come_from_a_rank_s_batches():
    batches = [BatchRecord(i, 0, i * 0.010, 0.002, 0.008, 32, None, 0, 1, i * 0.010, 0.006,
                           0.001) for i in range(50)]
    figures = window_figures(batches)
    assert abs(figures["samples_per_s"] - 3200) < 50
    assert abs(figures["input_wait_frac"] - 0.2) < 0.02 and abs(figures["step_ms"] - 8.0) < 0.01
    assert abs(figures["worker_busy_frac"] - 0.7) < 0.03  # one worker, 7 of every 10 ms
    summary = summary_from_batches("train", {"rank": 1, "world_size": 2, "local_rank": 1,
                                             "node_rank": 0, "job_id": "j"}, "h", 7, "ok",
                                   0.5, batches)
    assert summary.rank == 1 and summary.batches == 50 and summary.node_cpu_pct is None
    view = job_view([(0.0, summary), (0.0, replace(summary, rank=0))], 1.0, False)
    assert [r.state for r in view.ranks] == ["finished", "finished"] and view.straggler is None


def test_a_rank_sums_its_profile_up_for_its_reports_at_most_every_ten_seconds(monkeypatch):
    from dataloader_tuner.watcher import job_report

    now = [100.0]
    monkeypatch.setattr(job_report.time, "monotonic", lambda: now[0])
    reads = []
    sampled = job_report.throttled(lambda: reads.append(now[0]) or {"n": len(reads)}, 10.0)
    assert sampled() == {"n": 1}
    now[0] += 2.0
    assert sampled() == {"n": 1} and reads == [100.0]  # a report 2 s later: the last answer
    assert sampled(fresh=True) == {"n": 2}  # the final report reads it now
    now[0] += 10.0
    assert sampled() == {"n": 3}
