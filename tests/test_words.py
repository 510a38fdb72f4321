"""The words of docs/development.md as the code has them: the events it lists are the
protocol's, and "summary" names one thing (its "Words")."""

from __future__ import annotations

import os
import re

from dataloader_tuner import protocol

from .test_layout import PACKAGE, ROOT, package_modules

GUIDE = os.path.join(ROOT, "docs", "development.md")
SUMMARY = re.compile(r"summar(y|ies)", re.IGNORECASE)
# A rank's summary, the only summary: where it is made, sent, gathered and shown
RANK_SUMMARY_MODULES = {f"{PACKAGE}.analyse.ranks", f"{PACKAGE}.watcher.job_report",
                        f"{PACKAGE}.dashboard.job_board", f"{PACKAGE}.dashboard.watched_page"}
# ...its names elsewhere, and a run's result under the names an older version gave it, kept for
# the history files and the scripts that read them (the glossary says so)
ALLOWED = ("RankSummary", "summary_from_batches", "summary_json", '"summary"')


def test_the_events_the_guide_lists_are_the_protocol_s():
    with open(GUIDE, encoding="utf-8") as f:
        listed = re.search(r"one frozen dataclass per event: (.*?)\);", f.read(), re.S)
    assert listed is not None
    named = set(re.findall(r"`(\w+)`", listed.group(1)))
    assert named == {cls.__name__ for cls in protocol.EVENT_TYPES.values()}


def test_summary_is_said_of_a_rank_s_summary_only():
    said = []
    for module, path in package_modules().items():
        if module in RANK_SUMMARY_MODULES:
            continue
        with open(path, encoding="utf-8") as f:
            for number, line in enumerate(f, 1):
                for name in ALLOWED:
                    line = line.replace(name, "")
                if SUMMARY.search(line):
                    said.append(f"{path}:{number}: {line.strip()}")
    assert said == []


def test_the_guide_says_which_older_names_remain():
    with open(GUIDE, encoding="utf-8") as f:
        words = f.read().split("## Words", 1)[1].split("\n## ", 1)[0]
    assert "`summary_json`" in words and '"summary"' in words


def test_no_two_modules_share_a_name():
    """A file name says which module it is: two stalls.py (the watch and the diagnostic), two
    trials.py, two access.py and two trace.py were read for one another (issue 65)."""
    by_name: dict[str, list[str]] = {}
    for module, path in package_modules().items():
        name = os.path.basename(path)
        if name not in ("__init__.py", "__main__.py"):
            by_name.setdefault(name, []).append(module)
    assert {name: modules for name, modules in by_name.items() if len(modules) > 1} == {}
