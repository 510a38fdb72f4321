"""The tests' job runner (tests/jobs.py): a hung training job fails its test with the stacks of
its whole tree, and leaves nothing running."""

import sys

import pytest

from .jobs import run_job

CHILD = """
import ctypes, time
ctypes.CDLL(None).prctl(15, b"pt_data_worker", 0, 0, 0)  # PR_SET_NAME, as torch's workers
def waits_forever():
    time.sleep(600)
waits_forever()
"""
HANGS = f"""
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", {CHILD!r}])
def parent_waits():
    time.sleep(600)
parent_waits()
"""


@pytest.mark.slow  # 3 s: a job left to hang
def test_a_hung_job_fails_with_every_process_stack():
    with pytest.raises(pytest.fail.Exception) as failed:
        run_job([sys.executable, "-c", HANGS], timeout=3)
    message = str(failed.value)
    assert "still running after 3 s" in message
    assert "parent_waits" in message and "waits_forever" in message, message
    # the worker's C frames too (where it waits), the parent's Python ones only
    assert "clock_nanosleep" in message and "time_sleep" in message, message
    assert message.count("(libpython") == 1, message


def test_a_job_that_ends_gives_its_output():
    done = run_job([sys.executable, "-c", "print('out'); import sys; sys.exit(3)"])
    assert (done.returncode, done.stdout) == (3, "out\n")
