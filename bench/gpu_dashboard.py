"""The dashboard's GPU charts on real GPU data: a run started from the Live page with a
simulated GPU step, and every watched run in a run history, rendered in Streamlit's AppTest.

    python bench/gpu_dashboard.py RUNS.sqlite [--start]

For each watched run in RUNS.sqlite (e.g. ``examples/train_watched.py --device cuda --db
RUNS.sqlite``): the Training jobs page with that run chosen, its charts' titles and how many
points the GPU idle-gap and host-to-device transfer charts hold. ``--start``: also the Live page,
Start pressed on the built-in demo with a 12 ms simulated step (on a GPU it runs on the GPU),
the same charts of that run. Exits 1 when a run that copied to a GPU shows no GPU gaps or no
transfer times; prints what it saw either way. Needs a CUDA GPU for the runs to have GPU data;
the check itself runs anywhere (a history recorded on a GPU machine can be read back here).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

WATCHED_SCRIPT = "from dataloader_tuner.dashboard import watched_page\nwatched_page.render()\n"
GPU_GAPS = "GPU idle gaps: time the GPU waited"
TRANSFER = "Pinned-memory transfer"
TOKEN = "gpu-dashboard-check"


def charts(at) -> dict[str, int]:
    """Each chart's title and how many points its traces hold."""
    found = {}
    for chart in at.get("plotly_chart"):
        spec = json.loads(chart.proto.spec)
        points = sum(len(trace.get("y") or []) for trace in spec.get("data", []))
        found[spec["layout"]["title"]["text"]] = points
    return found


def points(found: dict[str, int], prefix: str) -> int:
    return next((n for title, n in found.items() if title.startswith(prefix)), 0)


def check_watched(db: str) -> list[str]:
    from streamlit.testing.v1 import AppTest

    from dataloader_tuner import RunStore

    problems = []
    runs = [r for r in RunStore(db).list_runs(100) if r.kind == "watch"]
    for run in runs:
        at = AppTest.from_string(WATCHED_SCRIPT, default_timeout=60).run()
        at.selectbox(key="watched_run").set_value(run.id)
        at = at.run()
        found = charts(at)
        batches = RunStore(db).batches(run.id)
        copied = any(b.h2d_ms is not None for b in batches)
        print(f"watched run {run.id} ({run.label}): {len(batches)} batches, "
              f"{sum(b.h2d_ms is not None for b in batches)} copies timed, "
              f"{sum(b.gpu_gap_ms is not None for b in batches)} GPU gaps; exception "
              f"{bool(at.exception)}; charts {found}")
        if at.exception:
            problems.append(f"run {run.id}: the page raised {at.exception[0].value}")
        if copied and (points(found, GPU_GAPS) == 0 or points(found, TRANSFER) == 0):
            problems.append(f"run {run.id} copied to a GPU but its charts lack GPU data")
    if not runs:
        problems.append("no watched runs in the history")
    return problems


def check_live_start() -> list[str]:
    from streamlit.testing.v1 import AppTest

    from dataloader_tuner.dashboard.shared import get_jobs

    at = AppTest.from_file(os.path.join(ROOT, "app.py"), default_timeout=90)
    at.query_params["token"] = TOKEN
    at = at.run()
    at.text_input(key="target").input("dataloader_tuner.demo")
    at = at.run()
    at = at.radio(key="ctl_consumer").set_value("simulated").run()
    at.number_input(key="ctl_step_ms").set_value(12.0)
    at.number_input(key="ctl_seconds").set_value(6.0)
    at = at.run()
    next(b for b in at.button if b.label == "Start").click()
    at = at.run()
    deadline = time.monotonic() + 120
    while get_jobs().busy() and time.monotonic() < deadline:
        time.sleep(0.5)
    at = at.run().run()
    found = charts(at)
    print(f"Live page, demo with a 12 ms simulated step: exception {bool(at.exception)}; "
          f"charts {found}")
    get_jobs().stop_all()
    problems = []
    if at.exception:
        problems.append(f"the Live page raised {at.exception[0].value}")
    if points(found, GPU_GAPS) == 0 or points(found, TRANSFER) == 0:
        problems.append("the Live page's run shows no GPU gaps or no transfer times")
    return problems


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("db", help="a run history holding watched runs")
    parser.add_argument("--start", action="store_true", help="also start a run on the Live page")
    args = parser.parse_args()
    os.environ["DLTUNER_DB"] = os.path.abspath(args.db)
    os.environ["DLTUNER_AUTOSTART"] = "0"
    os.environ["DLTUNER_TOKEN"] = TOKEN
    os.chdir(ROOT)
    problems = check_watched(args.db)
    if args.start:
        problems += check_live_start()
    for problem in problems:
        print(f"PROBLEM: {problem}")
    print("dashboard GPU charts:", "ok" if not problems else f"{len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
