"""Aggregations on hand-made timelines: every time is given, nothing is measured."""

import pytest

from dataloader_tuner.analyse import metrics
from dataloader_tuner.config import warmup_batches
from dataloader_tuner.record.rows import BatchRecord


def batch(seq, t_request, wait, step=0.0, worker=0, fetch_start=None, fetch=0.01, collate=0.0,
          samples=4):
    return BatchRecord(
        seq=seq, epoch=0, t_request=t_request, wait_s=wait, step_s=step, samples=samples,
        nbytes=100, worker_id=worker, worker_pid=1000 + worker,
        fetch_start=t_request if fetch_start is None else fetch_start, fetch_s=fetch,
        collate_s=collate,
    )


def test_percentile_matches_linear_interpolation():
    assert metrics.percentile([1, 2, 3, 4], 50) == 2.5
    assert metrics.percentile([10], 95) == 10
    assert metrics.percentile([], 50) is None
    assert metrics.percentile(list(range(101)), 95) == 95


def test_latency_in_ms():
    lat = metrics.latency_ms([0.001, 0.002, 0.003])
    assert lat["p50"] == pytest.approx(2.0) and lat["max"] == pytest.approx(3.0)


def test_warmup_counts_prefetched_batches():
    assert warmup_batches(16, 2) == 32
    assert warmup_batches(0, 0) == 1


def test_steady_state_excludes_warmup_burst():
    # 4 batches arrive at once (prefetched), then one every 0.1 s
    batches = [batch(i, 0.0, 0.5) for i in range(4)]
    batches += [batch(4 + i, 0.5 + 0.1 * i, 0.1) for i in range(10)]
    steady = metrics.steady_state(batches, warmup=4)
    assert steady.batches == 10
    assert steady.seconds == pytest.approx(1.0)
    assert steady.samples_per_s == pytest.approx(40.0)
    assert steady.batches_per_s == pytest.approx(10.0)


def test_steady_state_none_when_too_short():
    assert metrics.steady_state([batch(0, 0, 0.1)], warmup=1) is None


def test_busy_fraction_clips_to_the_window():
    records = [
        batch(0, 0.0, 0.0, worker=0, fetch_start=0.0, fetch=0.5),  # busy 0.0-0.5
        batch(1, 0.0, 0.0, worker=1, fetch_start=0.8, fetch=0.4),  # busy 0.8-1.2
    ]
    busy = metrics.busy_fraction(records, 0.0, 1.0)
    assert busy == {0: pytest.approx(0.5), 1: pytest.approx(0.2)}


def test_busy_timeline_windows():
    records = [batch(0, 0.0, 0.0, worker=0, fetch_start=0.5, fetch=1.0)]  # busy 0.5-1.5
    rows = metrics.busy_timeline(records, end=2.0, window_s=1.0)
    assert [r["busy_frac"] for r in rows] == [pytest.approx(0.5), pytest.approx(0.5)]


def untimed(b: BatchRecord) -> BatchRecord:
    """The row of a batch whose making was not timed (the probes time fast ones on a sample)."""
    return b._replace(fetch_start=None, fetch_s=None, collate_s=None, fetch_cpu_s=None,
                      nbytes=None)


def test_busy_figures_scale_up_from_the_batches_whose_making_was_timed():
    # Two workers alternate; each makes a batch in 40 ms of every 100 ms: 40% busy.
    records = [batch(i, 0.05 * i, 0.0, worker=i % 2, fetch_start=0.05 * i, fetch=0.04)
               for i in range(200)]
    sampled = [b if b.seq % 8 < 2 else untimed(b) for b in records]  # 1 in 4 of each worker's
    full = metrics.busy_fraction(records, 1.0, 9.0)
    assert full == {0: pytest.approx(0.4), 1: pytest.approx(0.4)}
    assert metrics.busy_fraction(sampled, 1.0, 9.0) == {0: pytest.approx(0.4, rel=0.05),
                                                        1: pytest.approx(0.4, rel=0.05)}
    rows = metrics.busy_timeline(sampled, end=10.0, window_s=2.0)
    assert [round(r["busy_frac"], 2) for r in rows] == [0.4] * 10
    costs = metrics.per_batch_costs(sampled)
    assert costs["fetch_ms"] == pytest.approx(40.0)  # medians of the timed ones, not None's
    assert metrics.per_batch_costs([untimed(b) for b in records])["fetch_ms"] is None


def test_consumer_idle_fraction_and_verdicts():
    # after warm-up: each 0.1 s cycle waits 0.03 s then steps 0.07 s
    batches = [batch(0, 0.0, 0.0)]
    t = 0.0
    for i in range(1, 11):
        batches.append(batch(i, t, 0.03, step=0.07))
        t += 0.1
    steady = metrics.steady_state(batches, warmup=1)
    idle = metrics.consumer_idle_fraction(batches, steady)
    assert idle == pytest.approx(0.3)
    assert metrics.input_bound_verdict(idle) == "highly input-bound"
    assert metrics.input_bound_verdict(0.1) == "moderately input-bound"
    assert metrics.input_bound_verdict(0.01) == "not input-bound"
    assert metrics.input_bound_verdict(None) is None


def test_input_wait_counts_each_epochs_start_up_and_not_the_time_between_epochs():
    rows = []
    t = 0.0
    for epoch in range(3):
        for i in range(4):  # the first batch of each epoch waits 0.5 s: its start-up
            wait = 0.5 if i == 0 else 0.1
            rows.append(batch(len(rows), t, wait, step=0.2)._replace(epoch=epoch))
            t += wait + 0.2
        t += 10.0  # validation between epochs: neither waiting nor stepping
    wait = metrics.input_wait(rows)
    loop = 3 * (0.5 + 3 * 0.1 + 4 * 0.2)
    assert wait.loop_s == pytest.approx(loop) and wait.waited_s == pytest.approx(3 * 0.8)
    assert wait.share == pytest.approx(2.4 / loop) and wait.startup_s == (0.5, 0.5, 0.5)
    assert wait.startup_share == pytest.approx(1.5 / loop)
    doc = wait.to_dict()
    assert doc["epochs_started"] == 3 and doc["startup_later_median_s"] == pytest.approx(0.5)
    # A long job's recent rows begin mid-epoch: that epoch's first row is no start-up
    assert metrics.input_wait(rows[2:]).startup_s == (0.5, 0.5)
    assert metrics.input_wait([]) is None


def test_record_row_roundtrip():
    record = batch(3, 1.0, 0.5)
    assert BatchRecord.from_row(record.to_row()) == record


def test_rate_interval_is_tight_for_steady_batches_and_wide_for_erratic_ones():
    from dataloader_tuner.analyse.metrics import rate_interval

    def timeline(gaps):
        t, rows = 0.0, []
        for seq, gap in enumerate(gaps):
            t += gap
            rows.append(BatchRecord(seq, 0, t - gap, gap, 0.0, 8, 0, -1, 1, 0.0, 0.0, 0.0))
        return rows

    steady = timeline([0.01] * 41)
    assert rate_interval(steady, 1) < 0.001
    erratic = timeline([0.01, 0.002, 0.03, 0.004, 0.02] * 8 + [0.01])
    assert rate_interval(erratic, 1) > 0.05
    assert rate_interval(steady[:3], 1) is None  # fewer than three blocks: too short to say
    assert rate_interval(steady, 1, block_batches=20) is None


def test_workers_in_bursts_are_known_by_whole_rounds():
    """4 workers sleeping alike hand their batches in bursts of 4, one a second: cut into blocks
    of 4.4 batches (31 steady ones in 7 blocks) the blocks read 4 or 5 batches a second, +-19%;
    in whole rounds, the last partial one left out, their rate is known as it is, exactly."""
    from dataloader_tuner.analyse.metrics import ends_rate_interval

    ends = [0.0] + [second + 0.001 * k for second in range(1, 9) for k in range(4)]
    for steady in (23, 29, 31, 32):
        assert ends_rate_interval([8] * steady, ends[:steady + 1], 4) < 0.005, steady
    assert ends_rate_interval([8] * 11, ends[:12], 4) is None  # two whole rounds: too short
