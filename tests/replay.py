"""A stand-in for the engine's child process that replays a recorded event stream.

RunHandle drives its child through a small interface (runner.EngineChild: pid, poll, wait,
request_stop, kill_group, reap_orphans) and reads events from a pipe. ``ReplayChild`` writes a
recording (tests/recordings/*.jsonl, made from real runs by ``python -m tests.replay record``)
to a real pipe from a thread: RunHandle, LiveRun, the store, Jobs and the pages run unchanged,
with no process and no torch. What the recorded child printed goes to the run's log as it did.

    python -m tests.replay record NAME TARGET [--kind profile|tune|inspect] [--seconds S]
        [--settings JSON] [--step-ms MS]
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import subprocess
import threading
import time

from dataloader_tuner import protocol
from dataloader_tuner.protocol import RunRequest

RECORDINGS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "recordings")


def recording_path(name: str) -> str:
    return os.path.join(RECORDINGS, f"{name}.jsonl")


@functools.lru_cache(maxsize=None)  # every page test replays them: read each file once
def load(name: str) -> tuple[list[dict], dict]:
    """(events as wire dicts, meta: {"request", "output", "exit_code"}) of a recording; shared,
    so read-only."""
    with open(recording_path(name), encoding="utf-8") as f:
        lines = [json.loads(line) for line in f if line.strip()]
    return lines[1:], lines[0]


class ReplayChild:
    """Replays events with their recorded spacing (``pace`` scales it: 0 sends at once)."""

    pid = 0  # no process: nothing to signal or reap

    def __init__(self, events: list[dict], exit_code: int, output: str, log,
                 pace: float = 0.0) -> None:
        self.events, self.exit_code, self.pace = events, exit_code, pace
        self.returncode: int | None = None
        self._stop = threading.Event()
        self._done = threading.Event()
        log.write(output.encode())
        log.flush()
        self.read_fd, self._write_fd = os.pipe()
        threading.Thread(target=self._play, daemon=True).start()

    def _play(self) -> None:
        last_t = None
        code = self.exit_code
        cut_short = False
        try:
            for doc in self.events:
                t = doc.get("_at")  # when it arrived in the recording (ignored by from_wire)
                if self.pace and t is not None and last_t is not None:
                    self._stop.wait(max(t - last_t, 0.0) * self.pace)
                last_t = t if t is not None else last_t
                if self._stop.is_set():
                    cut_short = True
                    break
                os.write(self._write_fd, protocol.encode(protocol.from_wire(doc)))
            if cut_short:  # stopped mid-run, as the child answers SIGTERM (not once it ended)
                os.write(self._write_fd, protocol.encode(protocol.Finished("stopped", 0.0)))
                code = 0
        except OSError:  # the reader went away
            pass
        finally:
            os.close(self._write_fd)
            self.returncode = code
            self._done.set()

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if not self._done.wait(timeout):
            raise subprocess.TimeoutExpired("replay", timeout)
        return self.returncode

    def request_stop(self) -> None:
        self._stop.set()

    def kill_group(self) -> None:
        self._stop.set()

    def reap_orphans(self, worker_pids: set[int]) -> None:
        pass


def library_starter(recordings: dict[tuple[str, str], str], pace: float = 0.0):
    """A ``runner.child_starter`` choosing a recording by (the target's file name, the request's
    kind), e.g. ``{("small_map.py", "inspect"): "small_map-inspect"}``; a verify run replays
    the profile recording. Anything else starts the real child."""
    from dataloader_tuner.run import runner

    real = runner.EngineChild.start
    loaded = {key: load(name) for key, name in recordings.items()}

    def start(request: RunRequest, log):
        name = os.path.basename(request.target.split(":")[0])
        kind = "profile" if request.kind == "verify" else request.kind
        if (name, kind) not in loaded:
            return real(request, log)
        events, meta = loaded[(name, kind)]
        child = ReplayChild(events, meta["exit_code"], meta.get("output", ""), log, pace)
        return child, child.read_fd

    return start


def record(name: str, request: RunRequest) -> str:
    """Run ``request`` for real and save what its child sent: the events with the time each
    arrived (``_at``), what it printed and how it exited."""
    from dataloader_tuner.run.runner import RunHandle

    handle = RunHandle(request)
    started = time.monotonic()
    events: list[dict] = []
    handle.listeners.append(
        lambda e: events.append({**protocol.to_wire(e), "_at": time.monotonic() - started}))
    handle.start()
    handle.wait()
    meta = {"request": request.to_json(), "output": handle.output_tail(20000),
            "exit_code": handle._proc.wait()}
    handle.close()
    os.makedirs(RECORDINGS, exist_ok=True)
    with open(recording_path(name), "w", encoding="utf-8") as f:
        for doc in [meta] + events:
            f.write(json.dumps(doc, default=str) + "\n")
    return recording_path(name)


# The recordings the page tests replay: (name, target from the repository root or a module, kind, request
# fields). ``python -m tests.replay record-all`` makes them again (after a protocol change).
MANIFEST = [
    ("with_train_step-inspect", "dataloader_tuner.demo", "inspect", {}),
    ("small_map-inspect", "tests/datasets/small_map.py", "inspect", {}),
    ("small_map-profile", "tests/datasets/small_map.py", "profile",
     {"seconds": 2.0, "step_ms": 2.0, "settings": {"num_workers": 2}}),
    ("small_map-tune", "tests/datasets/small_map.py", "tune",
     {"max_workers": 2, "step_ms": 0.0}),
    # a tune that learns the cost and samples its trials: the ceiling, what-if, where time went
    ("known_stages-inspect", "tests/datasets/known_stages.py", "inspect", {}),
    ("known_stages-tune", "tests/datasets/known_stages.py", "tune",
     {"max_workers": 4, "step_ms": 0.0}),
    ("syntax_error-inspect", "tests/datasets/syntax_error.py", "inspect", {}),
    ("missing_import-inspect", "tests/datasets/missing_import.py", "inspect", {}),
    ("two_classes-inspect", "tests/datasets/two_classes.py", "inspect", {}),
    ("nothing_here-inspect", "tests/datasets/nothing_here.py", "inspect", {}),
    ("factory_raises-inspect", "tests/datasets/factory_raises.py", "inspect", {}),
    ("getitem_raises-inspect", "tests/datasets/getitem_raises.py", "inspect", {}),
    ("getitem_raises-profile", "tests/datasets/getitem_raises.py", "profile",
     {"seconds": 2.0, "settings": {"num_workers": 2}}),
    ("with_kwargs-inspect", "tests/datasets/with_kwargs.py", "inspect", {}),
    ("with_kwargs-profile", "tests/datasets/with_kwargs.py", "profile", {"seconds": 1.0}),
    ("shared_rng-inspect", "tests/broken/shared_rng.py", "inspect", {}),
    ("shared_rng-profile", "tests/broken/shared_rng.py", "profile",
     {"seconds": 2.0, "step_ms": 0.0, "settings": {"num_workers": 2}}),
] + [
    entry
    for name, workers in (("ragged_shapes", 0), ("worker_bus_error", 2), ("iter_raises", 2),
                          ("stuck_in_main", 2))
    for entry in (
        (f"{name}-inspect", f"tests/broken/{name}.py", "inspect", {}),
        (f"{name}-profile", f"tests/broken/{name}.py", "profile",
         {"seconds": 15.0, "step_ms": 0.0, "timeout_s": 2.0,
          "settings": {"num_workers": workers}}),
    )
]


def replayed_starter(pace: float = 0.0):
    """``library_starter`` over every recording in MANIFEST."""
    return library_starter({(os.path.basename(target), kind): name
                            for name, target, kind, _ in MANIFEST}, pace)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.replay")
    sub = parser.add_subparsers(dest="command", required=True)
    rec = sub.add_parser("record", help="record a real run")
    rec.add_argument("name")
    rec.add_argument("target")
    rec.add_argument("--kind", default="profile", choices=protocol.RUN_KINDS)
    rec.add_argument("--seconds", type=float, default=3.0)
    rec.add_argument("--settings", default="{}")
    rec.add_argument("--step-ms", type=float)
    rec.add_argument("--budget-s", type=float, default=protocol.DEFAULT_BUDGET_S)
    sub.add_parser("record-all", help="record every run in MANIFEST (the page tests' replays)")
    args = parser.parse_args()
    if args.command == "record-all":
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        for name, target, kind, fields in MANIFEST:
            path = os.path.join(root, target) if target.endswith(".py") else target  # else a module
            print(record(name, RunRequest(path, kind=kind, **fields)),
                  flush=True)
        return
    request = RunRequest(args.target, settings=json.loads(args.settings), kind=args.kind,
                         seconds=args.seconds, step_ms=args.step_ms, budget_s=args.budget_s)
    print(record(args.name, request))


if __name__ == "__main__":
    main()
