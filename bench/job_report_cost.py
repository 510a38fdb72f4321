"""What rank 0 pays to gather a torchrun job's reports, by world size.

A real TCPStore on loopback (as torchrun's agent serves it), real RankSummary reports of the
size a rank sends, the real gathering code (watcher/job_report.RankReporter.gather) writing to
a real SQLite history. Prints the report's size and, per world size, the median time of one
gathering round (reading every rank's key, writing the new ones) on rank 0's reporting thread.
Over a network each key costs a round trip more: multiply the key count by yours.

    python bench/job_report_cost.py [--rounds 20]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from datetime import timedelta

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from torch.distributed import TCPStore  # noqa: E402

from dataloader_tuner.analyse.ranks import RankSummary  # noqa: E402
from dataloader_tuner.store import RunStore  # noqa: E402
from dataloader_tuner.analyse.ranks import report_key  # noqa: E402
from dataloader_tuner.watcher.job_report import RankReporter  # noqa: E402
from dataloader_tuner.watcher.rank_identity import RankIdentity  # noqa: E402
from dataloader_tuner.run.recorder import Recorder  # noqa: E402
from dataloader_tuner.run.sinks import HistorySink  # noqa: E402

SAMPLE = RankSummary(
    loader="train", rank=0, world_size=1, local_rank=0, node=0, host="node-000.cluster.local",
    pid=123456, seq=1, status="running", elapsed_s=3600.123, batches=123456,
    last_batch_age_s=0.012, samples_per_s=1234.5678, input_wait_frac=0.0532, step_ms=48.1234,
    worker_busy_frac=0.7312, memory_mb=12345.6, node_cpu_pct=63.4, node_cpus=96,
    shm_used_mb=2048.5, shm_total_mb=524288.0, waiting_for_batch_s=None)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args()
    print(f"a report: {len(SAMPLE.to_json())} bytes of JSON, every 2 s per rank and loader")
    server = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                      timeout=timedelta(seconds=10))
    client = TCPStore("127.0.0.1", server.port, is_master=False, wait_for_workers=False,
                      timeout=timedelta(seconds=10))
    print(f"{'world size':>10s} {'gather ms (median)':>19s} {'per rank us':>12s}")
    with tempfile.TemporaryDirectory() as folder:
        history = RunStore(os.path.join(folder, "runs.sqlite"))
        for world in (8, 64, 256, 1024):
            run_id = history.create_run("watch", "bench", {}, label=f"w{world}")
            reporter = RankReporter(RankIdentity(0, world, 0, 8, 0, "bench"), f"w{world}",
                                    Recorder(HistorySink(history, run_id), time.monotonic(), keep_recent=True), history,
                                    run_id, connect=lambda: client)
            times = []
            for round_no in range(args.rounds):
                for rank in range(world):  # every rank has a new report this round
                    server.set(report_key(f"w{world}", rank),
                               replace(SAMPLE, rank=rank, world_size=world,
                                       seq=round_no + 1).to_json())
                started = time.perf_counter()
                reporter.gather(client)
                times.append(time.perf_counter() - started)
            median = statistics.median(times)
            print(f"{world:10d} {1000 * median:19.1f} {1e6 * median / world:12.1f}")


if __name__ == "__main__":
    main()
