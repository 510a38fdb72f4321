"""The process protocol's types: the request and every event survive the wire as themselves,
and every error code the engine raises is in the catalogue."""

import ast
import dataclasses
import json
import os

import pytest

from dataloader_tuner import protocol
from dataloader_tuner.errors import ERROR_CODES, ConfigError, EngineError, RunError, TargetError
from dataloader_tuner.record.cards import Consumer, DatasetCard
from dataloader_tuner.record.rows import BatchRecord
from dataloader_tuner.record.trials import InPlaceDecision, TrialResult, TunePlan
from dataloader_tuner.record.windows import BatchWindow
from dataloader_tuner.system import SystemSnapshot

ENGINE_DIR = os.path.join(os.path.dirname(os.path.dirname(__file__)), "engine")

ROW = tuple(BatchRecord(3, 0, 0.5, 1e-4, 2e-6, 64, None, -1, 4242, 0.25, 3e-5, 1e-5, None,
                        None, None, None))

TRIAL = TrialResult(2, None, False, False, 8, 1000.0, 200, 1.5, 0.05, 0.1, 0.2, 0.4, 3.0, 2.5,
                    0.1, 1.0, 0.3, 4096.0, 12.0, rate_ci=0.02)
CARD = DatasetCard("data.py", "dataset", "data.Small", "map", 10, False, None, False, False,
                   False, False)

EXAMPLES = [
    protocol.Ready(mode="profile", pid=7, dataset=CARD, config={"batch_size": 2},
                   snippet="DataLoader(dataset)", consumer=Consumer("none"), system=SystemSnapshot.from_dict({"cpus_usable": 2}),
                   warmup_batches=1, counting={"samples": "indices"}, torch="2.13.0"),
    protocol.Batches([ROW, ROW]),
    protocol.Windows([BatchWindow(32, 250, 0, 1.5, 1.6, 8000, 0.02, 0.001, 0.003, 1e-4,
                                  ((113, 200), (121, 50)), ((-1, 250),)).to_row()]),
    protocol.LateTimings(gaps=[[3, 1.5]], copies=[[3, 0.25, None]]),
    protocol.Resources(t=0.5, procs=[{"pid": 7, "role": "main", "rss_mb": 90.0}]),
    protocol.Epoch(epoch=1, t=2.0, startup_s=0.1),
    protocol.EpochEnded(epoch=1, t=9.5, batches=64),
    protocol.Probe(pid=8, worker_id=0, probe={"rng_used": {}}),
    protocol.Profiled(pid=8, worker_id=0, sampled=[["main", [["/d.py", 3, "D.__getitem__", 5]], 0.01, 0.012, 2]]),
    protocol.Labels({0: 880, 9: 40}, "dataset"),
    protocol.WarningCaught("python_warning", "UserWarning: careful", "data.py:3"),
    protocol.Overdue(10, 0.4, 1.2, 0.002, False,
                     [{"worker_id": 0, "indices": [40, 41], "stack": "File \"d.py\", line 1"}]),
    protocol.Measured(InPlaceDecision(2, 10.0, 0.03, "kept: 12% faster than 1 worker")),
    protocol.Measured(TRIAL),
    protocol.Plan(TunePlan(0.95, 12, 190.0, 2.0, predicted_workers=2, budget_s=None)),
    protocol.Tuned({"recommended": {"num_workers": 2}}),
    protocol.Error(RunError("boom", type="getitem_error").to_dict()),
    protocol.Finished(reason="deadline", t=3.0),
]


def test_a_trial_document_from_an_older_version_is_read_by_its_phase():
    from dataloader_tuner.record.trials import trial_from_dict

    old = trial_from_dict({"phase": "in_place", "num_workers": 3, "samples_per_s": None,
                           "rate_ci": None, "verdict": "tuning in place is off: no len()"})
    assert old == InPlaceDecision(3, None, None, "tuning in place is off: no len()")
    doc = {k: v for k, v in TRIAL.to_dict().items() if k not in ("ranks_measured", "phase")}
    assert trial_from_dict({**doc, "unknown_later_field": 1}) == TRIAL


def test_every_event_kind_has_an_example_here():
    assert {type(e).kind for e in EXAMPLES} == set(protocol.EVENT_TYPES)


@pytest.mark.parametrize("event", EXAMPLES, ids=lambda e: type(e).kind)
def test_events_survive_the_wire_as_themselves(event):
    line = protocol.encode(event)
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    assert protocol.decode(line) == event


def test_the_protocol_note_lists_every_event():
    note = protocol.__doc__
    for cls in protocol.EVENT_TYPES.values():
        assert f" {cls.__name__} " in note, cls.__name__


def test_an_unknown_event_kind_is_refused_by_name():
    with pytest.raises(ValueError, match="'gossip'"):
        protocol.decode(json.dumps({"e": "gossip"}))


def test_the_request_round_trips_with_where_and_for_whom_it_runs():
    request = protocol.RunRequest("data.py:make", settings={"num_workers": 2}, kind="tune",
                                  budget_s=30.0, tuned_workers=4)
    doc = json.loads(json.dumps(request.to_json()))
    back = protocol.RunRequest.from_json(doc)
    assert back.cwd == os.getcwd() and back.parent_pid == os.getpid()
    assert dataclasses.replace(back, cwd=None, parent_pid=None) == request
    assert doc["kind"] == "tune"  # the same name on the wire as in the code


def test_requests_from_other_engine_code_or_with_unknown_kinds_are_refused():
    with pytest.raises(ValueError, match="unknown request fields"):
        protocol.RunRequest.from_json({"target": "t.py", "consumer": "none"})
    with pytest.raises(ValueError, match="unknown run kind 'bench'"):
        protocol.RunRequest("t.py", kind="bench")


@pytest.mark.parametrize("cls", [EngineError, TargetError, ConfigError, RunError])
def test_errors_keep_their_class_across_the_pipe(cls):
    error = cls("headline", details="traceback", type="engine_error")
    back = EngineError.from_dict(json.loads(json.dumps(error.to_dict())))
    assert type(back) is cls and back.to_dict() == error.to_dict()


def _engine_calls():
    """Every call expression in engine/ and its packages."""
    for folder, _, names in sorted(os.walk(ENGINE_DIR)):
        for name in sorted(n for n in names if n.endswith(".py")):
            with open(os.path.join(folder, name)) as f:
                yield from (node for node in ast.walk(ast.parse(f.read()))
                            if isinstance(node, ast.Call))


def _raised_codes() -> set[str]:
    """Every literal ``type="..."`` given to an error class anywhere in engine/."""
    return {keyword.value.value for node in _engine_calls()
            if getattr(node.func, "id", "").endswith("Error")
            for keyword in node.keywords
            if keyword.arg == "type" and isinstance(keyword.value, ast.Constant)}


def test_every_error_code_the_engine_raises_is_in_the_catalogue():
    raised = _raised_codes()
    assert len(raised) > 20  # the scan found the engine's errors
    assert raised - set(ERROR_CODES) == set()
    assert set(ERROR_CODES) - raised == {"engine_error"}  # the default: no code is stale


def _diagnostic_codes() -> set[str]:
    """The first argument of every ``diagnostic(...)`` / ``Diagnostic(...)`` in engine/."""
    return {node.args[0].value for node in _engine_calls()
            if getattr(node.func, "id", "") in ("diagnostic", "Diagnostic")
            and node.args and isinstance(node.args[0], ast.Constant)}


def test_every_diagnostic_code_is_in_the_catalogue_and_none_is_stale():
    from dataloader_tuner.analyse.diagnostic import CODES

    found = _diagnostic_codes()
    # the output log's two warning codes are chosen at run time (output.py)
    assert found | {"python_warning", "torch_warning"} == set(CODES)


def test_a_diagnostic_with_an_unknown_code_is_refused():
    from dataloader_tuner.analyse.diagnostic import Diagnostic

    with pytest.raises(ValueError, match="'made_up'"):
        Diagnostic("made_up", "warning", "text")
    back = Diagnostic.from_dict(json.loads(json.dumps(
        Diagnostic("short_run", "info", "Only 3 batches", {"steady_batches": 3}).to_dict())))
    assert back == Diagnostic("short_run", "info", "Only 3 batches", {"steady_batches": 3})


def test_every_recording_the_page_tests_replay_speaks_todays_protocol():
    """tests/recordings are real runs replayed by the page tests: a protocol change that they
    no longer match fails here (record them again: python -m tests.replay record-all)."""
    from .replay import MANIFEST, load

    for name, _, kind, _ in MANIFEST:
        events, meta = load(name)
        assert protocol.RunRequest.from_json(meta["request"]).kind == kind
        decoded = [protocol.from_wire(doc) for doc in events]
        assert isinstance(decoded[-1], protocol.Finished), name
        if kind != "inspect" or not any(isinstance(e, protocol.Error) for e in decoded):
            assert isinstance(decoded[0], protocol.Ready), name


def test_label_counts_come_back_as_ints_and_odd_labels_never_fail_the_run():
    event = protocol.decode(json.dumps({"e": "labels", "counts": {"3": 5, "cat": 2}}))
    assert event == protocol.Labels({3: 5, "cat": 2}, "batches")


def test_a_dataset_card_keeps_its_json_keys_and_reads_older_ones():
    from dataloader_tuner.record.cards import DatasetCard

    card = DatasetCard("data.py", "dataset", "data.Small", "map", 64, True, 8, False, True,
                       False, True, sample={"x": "Tensor[float32](3,)"}, sample_bytes=12)
    doc = card.to_dict()
    assert doc["class"] == "data.Small" and "class_name" not in doc and "sample_error" not in doc
    assert DatasetCard.from_dict(json.loads(json.dumps(doc))) == card
    # A watched run's card as an older version saved it in the history:
    old = DatasetCard.from_dict({"target": "train", "class": "m.D", "kind": "iterable",
                                 "length": None, "probed": True, "not_probed_because": None})
    assert old.class_name == "m.D" and old.kind == "iterable" and not old.has_sampler
