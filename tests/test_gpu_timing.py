"""The watched job's GPU idle gaps from CUDA events, resolved lazily: the logic, with stand-in
events (no GPU here), and what happens without CUDA."""

import pytest
import torch

from dataloader_tuner.instrument.gpu_events import MAX_PENDING, StepGaps


class FakeEvent:
    """Completes after ``ready_after`` queries; ``elapsed_time`` from made-up GPU clock times.
    ``synchronize`` must never be called: the watcher must not stall the host."""

    clock = 0.0

    def __init__(self) -> None:
        self.recorded_at = None
        self.queries = 0

    def record(self, stream) -> None:
        assert stream == "stream"
        self.recorded_at = FakeEvent.clock

    def query(self) -> bool:
        self.queries += 1
        return self.queries > 1  # not done when first asked, done a batch later

    def elapsed_time(self, other: "FakeEvent") -> float:
        return other.recorded_at - self.recorded_at

    def synchronize(self) -> None:
        raise AssertionError("synchronize() would make the host wait for the GPU")


def gaps(in_use: bool = True) -> StepGaps:
    return StepGaps(FakeEvent, lambda: "stream", lambda: in_use)


def test_gaps_are_resolved_a_batch_later_without_waiting():
    timer = gaps()
    found = []
    for seq, wait_ms in enumerate([5.0, 0.0, 12.5]):
        timer.asking()
        FakeEvent.clock += wait_ms
        timer.handed(seq)
        found += timer.resolved()
    found += timer.resolved()
    assert found == [(0, 5.0), (1, 0.0), (2, 12.5)]


def test_nothing_is_recorded_until_the_job_uses_cuda():
    timer = gaps(in_use=False)
    timer.asking()
    timer.handed(0)
    assert not timer.pending and timer.resolved() == []


def test_pending_pairs_are_bounded():
    timer = gaps()
    timer.pending.extend((i, FakeEvent(), FakeEvent()) for i in range(MAX_PENDING))
    timer.asking()
    timer.handed(MAX_PENDING)
    assert len(timer.pending) == MAX_PENDING and timer.pending[0][0] == 1


def test_without_a_gpu_there_is_no_timer():
    if torch.cuda.is_available():
        pytest.skip("a GPU is visible")
    assert StepGaps.create() is None


def test_a_watched_loop_stores_its_gaps_with_its_batches(db_path):
    """The wiring: gaps resolved after their batch land on that batch's row in the history
    (stand-in events in place of CUDA's)."""
    from torch.utils.data import DataLoader

    from dataloader_tuner import RunStore, watch

    class SlowToLoad(torch.utils.data.Dataset):
        def __len__(self):
            return 40

        def __getitem__(self, index):
            FakeEvent.clock += 0.5  # while the loop waits for a batch, the GPU idles
            return index

    watched = watch(DataLoader(SlowToLoad(), batch_size=4), name="gpu", db=db_path)
    watched.ledger.gaps = gaps()
    for _ in watched:
        pass
    watched.ledger.gaps.resolved()  # the last pair completes; it has no batch after it to carry it
    watched.close()
    stored = RunStore(db_path).batches(watched.run_id)
    measured = [b.gpu_gap_ms for b in stored if b.gpu_gap_ms is not None]
    assert len(stored) == 10 and len(measured) >= 8 and set(measured) == {2.0}


def test_copies_through_loader_to_keep_the_batch_and_are_timed(db_path, monkeypatch):
    from collections import namedtuple

    from torch.utils.data import DataLoader

    import dataloader_tuner.instrument.gpu_events as timing
    import dataloader_tuner.watcher.loader as watched_loader
    from dataloader_tuner import RunStore, watch
    from dataloader_tuner.instrument.gpu_events import CopyTimes

    Pair = namedtuple("Pair", "image label")

    def collate(samples):
        return Pair(torch.stack([s for s in samples]), {"ids": torch.arange(len(samples))})

    watched = watch(DataLoader(torch.ones(40, 3), batch_size=4, collate_fn=collate),
                    name="copies", db=db_path)
    assert watched.copies is None or torch.cuda.is_available()  # no CUDA: nothing timed...
    batch = next(iter(watched))
    same = watched.to(batch, "cpu")  # ...and the batch still moves, its structure kept
    assert type(same) is Pair and same.image.shape == (4, 3) and "ids" in same.label
    monkeypatch.setattr(watched_loader, "_is_cuda", lambda device: True)  # as on a GPU
    monkeypatch.setattr(timing, "COMPARE_EVERY", 10**9)  # pinning needs an accelerator
    watched.copies = CopyTimes(FakeEvent, lambda device: "stream")
    for batch in watched:
        watched.to(batch, "cpu")
    watched.recorder.copies.extend(watched.copies.resolved())
    watched.close()
    timed = [b.h2d_ms for b in RunStore(db_path).batches(watched.run_id) if b.h2d_ms is not None]
    assert len(timed) >= 8


class TickingEvent(FakeEvent):
    """Each record one tick after the last: the copies between two records cost one tick."""

    def record(self, stream) -> None:
        FakeEvent.clock += 1.0
        super().record(stream)


class SlowTwin:
    """The other memory kind's copy of a tensor, three ticks slower than the batch's own."""

    def to(self, device, non_blocking=False):
        FakeEvent.clock += 3.0


def test_the_other_kind_is_read_from_a_like_for_like_pair_after_the_loops_copy(monkeypatch):
    """NOTE [ Comparing memory kinds ]: on a compared batch the loop's own copy comes first;
    then the batch's tensors are copied again in their kind and once in the other, the order
    swapped from one compared batch to the next, and the other kind's figure is the loop's
    copy scaled by the pair's ratio (own 1 tick, same 1, other 4: 4)."""
    import dataloader_tuner.instrument.gpu_events as timing
    from dataloader_tuner.instrument.gpu_events import CopyTimes, other_kind_ms

    assert other_kind_ms(0.09, 0.038, 0.016) == pytest.approx(0.09 * 0.016 / 0.038)
    assert other_kind_ms(0.09, 0.0, 0.016) is None
    monkeypatch.setattr(timing, "COMPARE_EVERY", 2)
    timer = CopyTimes(TickingEvent, lambda device: "stream",
                      twins=lambda tensors: [SlowTwin() for _ in tensors])
    for seq in range(4):
        timer.copy(seq, torch.ones(3), "cpu", non_blocking=False)
    pairs = [entry[3] for entry in timer.pending]
    assert pairs[0] is None and pairs[2] is None
    (same1, other1, _), (same3, other3, _) = pairs[1], pairs[3]
    end_of_own = timer.pending[1][2].recorded_at
    assert end_of_own < other1[0].recorded_at < same1[0].recorded_at  # own, other, same
    assert timer.pending[3][2].recorded_at < same3[0].recorded_at < other3[0].recorded_at
    assert [pairs[1].last, pairs[3].last] == [same1[1], other3[1]]  # each one's last
    done = []
    for _ in range(8):  # (each fake event is done the second time it is asked)
        done += timer.resolved()
    assert [(seq, own, other) for seq, own, other in done] == [
        (0, 1.0, None), (1, 1.0, 4.0), (2, 1.0, None), (3, 1.0, 4.0)]


def test_moving_keeps_mappings_and_objects_that_move_themselves():
    from collections import UserDict, defaultdict

    from dataloader_tuner.instrument.tensors import moved

    class Graph:
        def __init__(self):
            self.moved_to = None

        def to(self, device, non_blocking=False):
            self.moved_to = device
            return self

    encoding = UserDict({"input_ids": torch.ones(2, 3)})
    counts = defaultdict(list, {"x": torch.zeros(1)})
    graph = Graph()
    out = moved([encoding, counts, graph, "text"], "cpu", False)
    assert type(out[0]) is UserDict and out[0]["input_ids"].shape == (2, 3)
    assert type(out[1]) is defaultdict and out[1].default_factory is list
    assert out[2].moved_to == "cpu" and out[3] == "text"
