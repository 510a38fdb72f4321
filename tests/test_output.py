"""What the user's code prints becomes de-duplicated diagnostics with counts."""

from dataloader_tuner.run.output import MAX_DISTINCT, OutputLog


def test_warnings_and_lines_are_counted_once_each():
    log = OutputLog()
    text = (b"/data/lib.py:12: UserWarning: the current process just got forked\n"
            b"  warnings.warn(msg)\n"
            b"hello from a worker\n") * 3
    log.feed(text[:50])  # a line split across two reads waits for its end
    log.feed(text[50:])
    found = {d.code: d for d in log.diagnostics()}
    assert found["python_warning"].evidence == {"count": 3, "where": "/data/lib.py:12"}
    assert "UserWarning: the current process just got forked" in found["python_warning"].message
    assert found["printed_output"].evidence["count"] == 3
    assert len(log.diagnostics()) == 2  # the indented source line is not a line of its own


def test_tracebacks_are_left_to_the_error_report_and_distinct_lines_are_capped():
    log = OutputLog()
    log.feed(b"Traceback (most recent call last):\n  File \"x.py\", line 1\n")
    assert log.diagnostics() == []
    log.feed(b"".join(b"line %d\n" % i for i in range(MAX_DISTINCT + 5)))
    found = log.diagnostics()
    assert len(found) == MAX_DISTINCT + 1 and "5 more lines" in found[-1].message
