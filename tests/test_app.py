"""The entry page in Streamlit's AppTest (no browser): a real profile and an error state."""

import os

from streamlit.testing.v1 import AppTest

from .conftest import ROOT, dataset_path


def _app(tmp_path, monkeypatch):
    monkeypatch.setenv("DLTUNER_DB", str(tmp_path / "runs.sqlite"))
    monkeypatch.chdir(ROOT)
    return AppTest.from_file(os.path.join(ROOT, "app.py"), default_timeout=60).run()


def test_page_opens_on_the_demo_dataset(tmp_path, monkeypatch):
    at = _app(tmp_path, monkeypatch)
    assert not at.exception
    assert at.text_input[0].label == "Dataset module"
    assert at.text_input[0].value.endswith("cpu_bound.py")


def test_profile_shows_measured_numbers(tmp_path, monkeypatch):
    at = _app(tmp_path, monkeypatch)
    at.text_input[0].input(dataset_path("small_map.py"))
    at.number_input[1].set_value(1.5)
    at.button[0].click().run()
    assert not at.exception
    assert "Measured" in at.success[0].value
    assert float(at.metric[0].value) > 0
    assert any("GPU: not measured" in w.value for w in at.warning)


def test_bad_target_shows_a_clear_error(tmp_path, monkeypatch):
    at = _app(tmp_path, monkeypatch)
    at.text_input[0].input(dataset_path("syntax_error.py"))
    at.button[0].click().run()
    assert not at.exception
    assert "Syntax error" in at.error[0].value and "line 3" in at.error[0].value
