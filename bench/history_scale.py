"""What the run history costs on disk, and how fast its pages are, at a year's size.

Two real runs are recorded first into a template history: a watched job (a real DataLoader with
2 workers, its sampled stacks) and a profile of tests/real/audio_like.py. Their stored events
are then written again, through the store's own calls, as many runs as asked: eight at a time
in turns of a quarter-second flush each, as jobs writing at once do.

- ``size``: bytes a million batch rows (watched jobs) and a profile take, table by table
  (SQLite's dbstat).
- ``pages``: a history of ``--runs`` runs and ``--rows`` batch rows (issue 64: 10,000 and 50
  million), then the History page, the Training jobs page and one watched run's page rendered
  in Streamlit's AppTest: each page's first render in a process that has imported the pages
  (its reads not yet cached) and a second, warm one; the run's page is another run than the
  one the page shows first, chosen in its select box.

    ../shared/tools/capped 8 -- python bench/history_scale.py size
    ../shared/tools/capped 8 -- python bench/history_scale.py pages --runs 10000 --rows 50000000
    ../shared/tools/capped 8 -- python bench/history_scale.py long --rows 1700000

- ``long``: one watched job of ``--rows`` rows (a day at 20 batches a second), its page, and a
  refresh of its page's reads as if it were still running: the whole run read again, against
  following it (run/live.py, ``Followed``).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, replace

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
JOB = """
import sys, time, torch
from torch.utils.data import DataLoader, Dataset
from dataloader_tuner import watch
class Work(Dataset):
    def __len__(self): return 1_000_000
    def __getitem__(self, i):
        s = 0.0
        for _ in range(2000): s += 1.0
        return torch.randn(64), i % 10
loader = DataLoader(Work(), batch_size=4, num_workers=2)
for i, batch in enumerate(watch(loader, name="train", db=sys.argv[1])):
    time.sleep(0.0005)
    if i + 1 >= int(sys.argv[2]): break
"""


@dataclass
class Template:
    kind: str
    target: str
    config: dict
    rows: list        # batch rows (tuples)
    events: list      # every other event, Resources rebuilt from the resource rows
    result: object


def record_templates(folder: str, job_rows: int) -> list[Template]:
    """A real watched job and a real profile, read back from the history they wrote."""
    from dataloader_tuner import RunStore, protocol
    db = os.path.join(folder, "template.sqlite")
    script = os.path.join(folder, "job.py")
    with open(script, "w") as f:
        f.write(JOB)
    subprocess.run([sys.executable, script, db, str(job_rows)], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=600)
    subprocess.run([sys.executable, "-m", "dataloader_tuner", "profile",
                    os.path.join(ROOT, "tests/real/audio_like.py"), "--seconds", "15", "--db", db],
                   check=True, stdout=subprocess.DEVNULL, timeout=600)
    store = RunStore(db)
    templates = []
    for run in sorted(store.list_runs(), key=lambda r: r.id):
        full = store.get_run(run.id)
        by_t: dict[float, list[dict]] = {}
        for row in store.resources(run.id):
            by_t.setdefault(row["t"], []).append(row)
        events = [e for e in store.events(run.id) if not isinstance(e, protocol.Finished)]
        events += [protocol.Resources(t, procs) for t, procs in sorted(by_t.items())]
        templates.append(Template(run.kind, run.target, full.config or {},
                                  [b.to_row() for b in store.batches(run.id)], events,
                                  full.result))
    store.close()
    return templates


def _scaled(template: Template, rows: int) -> Template:
    """The template stretched to ``rows`` batch rows (its rows repeated, later in time; its
    events repeated as often)."""
    period = template.rows[-1][2] + template.rows[-1][3] + template.rows[-1][4]
    out, events, lap = [], [], 0
    while len(out) < rows:
        for row in template.rows:
            if len(out) == rows:
                break
            out.append((len(out), row[1], row[2] + lap * period, *row[3:]))
        events += template.events if lap == 0 else [
            e for e in template.events if type(e).__name__ in ("Profiled", "Resources")]
        lap += 1
    return replace(template, rows=out, events=events)


def write_runs(db: str, plan: list[tuple[Template, int]], at_once: int = 8) -> float:
    """Each (template, rows) as a run, ``at_once`` written in turns; the seconds it took."""
    from dataloader_tuner import RunStore, protocol
    store = RunStore(db)
    started = time.perf_counter()
    for start in range(0, len(plan), at_once):
        group = [(_scaled(t, n) if n != len(t.rows) else t) for t, n in plan[start:start + at_once]]
        ids = [store.create_run(t.kind, t.target, t.config) for t in group]
        flushes = [max(1, len(t.rows) // 250) for t in group]
        for turn in range(max(flushes)):
            for run_id, t, n in zip(ids, group, flushes):
                if turn >= n:
                    continue
                rows = t.rows[turn * len(t.rows) // n:(turn + 1) * len(t.rows) // n]
                events = t.events[turn * len(t.events) // n:(turn + 1) * len(t.events) // n]
                store.record_events(run_id, [protocol.Batches(rows), *events], heartbeat=True)
        for run_id, t in zip(ids, group):
            store.finish_run(run_id, "ok", t.result, None)
    store.close()
    return time.perf_counter() - started


def table_bytes(db: str) -> dict[str, int]:
    import sqlite3
    with sqlite3.connect(db) as conn:
        return dict(conn.execute("SELECT name, SUM(pgsize) FROM dbstat GROUP BY name "
                                 "ORDER BY 2 DESC").fetchall())


def size(templates: list[Template], folder: str) -> None:
    watched, profile = templates
    for name, plan, per, unit in (
            ("watched jobs", [(watched, 50_000)] * 20, 1.0, "a million batch rows"),
            ("profiles", [(profile, len(profile.rows))] * 50, 1 / 50, "a profile")):
        db = os.path.join(folder, f"size-{name.replace(' ', '_')}.sqlite")
        took = write_runs(db, plan)
        tables = table_bytes(db)
        total = sum(tables.values())
        print(f"{name}: {total * per / 2**20:.2f} MiB {unit} (written in {took:.1f} s)")
        for table, used in tables.items():
            if used * per >= 0.01 * total * per:
                print(f"    {table:24s} {used * per / 2**20:8.2f} MiB")


WARM_UP = """
import plotly.graph_objects as go
import streamlit as st
st.title("warm-up")
st.dataframe([{"a": 1}])
st.info("i", icon="⚠️")
st.plotly_chart(go.Figure(go.Scatter(x=[1], y=[1])))
"""


_components: list = []  # the installed packages' components, found once (see _render)

EMPTY = "import streamlit as st\nst.write('nothing')\n"


def _render(script: str, select: tuple[str, object] | None = None) -> tuple[float, float]:
    """A page's first render and a second one (warm), in seconds. A server looks through the
    installed packages for Streamlit components once, as it starts; AppTest does it at each
    instance's first run (0.22-0.34 s here, an empty page's whole first render): so every
    instance after the first is handed the components the first found, and a page's first
    render is its own."""
    from streamlit.testing.v1 import AppTest
    at = AppTest.from_string(script, default_timeout=600)
    if _components:  # (AppTest's own attribute: it has no argument for it)
        at._bidi_component_manager = _components[0]
    started = time.perf_counter()
    at.run()
    first = time.perf_counter() - started
    if not _components and at._bidi_component_manager is not None:
        _components.append(at._bidi_component_manager)
    if select is not None:
        at.selectbox(key=select[0]).set_value(select[1])
    started = time.perf_counter()
    at.run()
    assert not at.exception, at.exception
    return first, time.perf_counter() - started


def pages(templates: list[Template], folder: str, runs: int, rows: int, keep: str | None) -> None:
    import sqlite3
    watched, profile = templates
    db = keep or os.path.join(folder, "big.sqlite")
    if not os.path.exists(db):
        # a tenth of the runs watched jobs, taking what the profiles leave of the rows
        jobs = max(1, runs // 10)
        left = max(rows - (runs - jobs) * len(profile.rows), jobs * len(watched.rows))
        every = max(1, runs // jobs)  # (the jobs spread among the profiles)
        plan = [(watched, left // jobs) if i % every == every - 1 and i // every < jobs
                else (profile, len(profile.rows)) for i in range(runs)]
        took = write_runs(db, plan)
        print(f"built {runs} runs, {rows / 1e6:.1f} million batch rows in {took:.0f} s")
    with sqlite3.connect(db) as conn:
        stored = sum(conn.execute(f"SELECT COUNT(*) FROM {t}").fetchone()[0]
                     for t in ("batch_rows", "batches")
                     if conn.execute("SELECT 1 FROM sqlite_master WHERE name = ?", (t,)).fetchone())
        # (not the newest, which the page shows first: a run not yet seen in this process)
        other = conn.execute("SELECT id FROM runs WHERE kind = 'watch' ORDER BY id DESC "
                             "LIMIT 1 OFFSET 1").fetchone()[0]
    print(f"history: {os.path.getsize(db) / 2**30:.2f} GiB, {stored / 1e6:.1f} million rows")
    os.environ.update(DLTUNER_DB=db, DLTUNER_AUTOSTART="0")
    from dataloader_tuner.dashboard import history_page, watched_page  # noqa: F401 (imported)
    _render(WARM_UP)  # (what a server imports once, at its first page: pandas, the emoji list)
    print(f"{'an empty page':24s} first {_render(EMPTY)[0]:6.2f} s (the harness alone)")
    head = "from dataloader_tuner.dashboard import {0}\n{0}.render()\n"
    for name, script, select in (
            # (Training jobs first: History reads the newest 500 runs' results, which would
            # leave the watched ones among them already read)
            ("Training jobs", head.format("watched_page"), None),
            ("History", head.format("history_page"), None),
            ("one watched run's page", head.format("watched_page"), ("watched_run", other))):
        first, then = _render(script, select)
        print(f"{name:24s} first {first:6.2f} s, " + (f"again {then:6.2f} s" if select is None
                                                      else f"the run chosen {then:6.2f} s"))


def long_run(templates: list[Template], folder: str, rows: int) -> None:
    """One watched job of ``rows`` batch rows (a day at 20 a second: 1.7 million) beside a
    shorter one, and its page chosen on the Training jobs page."""
    import sqlite3
    watched, _profile = templates
    db = os.path.join(folder, "long.sqlite")
    took = write_runs(db, [(watched, rows), (watched, len(watched.rows))])
    with sqlite3.connect(db) as conn:
        first = conn.execute("SELECT MIN(id) FROM runs").fetchone()[0]
    print(f"a run of {rows / 1e6:.1f} million rows, written in {took:.0f} s")
    os.environ.update(DLTUNER_DB=db, DLTUNER_AUTOSTART="0")
    from dataloader_tuner.dashboard import watched_page  # noqa: F401 (imported)
    _render(WARM_UP)
    shown, chosen = _render("from dataloader_tuner.dashboard import watched_page\n"
                            "watched_page.render()\n", ("watched_run", first))
    print(f"Training jobs {shown:.2f} s; the long run chosen {chosen:.2f} s")
    _followed(db, first)


def _followed(db: str, run_id: int) -> None:
    """The long run as its page reads it at each refresh while it runs: all its events and
    resource samples again (``LiveRun.stored``), or only those since the last (``Followed``),
    in turn, three times each."""
    from dataloader_tuner import RunStore
    from dataloader_tuner.dashboard.watched_page import LIVE_WINDOW_BATCHES
    from dataloader_tuner.run.live import Followed, LiveRun
    import sqlite3
    store = RunStore(db)
    with sqlite3.connect(db) as conn:
        events = conn.execute("SELECT COUNT(*) FROM run_events WHERE run_id = ?",
                              (run_id,)).fetchone()[0]
    followed = Followed(store, run_id, LIVE_WINDOW_BATCHES)
    started = time.perf_counter()
    followed.refresh()
    first = time.perf_counter() - started
    whole, since, figures = [], [], []
    for _ in range(3):
        started = time.perf_counter()
        LiveRun.stored(store, run_id, LIVE_WINDOW_BATCHES)
        whole.append(time.perf_counter() - started)
        started = time.perf_counter()
        live = followed.refresh()
        since.append(time.perf_counter() - started)
        started = time.perf_counter()
        live.profile_result("ok")  # what the page then makes of it, either way
        figures.append(time.perf_counter() - started)
    print(f"a running run's refresh ({events:,} events): all of it read again "
          f"{min(whole):.3f}-{max(whole):.3f} s; followed {min(since):.3f}-{max(since):.3f} s "
          f"(its first read {first:.3f} s); its figures then {min(figures):.3f}-"
          f"{max(figures):.3f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("what", choices=("size", "pages", "long"))
    parser.add_argument("--runs", type=int, default=10_000)
    parser.add_argument("--rows", type=int, default=50_000_000)
    parser.add_argument("--job-rows", type=int, default=20_000, help="the template job's")
    parser.add_argument("--keep", help="build the big history at this path (or reuse it)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        templates = record_templates(folder, args.job_rows)
        if args.what == "size":
            size(templates, folder)
        elif args.what == "long":
            long_run(templates, folder, args.rows)
        else:
            pages(templates, folder, args.runs, args.rows, args.keep)


if __name__ == "__main__":
    main()
