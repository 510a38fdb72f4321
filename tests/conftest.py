import gc
import importlib.util
import os
import sys
import time

import psutil
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATASETS = os.path.join(ROOT, "tests", "datasets")
EXAMPLES = os.path.join(ROOT, "examples")
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)


def _package_is_this_checkout() -> None:
    """The tests run the package installed from this checkout (``pip install -e .``, as
    scripts/test.sh does), never another copy of dataloader_tuner."""
    spec = importlib.util.find_spec("dataloader_tuner")
    where = os.path.dirname(spec.origin) if spec and spec.origin else None
    if where is None or not os.path.samefile(where, os.path.join(ROOT, "engine")):
        pytest.exit(f"dataloader_tuner is {'found at ' + where if where else 'not installed'}, "
                    f"not this checkout's engine/: run `pip install -e {ROOT}` "
                    "(bash scripts/test.sh does it)", returncode=4)


_package_is_this_checkout()


def dataset_path(name: str) -> str:
    return os.path.join(DATASETS, name)


def live_descendants() -> list[psutil.Process]:
    """Our descendants, zombies included: a zombie is a process nobody reaped."""
    return [p for p in psutil.Process().children(recursive=True) if p.is_running()]


LEFT_BEHIND = "processes left behind"  # no_process_left_behind's failure: never run again


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A test marked host_speed compares speeds read at different moments on a host whose
    speed moves (CI on 2 shared cores: a trial read at half its rate once, from nothing of the
    tool's). It runs once more if it fails, and the summary counts the rerun: a real gap fails
    both runs. A process left behind or a timeout is never run again."""
    for item in items:
        if item.get_closest_marker("host_speed"):
            item.add_marker(pytest.mark.flaky(reruns=1, rerun_except=[LEFT_BEHIND, "Timeout"]))


@pytest.fixture(autouse=True, scope="session")
def collect_before_forking_workers():
    """Workers forked from this long-lived test process copy the garbage earlier tests left in
    reference cycles, and a worker that collects it runs their finalizers: once in CI a worker
    aborted so ("Fatal Python error: Aborted", garbage-collecting in the worker). A training
    process has no such history; collected here before each multi-worker iterator starts. What
    survives is then frozen (gc.freeze, the pattern Python documents for fork): the next collect
    walks only what came after, not torch's, Streamlit's and the trainers' objects again (170 ms
    a collect, 9 s of the quick suite, before; the process's peak memory the same)."""
    from torch.utils.data.dataloader import _MultiProcessingDataLoaderIter

    original = _MultiProcessingDataLoaderIter.__init__

    def collected_first(self, loader):
        gc.collect()
        gc.freeze()
        original(self, loader)

    _MultiProcessingDataLoaderIter.__init__ = collected_first
    yield
    _MultiProcessingDataLoaderIter.__init__ = original


@pytest.fixture(autouse=True)
def fresh_batch_timer():
    """Each test starts as a new process does: no batches made yet. The process's timer
    otherwise carries earlier tests' batches, and a fast loader's are timed on a sample, so
    which batch is timed would hang on the tests run before in this process (pytest-xdist hands
    them out in no fixed order: one read a first batch's figures and found it untimed)."""
    from dataloader_tuner.instrument import probes

    probes._after_fork()


@pytest.fixture(autouse=True)
def no_process_left_behind():
    """Every test must leave no child, grandchild or unreaped zombie behind.

    Processes get 10 s to disappear on their own (a slow host's teardown); we never reap for
    the code under test (that would hide a missing wait), only afterwards so one leak does not
    fail later tests.
    """
    before = {p.pid for p in live_descendants()}
    yield
    deadline = time.monotonic() + 10.0
    leaked = [p for p in live_descendants() if p.pid not in before]
    while leaked and time.monotonic() < deadline:
        time.sleep(0.05)
        leaked = [p for p in live_descendants() if p.pid not in before]
    described = []
    for proc in leaked:
        try:
            described.append(f"{proc.pid} {proc.name()} ({proc.status()})")
            proc.kill()
            proc.wait(timeout=2)
        except psutil.Error:
            pass
    assert not described, f"{LEFT_BEHIND}: {described}"


@pytest.fixture
def db_path(tmp_path):
    return str(tmp_path / "runs.sqlite")
