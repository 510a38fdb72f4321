"""What a process's first fetch reveals, read once in each (probes.py calls it): the random
generators the dataset drew from, with their starting state (to compare across workers), and
the process's thread pools as the fetch left them (instrument/threads.py)."""

from __future__ import annotations

import gc
import itertools
import sys
from typing import Any

from dataloader_tuner.instrument import threads

_RNG_TYPES = ("Generator", "RandomState", "Random")


def rng_state(dataset: Any) -> dict[str, str]:
    """Fingerprints of the random generators a dataset holds as attributes, and of numpy's
    global one, to compare across worker processes."""
    import hashlib
    import pickle

    states = {}
    for name, value in rng_attributes(dataset):
            try:
                state = value.get_state() if hasattr(value, "get_state") else (
                    value.bit_generator.state if hasattr(value, "bit_generator") else
                    value.getstate())
                states[f"self.{name}"] = hashlib.sha1(pickle.dumps(state)).hexdigest()[:16]
            except Exception:  # noqa: BLE001 - a generator we cannot read is just skipped
                pass
    # Only where the process has numpy's random module already: importing it here cost the job's
    # first batch 5-6 ms, and one first loaded in a worker is seeded afresh there (only a state
    # forked from the main process is shared).
    numpy_random = sys.modules.get("numpy.random")
    if numpy_random is not None:
        try:
            states["numpy.random (global)"] = hashlib.sha1(
                pickle.dumps(numpy_random.get_state())).hexdigest()[:16]
        except Exception:  # noqa: BLE001
            pass
    return states


def rng_attributes(obj: Any) -> list[tuple[str, Any]]:
    """The random generators ``obj`` holds as attributes, by name (of its first 200).

    Looked for among what the object refers to (``gc.get_referents``), and named from
    ``vars(obj)`` only where one is found: reading an instance's ``__dict__`` makes CPython
    3.11+ move its attributes out of the compact storage its specialised attribute loads read,
    and every ``self.x`` in the user's ``__getitem__`` then ran slower for the rest of the
    process (long_tail: +2.4 us a 32-sample fetch, ~4% of its rate, in each process that
    probed its first fetch)."""
    referents = gc.get_referents(obj)
    values = referents + [v for ref in referents if type(ref) is dict
                          for v in itertools.islice(ref.values(), 200)]
    if not any(type(v).__name__ in _RNG_TYPES for v in values):
        return []
    try:
        attributes = list(vars(obj).items())[:200]
    except TypeError:  # no __dict__ (slots only)
        return []
    return [(name, value) for name, value in attributes if type(value).__name__ in _RNG_TYPES]


def first_fetch_probe(before: dict[str, str], after: dict[str, str]) -> dict:
    """What this process's first fetch revealed: the generators it drew from, with their
    starting state, and its thread pools as the fetch left them (instrument/threads.py)."""
    used = {name: state for name, state in before.items() if after.get(name) != state}
    return {"rng_used": used, "pools": threads.pools(), "pool_env": threads.pool_env()}
