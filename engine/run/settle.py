"""Runs whose writer is gone, settled when the history is read: finished where they ended
with an epoch run out, else lost.

NOTE [ Runs ended without a word ]

    A watched job's runs end with its process: at exit, or on SIGTERM (watcher/shutdown.py).
    Some launchers end the process with neither: Ray Train kills its worker actors once the
    training function returns (no atexit, and no SIGTERM handler can be set from the thread
    it runs that function in), Slurm and Kubernetes send SIGKILL when SIGTERM's grace runs out
    (a job whose own SIGTERM handler is still at work), the kernel's OOM killer. Such a run was
    "lost", with no result, though its training had completed. So each watched epoch that runs
    out is said at once (EpochEnded), its rows written with it, none held back (the last
    batches' GPU idle gaps, resolved after their rows are folded, may be left out). A run whose
    writer is gone and whose last written batch is its last ended epoch's last, with no epoch
    begun after it, ended there: it is finished ("ok"), its result summarised from its rows,
    its end its writer's last heartbeat. A run cut mid-epoch stays "lost", with every batch
    written before (all but the last FLUSH_S). A job killed between two epochs of its training
    reads as finished after the last one: the history cannot tell that from a loop that
    completed, and its epochs say how far it got.
"""

from __future__ import annotations

from dataloader_tuner import protocol
from dataloader_tuner.run.sinks import finish_stored
from dataloader_tuner.store import RunStore


def settle_dead_runs(store: RunStore) -> list[int]:
    """Runs whose writer is gone (store.mark_lost_runs): finished where they ended with an
    epoch run out, else lost. Returns the lost ones' ids."""
    lost = []
    for run_id in store.mark_lost_runs():
        ended = ended_with_epoch(store, run_id)
        if ended is None:
            lost.append(run_id)
        else:  # (ended at its last heartbeat, as mark_lost_runs wrote)
            run = store.get_run(run_id)
            finish_stored(store, run_id, "ok", ended.t, None, run.ended_at if run else None)
    return lost


def ended_with_epoch(store: RunStore, run_id: int) -> protocol.EpochEnded | None:
    """The run's last epoch run out, where nothing came after it: no epoch begun, no batch
    written (None: it was cut mid-epoch, or said no epoch's end)."""
    ended = [e for e in store.events(run_id, protocol.EpochEnded.kind)
             if isinstance(e, protocol.EpochEnded)]
    if not ended:
        return None
    last = max(ended, key=lambda e: e.batches)
    begun = [e.epoch for e in store.events(run_id, protocol.Epoch.kind)
             if isinstance(e, protocol.Epoch)]
    if any(epoch > last.epoch for epoch in begun):
        return None
    seq = store.last_seq(run_id)
    return last if seq is None or seq < last.batches else None
