"""The run history is written while a run goes, not only at the end."""

import time

from engine.runner import RunHandle, RunRequest, RunState
from engine.store import DB_ENV, RunStore, default_db_path

from .conftest import dataset_path


def test_batches_are_in_the_database_while_the_run_is_going(db_path):
    store = RunStore(db_path)
    request = RunRequest(target=dataset_path("small_map.py"), settings={"batch_size": 4},
                         seconds=30)
    handle = RunHandle(request, store).start()
    try:
        reader = RunStore(db_path)  # a second connection, like the dashboard's
        deadline = time.monotonic() + 20
        while not reader.batches(handle.run_id) and time.monotonic() < deadline:
            time.sleep(0.1)
        in_flight = reader.get_run(handle.run_id)
        assert in_flight["status"] == "running"
        assert reader.batches(handle.run_id) and in_flight["dataset"]["class"].endswith("SmallMap")
        assert reader.resources(handle.run_id) is not None
    finally:
        assert handle.stop() is RunState.STOPPED
    final = reader.get_run(handle.run_id)
    assert final["status"] == "stopped" and final["summary"]["batches"] > 0
    assert reader.events(handle.run_id, "finished")


def test_failed_runs_keep_their_error(db_path):
    store = RunStore(db_path)
    handle = RunHandle(RunRequest(target=dataset_path("nothing_here.py")), store).start()
    handle.wait(30)
    saved = store.get_run(handle.run_id)
    assert saved["status"] == "error" and saved["error"]["type"] == "target_no_dataset"


def test_default_path_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv(DB_ENV, str(tmp_path / "x.sqlite"))
    assert default_db_path() == str(tmp_path / "x.sqlite")
    monkeypatch.delenv(DB_ENV)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path))
    assert default_db_path() == str(tmp_path / "dataloader-tuner" / "runs.sqlite")
