"""How a look of the stack sampler (sampler.py) reads the stack it interrupted: the frames from
the leaf up as code objects while sampling, named for a reader when they are shipped; whether
they are inside the loader's work (the probes' wrappers); and a ``Compose`` step the look came
just too late to see (NOTE [ A step seen after it returned ], sampler.py)."""

from __future__ import annotations

import os
from typing import Any, Iterable

MAX_DEPTH = 48  # frames kept from the leaf up (a DataLoader worker's stack is ~15-30 deep)
# The probes' wrappers around the loader's work (probes.py), by qualified name: the time
# passed inside them is the loader's (sampler.py); its stages begin below them (hotspots.py)
FETCH_WRAPPERS = ("TimedMapDataset.__getitems__", "TimedIterableDataset.__iter__")
COLLATE_WRAPPER = "TimedCollate.__call__"
WORK_FRAMES = frozenset(name.rsplit(".", 1)[1] for name in (*FETCH_WRAPPERS, COLLATE_WRAPPER))
WORK_FILE = os.path.join("instrument", "probes.py")

# a Compose's loop, and its variable (NOTE [ A step seen after it returned ])
COMPOSE_CALLS = ("Compose.__call__", "Compose.forward")
LOOP_NAMES = ("t", "transform")
GENERIC_FILES = (os.path.join("torch", "nn", "modules", "module.py"),)

# One frame as shipped: (file, first line of its function, function's qualified name, line)
Frame = tuple[str, int, str, int]


def in_work(stack: tuple) -> bool:
    """The stack is inside the fetch or the collate (probes.py's wrappers)."""
    return any(code.co_name in WORK_FRAMES and code.co_filename.endswith(WORK_FILE)
               for code in stack)


def read_stack(frame: Any, top: Any = None) -> tuple:
    """The stack from ``frame`` up, leaf first, as code objects, to a process's
    or thread's ``_bootstrap``: a forked worker runs on top of the frames its parent was in
    when it forked (the job's script, its ``for batch in loader``), which are not its work.
    ``top``: a code object the walk ends at (a job's own process, at the watcher's ``next()``:
    the trainer's callers above it are in every look, and ranked by their share of the looks,
    the dozens of a real fit's took every place of the top functions from the hand-off's)."""
    out = []
    depth = 0
    leaf = frame
    while frame is not None and depth < MAX_DEPTH:
        code = frame.f_code
        out.append(code)
        if code.co_name == "_bootstrap" or code is top:
            break
        frame = frame.f_back
        depth += 1
    if out and getattr(out[0], "co_qualname", "").endswith(COMPOSE_CALLS):
        step = step_just_called(leaf)  # NOTE [ A step seen after it returned ]
        if step is not None:
            out.insert(0, step)
    return tuple(out)


def step_just_called(compose_frame: Any) -> Any:
    """The code of the step a ``Compose`` frame's loop called last (its loop variable: ``t``
    in torchvision's v1 and albumentations', ``transform`` in v2's), or None."""
    try:
        local = compose_frame.f_locals
    except Exception:  # noqa: BLE001 - a frame that cannot be read is left as it is
        return None
    step = next((local[n] for n in LOOP_NAMES if local.get(n) is not None), None)
    if step is None:
        return None
    kind = type(step)
    # an nn.Module's work is its forward (its __call__ is torch's generic one)
    for method in ("forward", "__call__"):
        code = getattr(getattr(kind, method, None), "__code__", None)
        if code is not None and not code.co_filename.endswith(GENERIC_FILES):
            return code
    return None


def named(stack: Iterable[Any]) -> tuple[Frame, ...]:
    """Code objects as frames a reader can name. Functions, not lines: keyed by the line each
    frame was at, a job's stacks were many times as many (and each look, send and write of
    them dearer) for figures that rank functions."""
    return tuple((code.co_filename, code.co_firstlineno,
                  getattr(code, "co_qualname", code.co_name), code.co_firstlineno)
                 for code in stack)
