"""What the panel knows about a run, grown from the bytes its files gained since the last look.

One RunWatch per run folder, shared by every browser session: a tick reads only what
metrics.jsonl and the rank-0 log gained (backend.run_folder's reader), so ten open tabs on a
week-long run cost what one costs. `version` changes exactly when something new arrived
(`records_version` and `log_version` say which), which lets a session skip redrawing when
nothing did. What the view says about the run comes from backend.run_summary, as the CLI's
does. Pure Python: tested without a browser.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict, deque
from pathlib import Path

from tunedeck.backend.runs import (
    LAUNCHER_LOG,
    MetricsReader,
    RunRecords,
    RunTelemetry,
    TextTail,
    rank_log,
    telemetry_warnings,
)

LOG_LINES = 200  # rank-0 log lines kept for the page
MIN_REFRESH_S = 0.25  # sessions ticking together read the files once


class RunWatch(RunRecords):
    def __init__(self, run_dir: Path):
        super().__init__()
        self.run_dir = Path(run_dir)
        self._metrics = MetricsReader(self.run_dir)
        # Rank 0's log is shown once it has written; the launcher's until then.
        self._logs = {Path(path).name: TextTail(self.run_dir / path) for path in (rank_log(0), LAUNCHER_LOG)}
        self.lines: dict[str, deque[str]] = {name: deque(maxlen=LOG_LINES) for name in self._logs}
        self.telemetry = RunTelemetry(self.run_dir)  # every machine's GPUs and host (telemetry/<host>.jsonl)
        self.warnings: tuple[str, ...] = ()  # what the telemetry says to look at (throttling, ECC, XID, an idle GPU)
        self.version = 0
        self.records_version = 0  # changes when metrics records arrived: the charts need redrawing
        self.log_version = 0  # changes when the log grew: the log box needs redrawing
        self._read_at = 0.0
        self._lock = threading.Lock()

    def refresh(self) -> int:
        """Read what was appended since the last call; returns the (possibly new) version."""
        with self._lock:
            if time.monotonic() - self._read_at < MIN_REFRESH_S:
                return self.version
            self._read_at = time.monotonic()
            records = self.add(self._metrics.read_new())
            if records:
                self.records_version += 1
            log_grew = False
            for name, tail in self._logs.items():
                text = tail.read_new()
                if text:
                    log_grew = True
                    # A progress bar rewrites its line with \r: keep what the terminal would show.
                    lines = text.removesuffix("\n").split("\n")  # not splitlines(): it splits at \r too
                    self.lines[name].extend(line.rsplit("\r", 1)[-1] for line in lines)
            if log_grew:
                self.log_version += 1
            machines = self.telemetry.read()
            if machines:
                self.warnings = tuple(telemetry_warnings(self.telemetry.listed()))
            if records or log_grew or machines:
                self.version += 1
            return self.version

    def log_text(self) -> tuple[str, str]:
        """(which log, its last lines): rank 0's log, or the launcher's while rank 0 has written nothing."""
        with self._lock:
            name = next((name for name, lines in self.lines.items() if lines), Path(LAUNCHER_LOG).name)
            return name, "\n".join(self.lines[name])


class RunWatches:
    """A small LRU of RunWatch by run folder (a reopened run is read from its start once)."""

    def __init__(self, size: int = 16):
        self._size = size
        self._watches: OrderedDict[Path, RunWatch] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, run_dir: Path) -> RunWatch:
        run_dir = Path(run_dir)
        with self._lock:
            watch = self._watches.pop(run_dir, None) or RunWatch(run_dir)
            self._watches[run_dir] = watch
            while len(self._watches) > self._size:
                self._watches.popitem(last=False)
            return watch
