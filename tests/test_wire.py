"""Batch rows survive the packed trip from the child to the parent exactly."""

import json

import pytest

from dataloader_tuner.record.rows import BatchRecord
from dataloader_tuner.record.wire import pack_rows, unpack_rows


def _row(seq, h2d=None):
    return tuple(BatchRecord(seq, 0, 0.5 + seq, 1e-4, 2e-6, 64, 4608, seq % 2 - 1, 4242 + seq,
                             0.25, 3e-5, 1e-5, 2.5e-5, h2d, None, None))


def test_rows_round_trip_through_json_with_their_types():
    rows = [_row(0), _row(1, h2d=0.75), _row(2)]
    back = unpack_rows(json.loads(json.dumps(pack_rows(rows))))
    assert back == rows
    assert all(type(v) is int for v in back[1][:2] + back[1][5:9])  # ints stay ints
    assert back[0][13] is None and back[1][13] == 0.75  # None in a GPU column stays None
    assert type(back[0][6]) is int  # bytes, where read, stay ints


def test_figures_not_read_on_a_sampled_batch_stay_none():
    row = tuple(BatchRecord(0, 0, 0.5, 1e-4, 2e-6, 64, None, -1, 42, 0.25, 3e-5, 1e-5, None))
    assert unpack_rows(pack_rows([row])) == [row]


def test_rows_from_other_engine_code_are_refused():
    packed = pack_rows([_row(0)[:-1]])  # one column short, as an older child would send
    with pytest.raises(ValueError, match="15 columns"):
        unpack_rows(packed)


def test_no_rows():
    assert unpack_rows(pack_rows([])) == []


def test_batch_records_pack_as_plain_rows_and_their_line_is_json():
    from dataloader_tuner import protocol

    records = [BatchRecord(*_row(0)), BatchRecord(*_row(1, h2d=0.5))]
    line = protocol.encode(protocol.Batches(records))  # written without json.dumps
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    assert json.loads(line)["n"] == 2
    assert protocol.decode(line).rows == [tuple(r) for r in records]
