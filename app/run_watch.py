"""What the panel knows about a run, grown from the bytes its files gained since the last look.

One RunWatch per run folder, shared by every browser session: a tick reads only what
metrics.jsonl and the rank-0 log gained (backend.tail), so ten open tabs on a week-long
run cost what one costs. `version` changes exactly when something new arrived, which
lets a session skip redrawing when nothing did. Pure Python: tested without a browser.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict, deque
from pathlib import Path

from tunedeck.backend.runs import format_clock
from tunedeck.backend.tail import JsonlTail, TextTail, is_number

LOG_LINES = 200  # rank-0 log lines kept for the page
MIN_REFRESH_S = 0.25  # sessions ticking together read the files once


class RunWatch:
    def __init__(self, run_dir: Path):
        self.run_dir = Path(run_dir)
        self._metrics = JsonlTail(self.run_dir / "metrics.jsonl")
        self._logs = {name: TextTail(self.run_dir / "logs" / name) for name in ("rank0.log", "launcher.log")}
        self.start: dict | None = None
        self.end: dict | None = None
        self.records: list[dict] = []  # "log" events, in order
        self.lines: dict[str, deque[str]] = {name: deque(maxlen=LOG_LINES) for name in self._logs}
        self.version = 0
        self._read_at = 0.0
        self._lock = threading.Lock()

    def refresh(self) -> int:
        """Read what was appended since the last call; returns the (possibly new) version."""
        with self._lock:
            if time.monotonic() - self._read_at < MIN_REFRESH_S:
                return self.version
            self._read_at = time.monotonic()
            changed = False
            for record in self._metrics.read_new():
                changed = True
                event = record.get("event")
                if event == "start":
                    self.start = record
                elif event == "end":
                    self.end = record
                elif event == "log" and is_number(record.get("step")):
                    self.records.append(_numbers_only(record))
            for name, tail in self._logs.items():
                text = tail.read_new()
                if text:
                    changed = True
                    # A progress bar rewrites its line with \r: keep what the terminal would show.
                    lines = text.removesuffix("\n").split("\n")  # not splitlines(): it splits at \r too
                    self.lines[name].extend(line.rsplit("\r", 1)[-1] for line in lines)
            if changed:
                self.version += 1
            return self.version

    def log_text(self) -> tuple[str, str]:
        """(which log, its last lines): rank 0's log, or the launcher's while rank 0 has written nothing."""
        with self._lock:
            name = "rank0.log" if self.lines["rank0.log"] else "launcher.log"
            return name, "\n".join(self.lines[name])

    @property
    def last(self) -> dict | None:
        return self.records[-1] if self.records else None


def _numbers_only(record: dict) -> dict:
    """A log record with only the fields the view can compute with: one damaged line never breaks the page."""
    return {
        key: value
        for key, value in record.items()
        if key == "event" or is_number(value) or (isinstance(value, list) and all(is_number(v) for v in value))
    }


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


# ---------------------------------------------------------------- one-line summaries


def strategy_label(start: dict) -> str:
    kind = start.get("distributed_type")
    if kind == "DEEPSPEED":
        stage = start.get("zero_stage")
        return f"DeepSpeed ZeRO-{stage}" if stage is not None else "DeepSpeed"
    if kind == "FSDP" or start.get("fsdp"):
        return "FSDP"
    if kind in ("MULTI_GPU", "MULTI_CPU", "MULTI_XPU", "MULTI_NPU"):
        return "DDP"
    if kind == "NO":
        return "single process"
    return str(kind or "?")


def facts_line(start: dict | None) -> str:
    """The start record in one line, e.g. '2 ranks · DeepSpeed ZeRO-3 · 0.4% of parameters trainable'."""
    if not start:
        return ""
    world = start.get("world_size")
    parts = [f"{world} rank{'s' * (world != 1)}" if isinstance(world, int) else "? ranks", strategy_label(start)]
    trainable, total = start.get("trainable_params"), start.get("total_params")
    if isinstance(trainable, int) and isinstance(total, int) and total > 0:
        parts.append(f"{100 * trainable / total:.{1 if trainable / total >= 0.001 else 3}f}% of parameters trainable ({trainable:,} of {total:,})")
    if start.get("method"):
        parts.append(str(start["method"]))
    if start.get("model_class"):
        parts.append(str(start["model_class"]))
    return " · ".join(parts)


def progress(watch: RunWatch, started_at: float | None, ended_at: float | None, now: float | None = None) -> tuple[float, str]:
    """(fraction done, 'step 12/30 · elapsed 0:14 · ETA 0:21')."""
    now = now or time.time()
    last = watch.last
    step = last.get("step", 0) if last else 0
    total = (last or {}).get("max_steps") or (watch.start or {}).get("max_steps")
    total = total if is_number(total) else None
    elapsed = ((ended_at or now) - started_at) if started_at else None
    parts = [f"step {step}/{total}" if total else f"step {step}"]
    if elapsed is not None:
        parts.append(f"elapsed {format_clock(elapsed)}")
    if ended_at is None and total and step and len(watch.records) >= 2:
        first = watch.records[0]
        span_steps = step - first.get("step", 0)
        span_s = last.get("time", 0) - first.get("time", 0)
        if span_steps > 0 and span_s > 0:
            parts.append(f"ETA {format_clock((total - step) * span_s / span_steps)}")
    fraction = min(1.0, step / total) if total else 0.0
    return fraction, " · ".join(parts)


def measured_peaks(watch: RunWatch) -> dict[str, list[float]]:
    """Highest GPU memory per rank seen so far (GB): {'allocated': [...], 'reserved': [...]}."""
    peaks: dict[str, list[float]] = {}
    for record in watch.records:
        for key, label in (("gpu_peak_allocated_gb", "allocated"), ("gpu_peak_reserved_gb", "reserved")):
            values = record.get(key)
            if isinstance(values, list) and values:
                old = peaks.get(label, [0.0] * len(values))
                peaks[label] = [max(a, b or 0.0) for a, b in zip(old, values)] if len(old) == len(values) else values
    return peaks
