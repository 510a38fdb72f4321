"""Failure explanations and pitfall rules on hand-made inputs, including the cases this machine
cannot produce (no GPU, 24 GB of /dev/shm): torch's exact wording comes from KNOWLEDGE.md."""

import pytest

from engine import pitfalls
from engine.failures import explain_failure, hang_error, may_be_worker_death
from engine.probes import shape_mismatch

import torch


@pytest.mark.parametrize("text,error_type,phrase", [
    ("DataLoader worker (pid 4242) is killed by signal: Killed. ", "worker_killed",
     "out-of-memory killer"),
    ("DataLoader worker (pid 4242) is killed by signal: Bus error. It is possible that "
     "dataloader's workers are out of shared memory.", "worker_killed", "--shm-size"),
    ("unable to write to file </torch_123_456_0>: No space left on device (28)", "shm_full",
     "/dev/shm"),
    ("Too many open files. Communication with the workers is no longer possible.",
     "too_many_open_files", "set_sharing_strategy('file_system')"),
    ("received 0 items of ancdata", "too_many_open_files", "ulimit -n"),
    ("Caught RuntimeError in DataLoader worker process 0.\nOriginal Traceback (most recent "
     "call last):\nRuntimeError: Cannot re-initialize CUDA in forked subprocess. To use CUDA "
     "with multiprocessing, you must use the 'spawn' start method", "cuda_in_fork", "spawn"),
    ("Can't pickle local object 'make.<locals>.Local'", "not_picklable", "module-level"),
    ("DataLoader worker (pid(s) 17) exited unexpectedly", "worker_exited", "num_workers=0"),
])
def test_torch_failure_texts_get_a_headline_and_a_fix(text, error_type, phrase):
    error = explain_failure(RuntimeError(text))
    assert error.type == error_type and phrase in error.message
    assert "\n" not in error.message


def test_hang_without_outstanding_detail_still_says_what_to_do():
    error = hang_error(5.0, [])
    assert error.type == "hang" and "within 5 s" in error.message and "--timeout-s" in error.message


def test_shape_mismatch_names_the_field():
    samples = [{"image": torch.zeros(3, 8, 8), "boxes": torch.zeros(2, 4)},
               {"image": torch.zeros(3, 8, 8), "boxes": torch.zeros(5, 4)}]
    assert shape_mismatch(samples) == ("field 'boxes': shapes (2, 4) at sample 0 and (5, 4) at "
                                       "sample 1 of the batch")
    assert shape_mismatch([torch.zeros(2), torch.zeros(2)]) is None


def test_shm_pressure_from_batches_in_flight():
    shm = {"free_mb": 64.0, "total_mb": 64.0}  # Docker's default
    found = pitfalls.shm_pressure(8, 2, 4 * 2**20, shm)  # 8 x 2 x 4 MB = 64 MB
    assert found[0]["code"] == "shm_too_small" and found[0]["evidence"]["in_flight_mb"] == 64.0
    assert "--shm-size" in found[0]["fix"]
    assert pitfalls.shm_pressure(2, 2, 1 * 2**20, shm) == []
    assert pitfalls.shm_pressure(0, 0, 4 * 2**20, shm) == []


def test_rng_only_flagged_when_workers_share_a_state():
    same = [{"worker_id": w, "probe": {"rng_used": {"self.rng": "abc"}}} for w in (0, 1, 2)]
    found = pitfalls.duplicated_rng(same)
    assert found[0]["evidence"] == {"generator": "self.rng", "workers": [0, 1, 2]}
    assert "info.dataset.rng" in found[0]["fix"]
    differ = [{"worker_id": w, "probe": {"rng_used": {"self.rng": f"s{w}"}}} for w in (0, 1)]
    assert pitfalls.duplicated_rng(differ) == []
    main_only = [{"worker_id": -1, "probe": {"rng_used": {"self.rng": "abc"}}}]
    assert pitfalls.duplicated_rng(main_only) == []


def test_skew_needs_a_fivefold_gap():
    assert pitfalls.skewed_labels({0: 400, 1: 100}) == []
    found = pitfalls.skewed_labels({0: 950, 1: 50})
    assert found[0]["evidence"]["ratio"] == 19.0
    assert "{0: 1.0, 1: 19.0}" in found[0]["fix"]
    assert pitfalls.skewed_labels({0: 10}) == []


def test_memory_growth_needs_a_real_trend():
    def rows(sizes):
        return [{"t": 0.5 * i, "pid": 7, "role": "worker", "worker_id": 0, "rss_mb": s}
                for i, s in enumerate(sizes)]
    assert pitfalls.worker_memory_growth(rows([200, 260, 320, 380, 440, 500]))[0][
        "evidence"]["workers"][0]["mb_per_min"] == pytest.approx(7200.0)
    assert pitfalls.worker_memory_growth(rows([200, 205, 198, 203, 201, 204])) == []
    assert pitfalls.worker_memory_growth(rows([200, 400])) == []  # too few samples


def test_oversubscription_rules():
    system = {"cpus_usable": 2, "other_load_cpus": 0.0}
    assert pitfalls.cpu_oversubscription(4, system, 0.9)[0]["code"] == "more_workers_than_cpus"
    assert pitfalls.cpu_oversubscription(4, system, 0.1) == []  # waiting workers may outnumber
    busy = pitfalls.cpu_oversubscription(1, {"cpus_usable": 8, "other_load_cpus": 4.0}, 0.9)
    assert busy[0]["code"] == "cpus_busy_elsewhere" and busy[0]["severity"] == "info"
    threads = [{"role": "worker", "threads": 9}, {"role": "worker", "threads": 9}]
    assert pitfalls.thread_oversubscription(threads, 2, 2)[0]["evidence"]["threads_per_worker"] == 9
    assert pitfalls.thread_oversubscription(threads, 2, 16) == []


def test_restarts_each_epoch_only_without_persistent_workers():
    epochs = [{"startup_s": 0.5}, {"startup_s": 0.4}, {"startup_s": 0.4}]
    config = {"num_workers": 4, "persistent_workers": False}
    assert pitfalls.restarts_each_epoch(config, epochs, 3.0)[0]["evidence"]["startup_s"] == 0.4
    assert pitfalls.restarts_each_epoch({**config, "persistent_workers": True}, epochs, 3.0) == []
    assert pitfalls.restarts_each_epoch(config, epochs, 300.0) == []


def test_a_worker_reaped_before_torch_saw_its_signal_is_still_named():
    error = explain_failure(RuntimeError("DataLoader worker (pid(s) 77) exited unexpectedly"),
                            {77: 7})  # SIGBUS
    assert error.type == "worker_killed" and "Bus error" in error.message
    assert "--shm-size" in error.message


def test_a_broken_handover_connection_is_read_as_a_worker_death():
    # The main process was receiving a tensor's file descriptor when the worker died.
    reset = ConnectionResetError(104, "Connection reset by peer")
    assert may_be_worker_death(reset)
    assert may_be_worker_death(RuntimeError("DataLoader worker (pid(s) 77) exited unexpectedly"))
    assert not may_be_worker_death(KeyError("label"))
    error = explain_failure(reset, {77: 7})
    assert error.type == "worker_killed" and "--shm-size" in error.message
