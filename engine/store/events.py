"""What each event a run's writer sends writes into the history's tables."""

from __future__ import annotations

import json
import sqlite3

from dataloader_tuner import protocol
from dataloader_tuner.bulk_sql import insert_rows, update_by_seq
from dataloader_tuner.record.rows import BATCH_COLUMNS
from dataloader_tuner.store.compact import stored_batch, stored_body, stored_timing
from dataloader_tuner.store.schema import RESOURCE_COLUMNS, WINDOW_COLUMNS


def write_event(conn: sqlite3.Connection, run_id: int, event: protocol.Event) -> None:
    """One event into the tables it belongs in (the caller holds the transaction)."""
    # (many rows to a statement: NOTE [ One statement for many rows ], bulk_sql.py)
    if isinstance(event, protocol.Batches):
        # (kept small: NOTE [ A history's rows, kept small ], store/compact.py)
        insert_rows(conn, "batch_rows", ("run_id", *BATCH_COLUMNS),
                    [(run_id, *stored_batch(row)) for row in event.rows])
        return
    if isinstance(event, protocol.Windows):
        insert_rows(conn, "batch_windows", ("run_id", *WINDOW_COLUMNS),
                    [(run_id, *row[:10], json.dumps(row[10]), json.dumps(row[11]), *row[12:])
                     for row in event.windows])
        return
    if isinstance(event, protocol.LateTimings):
        update_by_seq(conn, "batch_rows", run_id, ("gpu_gap_ms",),
                      [(seq, stored_timing(gap, "gpu_gap_ms")) for seq, gap in event.gaps])
        update_by_seq(conn, "batch_rows", run_id, ("h2d_ms", "h2d_other_ms"),
                      [(seq, stored_timing(copy, "h2d_ms"), stored_timing(other, "h2d_ms"))
                       for seq, copy, other in event.copies])
        return
    if isinstance(event, protocol.Resources):
        insert_rows(conn, "resources", ("run_id", *RESOURCE_COLUMNS),
                    [(run_id, event.t, *(p.get(c) for c in RESOURCE_COLUMNS[1:]))
                     for p in event.procs])
        if event.gpu:
            conn.execute("INSERT INTO gpu_samples VALUES (?, ?, ?, ?)",
                         (run_id, event.t, event.gpu["util_percent"],
                          event.gpu["memory_used_mb"]))
        return
    if isinstance(event, protocol.Ready):
        conn.execute(
            "UPDATE runs SET config_json = ?, dataset_json = ?, system_json = ? WHERE id = ?",
            (json.dumps(event.config), json.dumps(event.dataset.to_dict()),
             json.dumps(event.system.to_dict()), run_id),
        )
    elif isinstance(event, protocol.Error):
        conn.execute("UPDATE runs SET error_json = ? WHERE id = ?",
                     (json.dumps(event.error), run_id))
    conn.execute("INSERT INTO run_events VALUES (?, ?, ?)",
                 (run_id, event.kind, stored_body(protocol.to_wire(event))))
