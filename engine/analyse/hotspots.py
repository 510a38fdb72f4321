"""Where the loader's time goes: the sampled stacks of every worker and of the main process
(instrument/sampler.py), merged, grouped into stages a user recognises and ranked by function.

NOTE [ Stages of a sample's making ]

    Each sampled stack is put in one stage, read from the frames it holds (root first):
    - under the collate wrapper (probes.TimedCollate): "collate";
    - under the fetch wrapper (probes.Timed*Dataset), from the outermost frame in: a frame
      below a ``Compose`` (torchvision v1/v2, albumentations) names "transform: <its class>"
      (the first frame that is not a generic ``Module``/``Transform`` call), or "transform"
      in the ``Compose``'s own frame (mostly a step's last C work: an operator such as
      Normalize's division runs before the interpreter checks for the signal again, back in
      the ``Compose``: tests/test_hotspots_real.py); else a frame in a
      decoding library (PIL past ``Image.open``, torchvision.io, soundfile, torchaudio,
      librosa, tokenizers, transformers' tokenizers) is "decode"; a frame of file or storage
      reading (``Image.open``, tarfile, zipfile, lmdb, fsspec, numpy's load, h5py, ...) is
      "read"; the rest is "your __getitem__" (the dataset's own code: a C call such as
      ``open().read()`` is charged to the line that called it, and shows as waiting);
    - a worker's queue feeder thread (pickling the batch into shared memory) and the main
      process rebuilding a batch from a worker: "hand-off"; the pin-memory thread: "pinning";
    - a worker waiting for its next indices, the main process waiting for a batch, and the
      main process's own loop (the measuring loop, the job's step) are not the loader's work:
      left out of the shares.
    Shares are of the loader's work so sampled: each stage's time over all of it (the main
    thread's wall time, a helper thread's CPU time), adding up to 1.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

from dataloader_tuner.instrument.frames import COLLATE_WRAPPER, FETCH_WRAPPERS
from dataloader_tuner.instrument.sampler import SAMPLER_ROLE
from dataloader_tuner.instrument.threads import BUSY_SHARE

# frames: (file, first line, qualified name, line), leaf first (frames.Frame)
GENERIC_CALLS = ("Module._call_impl", "Module._wrapped_call_impl", "Transform.forward",
                 "Transform.__call__", "BasicTransform.__call__", "DualTransform.__call__",
                 "ImageOnlyTransform.__call__", "BaseCompose.__call__")
DECODE_PATHS = ("/PIL/", "/torchvision/io/", "/soundfile", "/torchaudio/", "/librosa/",
                "/tokenizers/", "/transformers/tokenization", "/cv2/", "/imageio/",
                "/simplejpeg", "/turbojpeg")
READ_PATHS = ("/tarfile.py", "/zipfile.py", "/lmdb", "/fsspec/", "/s3fs/", "/botocore/",
              "/urllib/", "/requests/", "/numpy/lib/npyio.py", "/numpy/lib/_npyio_impl.py",
              "/h5py/", "/pyarrow/", "/webdataset/", "/pathlib.py", "/_pyio.py")
READ_FUNCTIONS = ("open",)  # in a decoding library: PIL's Image.open reads the header
IDLE, NOT_LOADER = "waiting for work", "not the loader"
# A stack: its frames leaf first, each (file, first line, qualified name, line) (frames.Frame)
Stack = tuple[tuple[Any, ...], ...]
# The loader's work, one sampled stack each: (stage, frames, time spent, CPU of it, looks)
Work = tuple[str, Stack, float, float, float]
MIN_LOOKS = 100  # fewer looks at the loader's work: too few to show shares as a claim
TOP_FUNCTIONS = 20


@dataclass(frozen=True)
class TorchThreads:
    """What a worker's own hand-off threads did: its queue's feeder (pickling each batch) and
    multiprocessing's resource sharer (``Thread-N (_serve)``, passing tensors' file
    descriptors). Every DataLoader worker has them; they are not a pool fighting for cores."""

    cpu_share: float  # of the process's sampled CPU
    busy: int  # how many did at least threads.BUSY_SHARE of it


def is_torch_handoff(role: str) -> bool:
    return role == "QueueFeederThread" or role.endswith("(_serve)")


def _is(frame: Sequence[Any], qualname: str) -> bool:
    name = str(frame[2])
    return name == qualname or name.endswith("." + qualname)


def stage_of(role: str, frames: Sequence[Sequence[Any]]) -> str:
    """The stage a sampled stack belongs to (NOTE [ Stages of a sample's making ])."""
    root_first = list(reversed(frames))
    names = [f[2] for f in root_first]
    if is_torch_handoff(role) or any(n.endswith("Queue._feed") for n in names):
        return "hand-off"
    if "_pin_memory_loop" in role or any(n.endswith("_pin_memory_loop") for n in names):
        return "pinning"  # (other threads are sampled by name: "Thread-3 (_pin_memory_loop)")
    if role != "main":  # the recorder's, the user's own threads
        return NOT_LOADER
    for i, name in enumerate(names):
        if name == COLLATE_WRAPPER:
            return "collate"
        if name in FETCH_WRAPPERS:
            return _fetch_stage(root_first[i + 1:])
    files = [str(f[0]).replace("\\", "/") for f in root_first]
    if any(n.endswith("_worker_loop") for n in names):  # a worker, outside fetch and collate
        return IDLE if any(n.endswith("Queue.get") for n in names) else "hand-off"
    if any(n.endswith("_next_data") for n in names):  # the main process, asking for a batch
        rebuilding = any("/torch/multiprocessing/reductions" in f
                         or "/multiprocessing/resource_sharer" in f for f in files) or any(
            n.endswith("ForkingPickler.loads") or n.endswith("_rebuild_tensor") for n in names)
        return "hand-off" if rebuilding else IDLE
    return NOT_LOADER


def _fetch_stage(below: Sequence[Sequence[Any]]) -> str:
    for i, frame in enumerate(below):
        if frame[2].endswith("Compose.__call__") or frame[2].endswith("Compose.forward"):
            for inner in below[i + 1:]:
                if not any(_is(inner, g) for g in GENERIC_CALLS):
                    return "transform: " + str(inner[2]).split(".")[0]
            return "transform"
    for frame in below:
        path = frame[0].replace("\\", "/")
        if any(p in path for p in DECODE_PATHS):
            return "read" if frame[2].split(".")[-1] in READ_FUNCTIONS else "decode"
        if any(p in path for p in READ_PATHS):
            return "read"
    return "your __getitem__"


class SampledProfile:
    """Every process's samples, merged as they come (``add``); ``merged()`` reads them."""

    def __init__(self) -> None:
        # (role, frames) -> [cpu_s, wall_s, looks]
        self.stacks: dict[tuple[str, Stack], list[float]] = {}
        self.processes: set[int] = set()
        self.thread_cpu: dict[int, dict[str, float]] = {}  # pid -> thread role -> CPU seconds

    def add(self, pid: int, sampled: Iterable[Sequence[Any]]) -> None:
        threads = self.thread_cpu.setdefault(pid, {})
        for role, frames, cpu, wall, looks in sampled:
            threads[role] = threads.get(role, 0.0) + cpu
            key = (role, tuple(tuple(f) for f in frames))
            entry = self.stacks.get(key)
            if entry is None:
                self.stacks[key] = [cpu, wall, looks]
            else:
                entry[0] += cpu
                entry[1] += wall
                entry[2] += looks
            self.processes.add(pid)

    def torch_threads(self, pid: int) -> TorchThreads | None:
        """A process's CPU done by torch's own hand-off threads, or None where it was not
        sampled."""
        threads = self.thread_cpu.get(pid)
        total = sum(threads.values()) if threads else 0.0
        if not threads or total <= 0:
            return None
        own = [cpu for role, cpu in threads.items() if is_torch_handoff(role)]
        return TorchThreads(sum(own) / total, sum(1 for cpu in own if cpu >= BUSY_SHARE * total))

    def merged(self) -> dict[str, Any] | None:
        """``{looks, seconds, processes, enough, sampling_share, stages, hotspots, flame,
        collapsed}`` (``sampling_share``: the sampler's own time over the work sampled), or None
        when nothing was sampled. Shares are of the loader's work (NOTE above)."""
        work: list[Work] = []
        sampling_s = 0.0  # what the handlers took, in every process
        for (role, frames), (cpu, wall, looks) in self.stacks.items():
            if role == SAMPLER_ROLE:
                sampling_s += cpu
                continue
            stage = stage_of(role, frames)
            if stage in (IDLE, NOT_LOADER):
                continue
            # the main thread's time is the time that passed; a helper's is its CPU
            spent = wall if role == "main" else cpu
            # (cpu unclipped here: with two timers a stack's CPU and its time are sampled
            # apart, NOTE [ Waiting seen on a clock of its own ]; clipped where summed)
            work.append((stage, frames, spent, cpu, looks))
        total = sum(w[2] for w in work)
        looks = sum(w[4] for w in work)
        if not work or total <= 0:
            return None
        stages: dict[str, list[float]] = {}
        for stage, _, spent, cpu, _ in work:
            entry = stages.setdefault(stage, [0.0, 0.0])
            entry[0] += spent
            entry[1] += cpu
        return {
            "looks": looks, "seconds": round(total, 3), "processes": len(self.processes),
            "enough": looks >= MIN_LOOKS, "sampling_share": round(sampling_s / total, 5),
            "stages": [{"stage": stage, "share": round(spent / total, 4),
                        "cpu_share": round(min(cpu, spent) / total, 4)}
                       for stage, (spent, cpu) in sorted(stages.items(), key=lambda kv: -kv[1][0])],
            "hotspots": _functions(work, total),
            "flame": _leaves(work, total),
            "collapsed": _collapsed(work),
        }


MAX_STACKS = 300  # whole stacks kept for an export (speedscope.py), the longest first


def _collapsed(work: list[Work]) -> dict[str, Any]:
    """The sampled stacks themselves, for tools that draw them (analyse/speedscope.py):
    ``{frames: [[function, file, line]], stacks: [[stage, [frame index, root first],
    seconds]]}``; past the MAX_STACKS longest, each stage's rest as one stack of no frames."""
    ranked = sorted(work, key=lambda w: -w[2])
    frames: dict[tuple[str, str, int], int] = {}
    stacks: list[list[Any]] = []
    rest: dict[str, float] = {}
    for stage, stack, spent, _, _ in ranked[MAX_STACKS:]:
        rest[stage] = rest.get(stage, 0.0) + spent
    for stage, stack, spent, _, _ in ranked[:MAX_STACKS]:
        indices = [frames.setdefault((str(f[2]), str(f[0]), int(f[3])), len(frames))
                   for f in reversed(stack)]
        stacks.append([stage, indices, round(spent, 6)])
    stacks += [[stage, [], round(spent, 6)] for stage, spent in rest.items()]
    return {"frames": [list(frame) for frame in frames], "stacks": stacks}


LEAVES_PER_STAGE = 8


def _leaves(work: list[Work], total: float) -> list[dict[str, Any]]:
    """Each stage's own time by the user-facing function it was in (the innermost frame that
    is not this tool's, torch's loader or the standard library's plumbing), the largest
    LEAVES_PER_STAGE of each stage and the rest as "other": the dashboard's icicle."""
    by_stage: dict[str, dict[str, float]] = {}
    for stage, frames, spent, _, _ in work:
        # the user's innermost frame, else torch's (default_collate), never this tool's
        frame = next((f for f in frames if not _framework(str(f[0]))), None) or next(
            (f for f in frames if "/torch/" in str(f[0]).replace("\\", "/")
             and not str(f[0]).startswith(OWN_PATH)), None)
        name = (f"{frame[2]} ({os.path.basename(str(frame[0]))}:{frame[1]})" if frame
                else "(the loader's own code)")
        functions = by_stage.setdefault(stage, {})
        functions[name] = functions.get(name, 0.0) + spent
    leaves = []
    for stage, functions in by_stage.items():
        ranked = sorted(functions.items(), key=lambda kv: -kv[1])
        rest = sum(t for _, t in ranked[LEAVES_PER_STAGE:])
        leaves += [{"stage": stage, "function": name, "share": round(t / total, 4)}
                   for name, t in ranked[:LEAVES_PER_STAGE]]
        if rest > 0:
            leaves.append({"stage": stage, "function": "other", "share": round(rest / total, 4)})
    return leaves


class _Function:
    __slots__ = ("self_s", "total_s", "cpu_s", "stages")

    def __init__(self) -> None:
        self.self_s = self.total_s = self.cpu_s = 0.0
        self.stages: dict[str, float] = {}


def _functions(work: list[Work], total: float) -> list[dict[str, Any]]:
    """By function (file, first line), self and total shares; ranked by total, then self.
    The wrappers of this tool, torch's loop and the standard library's plumbing are left out
    of the ranking (they hold every stack)."""
    functions: dict[tuple[Any, ...], _Function] = {}
    for stage, frames, spent, cpu, _ in work:
        seen = set()
        for depth, frame in enumerate(frames):
            key = (frame[0], frame[1], frame[2])
            entry = functions.get(key)
            if entry is None:
                entry = functions[key] = _Function()
            if depth == 0:
                entry.self_s += spent
                entry.cpu_s += cpu
            if key not in seen:
                seen.add(key)
                entry.total_s += spent
                entry.stages[stage] = entry.stages.get(stage, 0.0) + spent
    # (a script's module level holds every stack of the process that runs it)
    ranked = [(key, f) for key, f in functions.items()
              if not _framework(key[0]) and key[2] != "<module>"]
    ranked.sort(key=lambda kv: (-kv[1].total_s, -kv[1].self_s))
    return [{"function": key[2], "file": key[0], "line": key[1],
             "stage": max(f.stages.items(), key=lambda kv: kv[1])[0],
             "self_share": round(f.self_s / total, 4), "total_share": round(f.total_s / total, 4),
             "cpu_share": round(min(f.cpu_s, f.self_s) / total, 4)}
            for key, f in ranked[:TOP_FUNCTIONS]]


# This tool's own code (wherever it is installed), torch's loader and the standard library's
# plumbing: in every stack, never what a user can change.
OWN_PATH = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FRAMEWORK_PATHS = ("/torch/utils/data/", "/multiprocessing/", "/threading.py", "<frozen ",
                   "/runpy.py")


def _framework(path: str) -> bool:
    return path.startswith(OWN_PATH) or any(p in path.replace("\\", "/")
                                            for p in FRAMEWORK_PATHS)
