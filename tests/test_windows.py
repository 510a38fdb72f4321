"""Fast batches kept in windows (NOTE [ Windows for fast loaders ], record/windows.py): the
figures read from the windows and the rows kept whole against the same figures over every row."""

import os
import random
import time
from collections import Counter

import pytest

from dataloader_tuner import protocol
from dataloader_tuner.analyse.text import profile_text
from dataloader_tuner.protocol import RunRequest
from dataloader_tuner.run.runner import RunHandle
from dataloader_tuner.store import RunStore
from dataloader_tuner.analyse import metrics
from dataloader_tuner.analyse.batch_log import BatchLog
from dataloader_tuner.record.rows import BatchRecord
from dataloader_tuner.record.folding import Thinner, window_cuts
from dataloader_tuner.record.windows import (KEEP_EVERY, TAIL_S, WINDOW_ABOVE_PER_S, WINDOW_S,
                                             holders, sampled, wait_bucket)
from dataloader_tuner.run.live import LiveRun

from .conftest import live_descendants

WARMUP = 4


def fast_run(seed: int = 1, epochs: int = 3, per_epoch: int = 6000,
             workers: int = 2) -> list[BatchRecord]:
    """A loader at ~9,000 batches/s with long-tailed waits: each epoch opens with a slow
    start-up and a few slow batches; each worker's making timed on its every 16th batch."""
    rng = random.Random(seed)
    rows, t, seq = [], 0.0, 0
    made: Counter = Counter()
    for epoch in range(epochs):
        for i in range(per_epoch):
            wait = (0.25 if i == 0 else 0.002 if i < 8
                    else rng.lognormvariate(-9.9, 0.6))  # ~50 us, a tail to ~0.5 ms
            step = rng.uniform(30e-6, 70e-6)
            worker = seq % workers if workers else -1
            made[worker] += 1
            timed = made[worker] % 16 == 1
            rows.append(BatchRecord(
                seq, epoch, t, wait, step, 32 if i < per_epoch - 1 else 7, None, worker,
                900 + worker, t - 1e-4 if timed else None, 8e-5 if timed else None,
                1e-5 if timed else None, 7e-5 if timed else None))
            t += wait + step
            seq += 1
        t += 0.05  # between epochs
    return rows


def thinned(rows, warmup: int = WARMUP, every_s: float = 0.25):
    """Through a Thinner as the runner feeds it: the child's flushes of ``every_s``."""
    thinner = Thinner(loose_below=warmup)
    kept, windows, batch = [], [], []
    for row in rows:
        batch.append(tuple(row))
        if row.t_ready + row.step_s - batch[0][2] >= every_s:
            out, folded = thinner.arrived(batch)
            kept += out
            windows += folded
            batch = []
    out, folded = thinner.arrived(batch)
    kept += out
    windows += folded
    out, folded = thinner.flush()
    return [BatchRecord.from_row(r) for r in kept + out], windows + folded


def test_windows_keep_every_count_and_sum_exact_and_few_rows():
    rows = fast_run()
    kept, windows = thinned(rows)
    log = BatchLog(kept, windows)
    assert windows and len(kept) < len(rows) / 5
    assert log.batches == len(rows)
    assert sum(w.samples for w in windows) + sum(b.samples for b in log.loose) == sum(
        b.samples for b in rows)
    assert log.worker_batches() == Counter(b.worker_id for b in rows)
    every = {b.seq for b in rows}
    assert {b.seq for b in kept} <= every and [b.seq for b in kept] == sorted(b.seq for b in kept)
    # nothing counted twice or lost: each batch in exactly one window or loose
    covered = Counter()
    for w in windows:
        covered.update(range(w.first_seq, w.first_seq + w.batches))
    covered.update(b.seq for b in log.loose)
    assert set(covered) == every and set(covered.values()) == {1}
    # a window never spans an epoch; each epoch's first batch, every timed one and each
    # window's last and slowest stay rows; the warm-up is never folded
    epoch_of = {b.seq: b.epoch for b in rows}
    assert all(epoch_of[w.first_seq] == epoch_of[w.last_seq] == w.epoch for w in windows)
    kept_seqs = {b.seq for b in kept}
    assert {b.seq for b in metrics.epoch_starts(rows)} <= kept_seqs
    assert {b.seq for b in rows if b.fetch_s is not None} <= kept_seqs
    assert {w.last_seq for w in windows} <= kept_seqs
    for w in windows:
        assert max(b.wait_s for b in kept if w.first_seq <= b.seq <= w.last_seq) == w.wait_max_s
    assert [b.seq for b in log.loose[:WARMUP]] == list(range(WARMUP))


def test_a_window_s_sample_is_its_timed_batches_where_it_has_them():
    """A fast batch's making is timed on one in 16 of each worker's, KEEP_EVERY's rate: a
    window keeps those as its sample rather than a hashed one beside them (which kept twice the
    rows: on long_tail their writing was ~4.5k instructions of a watched batch's 29k over a
    plain loop's); a window with none timed keeps the hashed one. The even sample reads the
    same back, and weighs each batch once either way."""
    rows = fast_run()
    kept, windows = thinned(rows)
    where = holders(kept, windows)
    extras = {w.last_seq for w in windows} | {b.seq for b in metrics.epoch_starts(rows)}
    for w in windows:  # (its slowest)
        extras.add(max((b for b in kept if w.first_seq <= b.seq <= w.last_seq),
                       key=lambda b: b.wait_s).seq)
    inside = [b for b, w in zip(kept, where) if w is not None]
    assert {b.seq for b in inside if b.fetch_s is None} <= extras
    assert len(inside) < 1.3 * len(rows) / KEEP_EVERY  # (a hashed sample too: ~2x)
    log = BatchLog(kept, windows)
    sample = [b for b, _ in log.weighted() if b.seq not in {x.seq for x in log.loose}]
    assert sample and all(b.fetch_s is not None for b in sample)
    assert sum(w for _, w in log.weighted()) == pytest.approx(len(rows))

    untimed = [b._replace(fetch_start=None, fetch_s=None, collate_s=None) for b in rows]
    kept, windows = thinned(untimed)
    hashed = [b for b, w in zip(kept, holders(kept, windows)) if w is not None
              and sampled(b.seq)]
    assert len(hashed) == pytest.approx(sum(w.batches for w in windows) / KEEP_EVERY, rel=0.1)
    log = BatchLog(kept, windows)
    assert sum(w for _, w in log.weighted()) == pytest.approx(len(rows))
    exact = metrics.percentile([b.step_s for b in rows[WARMUP:]], 50)
    assert log.median(lambda b: b.step_s, WARMUP) == pytest.approx(exact, rel=0.05)


def test_the_figures_from_windows_match_those_over_every_row():
    rows = fast_run(seed=7)
    kept, windows = thinned(rows)
    log = BatchLog(kept, windows)
    exact = metrics.steady_state(rows, WARMUP)
    steady = log.steady_state(WARMUP)
    assert (steady.batches, steady.samples) == (exact.batches, exact.samples)
    assert steady.start == pytest.approx(exact.start) and steady.end == pytest.approx(exact.end)
    assert log.idle_fraction(steady) == pytest.approx(
        metrics.consumer_idle_fraction(rows, exact), rel=1e-9)
    wait, exact_wait = log.input_wait(), metrics.input_wait(rows)
    assert wait.waited_s == pytest.approx(exact_wait.waited_s)
    assert wait.loop_s == pytest.approx(exact_wait.loop_s)
    assert wait.startup_s == exact_wait.startup_s
    window = (exact.start, exact.end)
    assert metrics.busy_fraction(kept, *window, counts=log.worker_batches()) == pytest.approx(
        metrics.busy_fraction(rows, *window))
    # percentiles within one bucket of the exact ones; max and mean exact
    latency = log.latency_ms(WARMUP)
    truth = metrics.latency_ms([b.wait_s for b in rows[WARMUP:]])
    for q in ("p50", "p95"):
        assert abs(wait_bucket(latency[q] / 1000) - wait_bucket(truth[q] / 1000)) <= 1, q
    assert latency["max"] == pytest.approx(truth["max"])
    assert latency["mean"] == pytest.approx(truth["mean"])


def test_slow_batches_go_through_as_they_came():
    rows = [tuple(r) for r in fast_run(epochs=1, per_epoch=400)]
    slow = [r[:2] + (r[0] * 0.01, 0.004, 0.006) + r[5:] for r in rows]  # 100 batches/s
    thinner = Thinner(loose_below=WARMUP)
    out, windows = thinner.arrived(slow[:200])
    assert out == slow[:200] and windows == []
    assert thinner.flush() == ([], [])
    assert len(slow) / 4.0 < WINDOW_ABOVE_PER_S and KEEP_EVERY > 1


def test_a_late_gpu_timing_lands_on_its_batch_in_the_tail():
    rows = fast_run(epochs=1, per_epoch=20000)  # ~2.2 s
    thinner = Thinner(loose_below=WARMUP)
    thinner.arrived([tuple(r) for r in rows[:15000]])
    target = rows[14900].seq  # within the last second: still in the tail
    assert thinner.late(target, gpu_gap_ms=1.5)
    assert not thinner.late(rows[10].seq, gpu_gap_ms=1.0)  # gone out already
    kept, windows = thinner.flush()
    holder = next(w for w in windows if w.first_seq <= target <= w.last_seq)
    assert (holder.gaps, holder.gap_ms, holder.gap_max_ms) == (1, 1.5, 1.5)
    assert [b.gpu_gap_ms for b in kept if b.seq == target] in ([], [1.5])


def test_a_late_gpu_timing_lands_where_two_batches_came_out_of_order():
    rows = fast_run(epochs=1, per_epoch=6000)
    rows[3000], rows[3001] = rows[3001], rows[3000]  # (two iterators of one loader at once)
    thinner = Thinner(loose_below=WARMUP)
    thinner.arrived([tuple(r) for r in rows], hold=True)
    target = rows[5000].seq
    assert thinner.late(target, gpu_gap_ms=2.5)
    kept, windows = thinner.flush()
    holder = next(w for w in windows if w.first_seq <= target <= w.last_seq)
    assert (holder.gaps, holder.gap_ms) == (1, 2.5) and not thinner.timings
    assert [b.gpu_gap_ms for b in kept if b.seq == target] in ([], [2.5])


def test_gpu_timings_on_every_batch_are_folded_with_their_sums_exact():
    """On a GPU every batch has its idle gap timed: the rows are still thinned, the gaps'
    sum and largest exact, their median from the even sample."""
    rng = random.Random(4)
    rows = [b._replace(gpu_gap_ms=rng.uniform(0.01, 0.2) if b.seq % 500 else 30.0)
            for b in fast_run(seed=9, epochs=1, per_epoch=12000)]
    kept, windows = thinned(rows)
    assert len(kept) < len(rows) / 5
    sample, total, largest = BatchLog(kept, windows).gpu_gaps_ms(WARMUP)
    exact = [b.gpu_gap_ms for b in rows[WARMUP:]]
    assert total == pytest.approx(sum(exact)) and largest == max(exact) == 30.0
    folded = sum(w.batches for w in windows)
    assert sum(w.gaps for w in windows) == folded > 1000  # every folded batch's gap counted
    assert metrics.percentile(sample, 50) == pytest.approx(metrics.percentile(exact, 50),
                                                            rel=0.15)


def test_a_rate_that_falls_and_rises_again_keeps_every_batch_once():
    """Fast, then 300 batches at 100 a second (kept row by row), then fast again."""
    rows = fast_run(seed=2, epochs=1, per_epoch=9000)
    slow_from, slow_to = 4000, 4300
    t, changed = 0.0, []
    for b in rows:
        if slow_from <= b.seq < slow_to:
            b = b._replace(wait_s=0.004, step_s=0.006)
        changed.append(b._replace(t_request=t, fetch_start=None if b.fetch_s is None else t))
        t += changed[-1].wait_s + changed[-1].step_s
    kept, windows = thinned(changed)
    log = BatchLog(kept, windows)
    assert log.batches == len(changed)
    assert {b.seq for b in changed[slow_from + 50:slow_to - 50]} <= {b.seq for b in log.loose}
    assert any(w.first_seq > slow_to for w in windows) and any(
        w.last_seq < slow_from for w in windows)
    exact = metrics.steady_state(changed, WARMUP)
    assert log.steady_state(WARMUP).samples_per_s == pytest.approx(exact.samples_per_s)


def test_a_row_out_of_order_holds_the_tail_until_its_own_end_is_old_enough():
    """Two iterators of one watched loader at once can let a row that ends later come before
    rows that end sooner: the tail goes out up to it, not past it (a late GPU timing still
    finds it)."""
    rows = fast_run(epochs=1, per_epoch=20_000, workers=0)  # ~2 s of batches
    late = rows[1000]._replace(step_s=rows[15_000].t_ready - rows[1000].t_ready)
    thinner = Thinner(loose_below=WARMUP)
    out, _ = thinner.arrived(rows[:1000] + [late] + rows[1001:])
    assert thinner.tail[0].seq == 1000  # not let out: it ended less than TAIL_S ago
    assert thinner.late(1000, gpu_gap_ms=1.5) and max(r.seq for r in out) < 1000


def test_the_tail_goes_out_by_the_clock_when_batches_stop():
    rows = fast_run(epochs=1, per_epoch=3000)  # ~0.3 s: all of it in the tail
    thinner = Thinner(loose_below=WARMUP)
    assert thinner.arrived([tuple(r) for r in rows]) == ([], [])
    end = rows[-1].t_ready + rows[-1].step_s
    assert thinner.take(now=end + 0.5) == ([], [])  # less than TAIL_S since: held
    kept, windows = thinner.take(now=end + 1.5)  # the loop went away (validation, a save)
    assert BatchLog(kept, windows).batches == len(rows) and not thinner.tail


def test_the_even_sample_weighs_each_batch_once_and_every_worker():
    rows = fast_run(seed=8, workers=4)
    kept, windows = thinned(rows)
    log = BatchLog(kept, windows)
    weighted = log.weighted()
    assert sum(w for _, w in weighted) == pytest.approx(len(rows))
    share = Counter(b.worker_id for b, _ in weighted)
    assert all(n > len(weighted) / 6 for n in share.values()) and len(share) == 4
    exact = metrics.percentile([b.step_s for b in rows[WARMUP:]], 50)
    assert log.median(lambda b: b.step_s, WARMUP) == pytest.approx(exact, rel=0.05)


def test_a_late_timing_finds_its_row_by_number_where_rows_are_a_sample():
    rows = fast_run(seed=6, epochs=1)
    kept, windows = thinned(rows)
    live = LiveRun("fast.py")
    live.apply(protocol.Batches([tuple(b) for b in kept]))
    target = kept[len(kept) // 2].seq
    live.apply(protocol.LateTimings(gaps=[[target, 2.5]], copies=[]))
    assert [b.gpu_gap_ms for b in live.batches if b.seq == target] == [2.5]


def test_a_live_run_and_its_recent_view_count_the_windows():
    rows = fast_run(seed=3)
    kept, windows = thinned(rows)
    live = LiveRun("fast.py")
    live.warmup_batches = WARMUP
    live.apply(protocol.Batches([tuple(b) for b in kept]))
    live.apply(protocol.Windows([w.to_row() for w in windows]))
    result = live.profile_result("ok")
    assert result.batches == len(rows)
    assert result.steady_batches == len(rows) - WARMUP
    exact = metrics.steady_state(rows, WARMUP)
    assert result.samples_per_s == pytest.approx(exact.samples_per_s)
    view = live.recent(300)
    counted = BatchLog(view.batches, view.windows)
    # its first window on, after the last row kept before it (which starts its clock)
    since = [b for b in rows if b.seq >= view.windows[0].first_seq]
    assert view.batches[0].seq < since[0].seq
    assert counted.batches == 1 + len(since)
    assert counted.steady_state(1).samples == sum(b.samples for b in since)


class RawRowsHandle(RunHandle):
    """A real run whose child's rows are also kept as they arrived, before the thinner."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.raw: list[BatchRecord] = []

    def _apply(self, event) -> None:
        if isinstance(event, protocol.Batches):
            self.raw.extend(BatchRecord.from_row(row) for row in event.rows)
        super()._apply(event)


def test_a_fast_loader_s_run_is_kept_in_windows_with_its_figures_exact(tmp_path):
    """tests/real/long_tail.py at 0 workers: ~40-120 us batches, 92 an epoch."""
    store = RunStore(str(tmp_path / "runs.db"))
    target = os.path.join(os.path.dirname(__file__), "real", "long_tail.py")
    handle = RawRowsHandle(RunRequest(target=target, seconds=2.0, sample_stacks=False), store)
    with handle:
        handle.wait(60)
    result = store.get_run(handle.run_id).result
    rows, windows = store.batches(handle.run_id), store.windows(handle.run_id)
    raw = handle.raw
    print(f"{len(raw)} batches, {len(rows)} rows kept, {len(windows)} windows")
    assert result.status == "ok" and windows and len(rows) < len(raw) / 4
    assert result.batches == len(raw) == BatchLog(rows, windows).batches
    exact = metrics.steady_state(raw, result.warmup_batches)
    assert result.steady_batches == exact.batches
    assert result.samples_per_s == pytest.approx(exact.samples_per_s, rel=1e-9)
    truth = metrics.latency_ms([b.wait_s for b in raw[result.warmup_batches:]])
    for q in ("p50", "p95"):
        found = result.batch_latency_ms[q] / 1000
        assert abs(wait_bucket(found) - wait_bucket(truth[q] / 1000)) <= 1, q
    assert result.counting["windows"]["from_batches_per_s"] > WINDOW_ABOVE_PER_S
    assert "a row is one batch, not a window" in profile_text(result)
    # the history's run reads back to the same figures (its times kept to the microsecond:
    # NOTE [ A history's rows, kept small ])
    again = LiveRun.stored(store, handle.run_id).profile_result("ok")
    assert again.batches == result.batches
    assert again.samples_per_s == pytest.approx(result.samples_per_s, rel=1e-6)
    assert live_descendants() == []


@pytest.mark.slow  # 2.4 s: the quick loop has a watched fast loop's rows and windows (below)
@pytest.mark.host_speed
def test_a_watched_fast_loader_is_written_in_windows_and_its_figures_hold(tmp_path,
                                                                           monkeypatch):
    """watch() on an in-memory loader at 0 workers (tens of microseconds a batch): the
    history keeps windows and few rows; the batches counted and the rate agree with the
    loop's own count and clock, in the result and on the Training jobs page while it runs."""
    import time

    import torch
    from torch.utils.data import DataLoader, TensorDataset

    from dataloader_tuner import watch
    from dataloader_tuner.dashboard import job_board

    db = str(tmp_path / "runs.db")
    data = TensorDataset(torch.randn(32 * 4000, 4), torch.arange(32 * 4000))
    watched = watch(DataLoader(data, batch_size=32), name="fast", db=db)
    count, samples, first_end, read_at = 0, 0, None, None
    step_ends: list[float] = []  # the loop's own clock: batch i's step ends at step_ends[i]
    for epoch in range(60):
        for x, _ in watched:
            count += 1
            if first_end is None:
                first_end = time.perf_counter()  # the warm-up batch's step ends here
            else:
                samples += len(x)
            step_ends.append(time.perf_counter())
        if read_at is not None:  # one epoch after the page's read, the job ends
            break
        # The page, while the job runs: its latest batches' rate. The last second's batches
        # are held to be folded (TAIL_S), so it reads once more than that has run: at a
        # fixed epoch (3), a host running ~10,000 batches/s had folded only 1,317 then.
        if time.perf_counter() - first_end > TAIL_S + 0.6:
            read_at = epoch
            watched.recorder.flush()
            read = []  # the stretch the page's rate is read from (the recorder writes on)
            recent = job_board._recent
            monkeypatch.setattr(job_board, "_recent",
                                lambda *args: read.append(recent(*args)) or read[-1])
            running_rate = job_board.read_board(RunStore(db)).rates[watched.run_id]
            monkeypatch.undo()
            stretch = read[0][watched.run_id]
    own_rate = samples / (time.perf_counter() - first_end)
    result = watched.close()
    store = RunStore(db)
    rows, windows = store.batches(watched.run_id), store.windows(watched.run_id)
    # the loop's own rate over the stretch the page read (the host's speed drifts by a quarter
    # between a run's halves: only the same batches compare)
    first, last = stretch[0][0].seq, max([w.last_seq for w in stretch[1]]
                                         + [r.seq for r in stretch[0]])
    own_then = 32 * (last - first) / (step_ends[last] - step_ends[first])
    print(f"{count} batches, {len(rows)} rows, {len(windows)} windows; samples/s: "
          f"{result.samples_per_s:.0f} the tool's, {own_rate:.0f} the loop's own, "
          f"{running_rate:.0f} on the page while running ({own_then:.0f} the loop's over "
          f"batches {first}-{last})")
    assert windows and len(rows) < count / 4
    assert result.batches == count == BatchLog(rows, windows).batches
    assert result.samples_per_s == pytest.approx(own_rate, rel=0.05)
    assert stretch[1] and last - first > 2000  # thousands of batches from a few hundred rows
    assert running_rate == pytest.approx(own_then, rel=0.05)


def test_a_watched_fast_loop_builds_rows_only_for_the_batches_it_keeps(tmp_path, monkeypatch):
    """A watched fast loop's batches are folded as taken (record/taken.TakenForm): the
    recorder's thread builds a row only for a batch kept whole, not one for every batch (as
    it did before, ~1.1 us of a ~100 us batch), and the windows still count every batch."""
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    from dataloader_tuner import watch
    from dataloader_tuner.record import taken

    built: list[int] = []
    rows_of_taken = taken.rows_of_taken

    def counted(t0, batches):
        built.append(len(batches))
        return rows_of_taken(t0, batches)

    monkeypatch.setattr(taken, "rows_of_taken", counted)
    db = str(tmp_path / "runs.db")
    # (4 samples a batch: ~10 us, well past 2,000 batches a second on a loaded host too)
    data = TensorDataset(torch.randn(4 * 3000, 4), torch.arange(4 * 3000))
    watched = watch(DataLoader(data, batch_size=4), name="fast", db=db)
    count = sum(1 for _ in range(3) for _batch in watched)
    watched.close()
    store = RunStore(db)
    rows, windows = store.batches(watched.run_id), store.windows(watched.run_id)
    assert windows and BatchLog(rows, windows).batches == count == 9000
    assert sum(built) == len(rows) < count / 2  # (the recorder's recent batches: not rows)


def test_a_trace_of_a_windowed_run_has_its_windows_on_a_track_of_their_own():
    from dataloader_tuner.analyse.chrome_trace import WINDOWS_TID, chrome_trace

    rows = fast_run(seed=5, epochs=1)
    kept, windows = thinned(rows)
    doc = chrome_trace(kept, [], main_pid=7, windows=windows)
    slices = [e for e in doc["traceEvents"] if e["ph"] == "X" and e.get("tid") == WINDOWS_TID]
    waits = [e for e in doc["traceEvents"] if e["ph"] == "X" and e["name"] == "wait in next()"]
    assert len(slices) == len(windows) and len(waits) == len(kept)
    assert sum(int(e["name"].split()[0]) for e in slices) == sum(w.batches for w in windows)
    assert sum(e["args"]["samples"] for e in slices) + sum(
        b.samples for b in BatchLog(kept, windows).loose) == sum(b.samples for b in rows)


def test_the_charts_of_a_windowed_run_count_every_batch():
    """The charts read the windows where rows are a sample: the latency histogram counts
    every batch after the warm-up, the compared distributions' median is the exact one within
    a bucket, and the throughput over time is every row's."""
    import numpy as np

    from dataloader_tuner.dashboard import charts

    rows = fast_run(seed=11)
    kept, windows = thinned(rows)
    figure = charts.batch_latency_figure(kept, WARMUP, windows)
    bars = next(t for t in figure.data if t.type == "bar")
    assert sum(bars.y) == len(rows) - WARMUP
    spikes = next(t for t in figure.data if t.name.startswith("largest wait in a"))
    inside = [b.wait_s for b in rows if any(w.first_seq <= b.seq <= w.last_seq for w in windows)]
    assert max(spikes.y) == pytest.approx(max(inside) * 1000)  # (start-ups are rows)
    cdf = charts.compare_latency_figure([("fast", kept, WARMUP)], [windows]).data[0]
    median_ms = cdf.x[int(np.searchsorted(cdf.y, 0.5))]
    exact = metrics.percentile([b.wait_s for b in rows[WARMUP:]], 50)
    assert abs(wait_bucket(median_ms / 1000) - wait_bucket(exact)) <= 1
    x, y = charts.throughput_over_time(kept, 0.5, windows)
    x_all, y_all = charts.throughput_over_time(rows, 0.5)
    assert x == x_all and y == pytest.approx(y_all, rel=0.02)  # windows spread over their span


@pytest.mark.slow  # 2.4 s: the quick loop has a failing history's retry (test_watch)
def test_a_windowed_watched_run_whose_writes_fail_keeps_every_batch_once(tmp_path, monkeypatch):
    """The history refuses two flushes of a fast watched loader (its rows and windows held
    for the retry), then takes them: every batch counted once."""
    import sqlite3

    import torch
    from torch.utils.data import DataLoader, TensorDataset

    import dataloader_tuner.store as store_module
    from dataloader_tuner import watch

    real, refused = store_module.write_event, {"left": 2}

    def flaky(conn, run_id, event):
        if refused["left"] and isinstance(event, (protocol.Windows, protocol.Batches)):
            refused["left"] -= 1
            raise sqlite3.OperationalError("database is locked")
        real(conn, run_id, event)

    db = str(tmp_path / "runs.db")
    data = TensorDataset(torch.randn(32 * 3000, 4), torch.arange(32 * 3000))
    watched = watch(DataLoader(data, batch_size=32), name="fast", db=db)
    monkeypatch.setattr(store_module, "write_event", flaky)
    count = 0
    for _ in range(5):
        for _batch in watched:
            count += 1
            if count % 2000 == 0:
                watched.recorder.flush()
    result = watched.close()
    store = RunStore(db)
    rows, windows = store.batches(watched.run_id), store.windows(watched.run_id)
    assert refused["left"] == 0 and windows
    assert result.batches == count == BatchLog(rows, windows).batches
    assert len({b.seq for b in rows}) == len(rows)


@pytest.mark.slow  # 70,000 batches over two flushes of 1.2 s: ~4 s
def test_gpu_gaps_of_rows_that_arrive_already_old_are_not_lost(tmp_path, monkeypatch):
    """A watched fast loader on a GPU (stand-in events: each pair done a batch later) whose
    recorder flushes more than TAIL_S apart (a busy job starving its thread; on an H100, 908 of
    20,000 gaps were lost so): its rows reach the tail already old enough to fold, and their
    gaps, resolved meanwhile, go onto them first. Before, the gaps were put on the tail before
    the rows came in, and the rows were folded without them: 14,267 of 45,000 counted."""
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    from dataloader_tuner import watch
    from dataloader_tuner.run import recorder

    from .test_gpu_timing import FakeEvent, gaps

    monkeypatch.setattr(recorder, "FLUSH_S", 1.2 * TAIL_S)
    n = 70_000  # ~2 s of batches here (45,000 took 1.26-1.35 s, near the one flush's 1.2 s)
    watched = watch(DataLoader(TensorDataset(torch.arange(n)), batch_size=1), name="fast",
                    db=str(tmp_path / "runs.db"))
    watched.ledger.gaps = gaps()
    started = time.monotonic()
    for _ in watched:
        FakeEvent.clock += 0.01
    watched.ledger.gaps.resolved()  # (the last pair: no batch after it to carry it)
    seconds = time.monotonic() - started
    watched.close()
    store = RunStore(str(tmp_path / "runs.db"))
    rows, windows = store.batches(watched.run_id), store.windows(watched.run_id)
    log = BatchLog(rows, windows)
    counted = (sum(1 for b in log.loose if b.gpu_gap_ms is not None)
               + sum(w.gaps for w in windows))
    assert seconds > recorder.FLUSH_S, "premise: rows came in over more than one flush"
    assert windows and log.batches == n
    assert counted >= n - 2, counted


def test_an_engine_run_s_late_gpu_timings_reach_the_rows_of_a_flush_that_came_late():
    """The engine's child sends a flush's rows, then their late GPU timings. A flush that came
    over TAIL_S late (a parent slow to read its pipe) holds rows already old enough to fold:
    they wait in the tail for the timings. Before, the first second of each such flush was
    folded without its gaps (18,189 of 20,000 counted here)."""
    from dataloader_tuner.run.runner import RunHandle

    rows = fast_run(seed=3, epochs=1, per_epoch=20_000)  # ~2 s of batches
    assert rows[-1].t_ready - rows[0].t_ready > 2 * TAIL_S
    handle = RunHandle(RunRequest(target="fast.py"), None)
    for flush in (rows[:10_000], rows[10_000:]):  # two flushes, each ~1 s of rows
        handle._apply(protocol.Batches([tuple(row) for row in flush]))
        handle._apply(protocol.LateTimings([(row.seq, 0.5) for row in flush], []))
    handle._apply(protocol.Finished("done", rows[-1].t_ready))
    log = BatchLog(handle.live.batches, handle.live.windows)
    counted = (sum(1 for b in log.loose if b.gpu_gap_ms is not None)
               + sum(w.gaps for w in handle.live.windows))
    assert handle.live.windows and log.batches == len(rows)
    assert counted == len(rows)


def _cuts_one_by_one(epochs, starts, ends) -> list[int]:
    """The windows' cuts as the fold first found them, batch by batch."""
    cuts, begin, epoch = [0], starts[0], epochs[0]
    for i in range(1, len(ends)):
        if epochs[i] != epoch or ends[i] - begin > WINDOW_S:
            cuts.append(i)
            begin, epoch = starts[i], epochs[i]
    return cuts + [len(ends)]


@pytest.mark.parametrize("case", ["in order", "two epochs", "out of order", "epochs at once"])
def test_windows_are_cut_where_batch_by_batch_cut_them(case):
    """The bisects (one iterator's batches, ending in order) and the loop they stand in for
    find the same cuts, on batches of irregular lengths; an epoch's start or batches out of
    order take the loop."""
    rng = random.Random(7)
    starts, ends, t = [], [], 0.0
    for _ in range(5000):
        wait, step = rng.expovariate(1 / 40e-6), rng.choice([10e-6, 20e-6, 3e-3])
        starts.append(t)
        ends.append(t + wait + step)
        t += wait + step
    epochs = [0] * 5000 if case != "two epochs" else [0] * 2500 + [1] * 2500
    if case == "out of order":
        ends[100], ends[101] = ends[101], ends[100]
    if case == "epochs at once":  # (two iterators of one watched loader taking turns)
        epochs = [(i // 3) % 2 for i in range(5000)]
    cuts = window_cuts(epochs, starts, ends)
    assert cuts == _cuts_one_by_one(epochs, starts, ends)
    assert len(cuts) > 20 and (case != "two epochs" or 2500 in cuts)
