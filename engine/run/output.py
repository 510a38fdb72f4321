"""What the user's code printed in the engine's child and its workers, folded into diagnostics.

The child's stdout and stderr, which its DataLoader workers inherit, go to one log file (see
runner.py); the parent reads what is new as the run goes and feeds it here. Library warnings
(``warnings.warn`` prints ``file:line: Category: message``), and lines such as a tokenizer's
"the current process just got forked" notice, are repeated by every worker and every epoch:
each distinct line is kept once, with how often it was seen.
"""

from __future__ import annotations

import re
import threading

from dataloader_tuner.analyse.diagnostic import Diagnostic

MAX_DISTINCT = 30  # distinct lines kept; the rest are only counted
MAX_LINE = 300
_WARNING = re.compile(r"^(?P<where>.+?):(?P<line>\d+): (?P<category>\w*Warning): (?P<text>.*)$")


class OutputLog:
    """Distinct lines with their counts, in the order first seen. Thread-safe: the runner's
    reader thread feeds it while the page reads it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.counts: dict[tuple[str, str], int] = {}  # (code, text) -> times seen
        self.where: dict[tuple[str, str], str] = {}
        self.dropped = 0
        self._partial = b""

    def feed(self, data: bytes) -> None:
        """Take the next bytes of the log; a line cut off at the end waits for the rest."""
        lines = (self._partial + data).split(b"\n")
        self._partial = lines.pop()
        for raw in lines:
            self._line(raw.decode(errors="replace").rstrip())

    def _line(self, line: str) -> None:
        # Indented lines are a warning's source line or a traceback's body; the traceback's
        # own headline is the error the run reports.
        if not line.strip() or line[0].isspace() or line.startswith("Traceback ("):
            return
        found = _WARNING.match(line)
        if found:
            code = "torch_warning" if "torch" in found["where"] else "python_warning"
            self.add(code, f"{found['category']}: {found['text']}",
                     f"{found['where']}:{found['line']}")
        else:
            self.add("printed_output", line)

    def add(self, code: str, text: str, where: str = "") -> None:
        """One more sighting of a line (``code``: python_warning, torch_warning or
        printed_output)."""
        key = (code, text[:MAX_LINE])
        with self._lock:
            if key not in self.counts and len(self.counts) >= MAX_DISTINCT:
                self.dropped += 1
                return
            self.counts[key] = self.counts.get(key, 0) + 1
            if where:
                self.where.setdefault(key, where)

    def diagnostics(self) -> list[Diagnostic]:
        found = []
        with self._lock:
            seen = list(self.counts.items())
        for (code, text), count in seen:
            times = f" (seen {count} times: once per worker process or epoch, typically)" \
                if count > 1 else ""
            is_warning = code != "printed_output"
            kind = "A warning" if is_warning else "Output"
            found.append(Diagnostic(
                code, "warning" if is_warning else "info",
                f"{kind} from your code or a library it uses{times}: {text}",
                {"count": count, "where": self.where.get((code, text))}))
        if self.dropped:
            found.append(Diagnostic(
                "printed_output", "info", f"{self.dropped} more lines of output were not kept "
                f"(only the first {MAX_DISTINCT} distinct lines are).", {"count": self.dropped}))
        return found
