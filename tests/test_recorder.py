"""One recorder for the engine's child and a watched loader (run/recorder.py): what it
writes to its sink, in what order, and its one policy when the sink cannot be written."""

import time

import pytest

from dataloader_tuner import protocol
from dataloader_tuner.run import recorder as recording
from dataloader_tuner.run.recorder import Recorder
from dataloader_tuner.run.live import LiveRun

from .records import make_batches


class ListSink:
    """A sink into a list that fails while ``failing`` is set."""

    where = "a test list"

    def __init__(self) -> None:
        self.written: list = []
        self.failing = False

    def write(self, events):
        if self.failing:
            raise OSError("disk full")
        self.written.extend(events)


def _rows(first: int, n: int) -> list[tuple]:
    return [b._replace(seq=first + i).to_row() for i, b in enumerate(make_batches(n))]


def _taken(first: int, n: int, t0: float = 0.0) -> list[tuple]:
    """``n`` batches as a watched loop takes them (record/taken.py), numbered from ``first``."""
    return [(first + i, b.epoch, t0 + b.t_request, t0 + b.t_ready, t0 + b.t_ready + b.step_s,
             (b.worker_id, b.worker_pid, b.samples), (None, None, None))
            for i, b in enumerate(make_batches(n))]


def test_events_go_before_the_rows_and_late_timings_wait_for_their_rows():
    sink = ListSink()
    recorder = Recorder(sink, time.monotonic(), keep_recent=True)
    recorder.epoch_began(0, 0.0, 0.05)
    recorder.taken.extend(_taken(0, 3))
    recorder.gaps.extend([(2, 1.5), (3, 2.5)])  # batch 3's row has not come yet
    recorder.flush()
    assert [type(e).kind for e in sink.written] == ["epoch", "batches", "late_timings"]
    assert sink.written[2].gaps == [(2, 1.5)] and recorder.gaps == [(3, 2.5)]
    recorder.taken.extend(_taken(3, 1))
    recorder.copies.append((3, 0.4, None))
    recorder.flush()
    assert sink.written[-1] == protocol.LateTimings([(3, 2.5)], [(3, 0.4, None)])
    assert not recorder.gaps and not recorder.copies and len(recorder.recent or ()) == 4
    assert Recorder(ListSink(), time.monotonic()).recent is None  # the engine keeps none


def test_a_failed_write_is_reported_once_kept_and_capped(monkeypatch, capsys):
    monkeypatch.setattr(recording, "MAX_BACKLOG", 5)
    sink = ListSink()
    recorder = Recorder(sink, time.monotonic())
    sink.failing = True
    recorder.taken.extend(_taken(0, 4))
    recorder.flush()
    recorder.taken.extend(_taken(4, 4))
    recorder.flush()
    err = capsys.readouterr().err
    assert err.count("could not write the measurements to a test list") == 1
    assert [row[0] for row in recorder.taken] == [3, 4, 5, 6, 7]  # the newest MAX_BACKLOG
    sink.failing = False
    recorder.flush()
    assert [row[0] for row in sink.written[0].rows] == [3, 4, 5, 6, 7] and not recorder.taken


def test_the_thread_flushes_every_tick_samples_every_second_and_runs_on_tick(monkeypatch):
    monkeypatch.setattr(recording, "FLUSH_S", 0.02)
    sink, ticks = ListSink(), []
    recorder = Recorder(sink, time.monotonic()).start(
        first=lambda: protocol.Finished("first", 0.0), on_tick=lambda: ticks.append(1) and False)
    recorder.taken.extend(_taken(0, 2))
    time.sleep(0.3)
    recorder.stop(sample=False)
    kinds = [type(e).kind for e in sink.written]
    assert kinds[0] == "finished" and kinds.count("batches") == 1
    assert kinds.count("resources") >= 3 and len(ticks) >= 5
    assert not recorder._thread.is_alive()


def test_a_tick_that_says_stop_ends_the_thread(monkeypatch):
    monkeypatch.setattr(recording, "FLUSH_S", 0.01)
    recorder = Recorder(ListSink(), time.monotonic()).start(on_tick=lambda: True)
    recorder._thread.join(2.0)
    assert not recorder._thread.is_alive()


def test_stop_cuts_the_first_records_wait_short_and_still_writes_it_first():
    def first():
        recorder.sleep_unless_stopped(60.0)  # as a snapshot's load interval does
        return protocol.Finished("first", 0.0)

    recorder = Recorder(ListSink(), time.monotonic())
    recorder.start(first=first)
    recorder.taken.extend(_taken(0, 2))
    time.sleep(0.1)
    started = time.monotonic()
    recorder.stop(sample=False)
    assert time.monotonic() - started < 4.0  # its join gives up at 5 s
    kinds = [type(e).kind for e in recorder.sink.written]
    assert kinds == ["finished", "batches"] and not recorder._thread.is_alive()


def test_the_machines_load_is_read_over_the_time_actually_waited():
    from dataloader_tuner import system

    asked = []
    load = system.other_processes_cpu(30.0, wait=asked.append)  # returns at once
    assert asked == [30.0] and load == 0.0  # too short to read: not measured
    assert system.other_processes_cpu(30.0, wait=lambda _: time.sleep(0.1)) >= 0.0


@pytest.mark.parametrize("first", [0, 40])
def test_a_live_run_puts_late_timings_on_their_batches(first):
    live = LiveRun("t")
    live.apply(protocol.Batches(_rows(first, 5)))
    live.apply(protocol.LateTimings([(first + 1, 2.0), (first + 9, 1.0)],
                                    [(first + 4, 0.5, 0.9)]))
    assert [b.gpu_gap_ms for b in live.batches] == [None, 2.0, None, None, None]
    assert (live.batches[4].h2d_ms, live.batches[4].h2d_other_ms) == (0.5, 0.9)


def test_a_batch_whose_row_cannot_be_built_is_dropped_said_once_and_the_rest_go_on(capsys):
    """Rows are built on the recorder's thread (record/taken.py): a malformed batch there (a
    bug of ours) is dropped and said once; nothing raises, and later batches are written."""
    sink = ListSink()
    recorder = Recorder(sink, time.monotonic())
    recorder.taken.append((0, 0, 0.0, 0.1, 0.2, "not a meta", (None, None, None)))
    recorder.flush()
    recorder.taken.extend(_taken(1, 2))
    recorder.flush(last=True)
    assert capsys.readouterr().err.count("could not write the measurements") == 1
    assert [row[0] for e in sink.written if e.kind == "batches" for row in e.rows] == [1, 2]
    assert not recorder.taken


def test_a_fast_batch_a_fold_cannot_read_is_dropped_once_and_later_windows_are_written(capsys):
    """A watched fast loop's batches are folded on the recorder's thread (record/windows.py):
    one a fold cannot read (a bug of ours) loses its flush's batches, said once; it does not
    stay in the thinner's tail to fail every later flush while the tail grows."""
    t0 = time.monotonic() - 10.0  # (every batch below is older than the tail holds)

    def fast(first: int, n: int) -> list[tuple]:  # 10,000 batches a second
        return [(seq, 0, t0 + seq * 1e-4, t0 + seq * 1e-4 + 5e-5, t0 + (seq + 1) * 1e-4,
                 (-1, 1, 32), (None, None, None)) for seq in range(first, first + n)]

    sink = ListSink()
    recorder = Recorder(sink, t0, windows_after=0)
    bad = fast(0, 400)
    bad[200] = bad[200][:5] + ("not a meta",) + bad[200][6:]
    recorder.taken.extend(bad)
    recorder.flush()
    recorder.taken.extend(fast(400, 400))
    recorder.flush()
    recorder.flush(last=True)
    assert capsys.readouterr().err.count("could not write the measurements") == 1
    from dataloader_tuner.analyse.batch_log import BatchLog
    from dataloader_tuner.record.windows import BatchWindow

    windows = [BatchWindow.from_row(w) for e in sink.written if e.kind == "windows"
               for w in e.windows]
    rows = [row for e in sink.written if e.kind == "batches" for row in e.rows]
    assert windows and min(w.first_seq for w in windows) >= 400  # the second flush's, folded
    assert BatchLog(rows, windows).batches == 400
    assert not recorder.taken and not recorder.windowed.thinner.tail
