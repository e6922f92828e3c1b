"""A run that stopped making progress: each rank's stall watchdog, and the startup phases watched as steps are."""

from __future__ import annotations

import contextlib
import faulthandler
import os
import sys
import threading
import time
from pathlib import Path

from .ranks import global_rank
from .records import ERRORS_FILE, JsonlWriter, StartupPhases

STALL_GAP_FACTOR = 3  # a gap this many times the longest seen (an evaluation) is no stall (the supervisor's rule)


class StallWatchdog:
    """Every rank watches its own steps (job.launch.stall_minutes): with none for that long, and for 3x the longest
    gap seen, it writes every thread's Python stack to its log once (a stuck rank shows where it waits); with
    launch.stop_when_stalled it then ends the run, as a failure that says so. A thread of its own, which runs while
    the main thread waits in a collective or in C++ (they release the GIL). Checkpoint saves are not watched."""

    def __init__(self, job: dict, run_dir: Path, phase: str | None = None):
        launch = job.get("launch") or {}
        self.after_s = float(launch.get("stall_minutes", 10) or 0) * 60
        self.stop = bool(launch.get("stop_when_stalled"))
        self.errors = run_dir / ERRORS_FILE
        self.phase = phase  # a startup phase watched as steps are (watched_phase), or None: the steps
        self.step, self.beat_at, self.longest_gap = 0, time.monotonic(), 0.0
        self.dumped = False
        self.done = threading.Event()

    def start(self, step: int) -> None:
        if self.after_s > 0:
            self.step, self.beat_at = step, time.monotonic()
            threading.Thread(target=self._watch, name="tunedeck-stall-watchdog", daemon=True).start()

    def beat(self, step: int | None = None) -> None:
        now = time.monotonic()
        if not self.dumped:  # a stall's gap would raise the limit for good
            self.longest_gap = max(self.longest_gap, now - self.beat_at)
        self.beat_at, self.dumped = now, False
        if step is not None:
            self.step = step

    def saved(self) -> None:
        """A checkpoint was saved: the wait starts again, and the save's time is no step's gap."""
        self.beat_at, self.dumped = time.monotonic(), False

    def limit(self) -> float:
        return max(self.after_s, STALL_GAP_FACTOR * self.longest_gap)

    def _watch(self) -> None:
        while not self.done.wait(1.0):
            if CHECKPOINT_SAVING.is_set():  # a save is no stall: the wait starts again when it ends
                self.saved()
                continue
            waited = time.monotonic() - self.beat_at
            if self.dumped or waited <= self.limit():
                continue
            self.dumped = True
            if self.phase:
                stalled = f"stalled: {self.phase} for {waited / 60:.0f} min"
            else:
                stalled = f"stalled: no training step for {waited / 60:.0f} min after step {self.step}"
            print(f"\ntunedeck: {stalled} on rank {global_rank()}; every thread's stack:", file=sys.stderr, flush=True)
            faulthandler.dump_traceback(all_threads=True)
            if self.stop:
                error = f"{stalled} (launch.stall_minutes, launch.stop_when_stalled); each rank's stack is in its log"
                JsonlWriter(self.errors).write({"rank": global_rank(), "time": time.time(), "error": error})
                os._exit(STALLED_EXIT)  # the main thread is stuck: nothing else would end this process


@contextlib.contextmanager
def watched_phase(job: dict, run_dir: Path, startup: StartupPhases, phase: str):
    """A startup phase that runs your code (WATCHED_PHASES: a reward module's import), entered and watched as steps
    are: a hang there is a stall (its stack in the log; launch.stop_when_stalled ends the run), where loading a model,
    however long, is not. The supervisor marks the run stalled from startup.json by the same rule."""
    startup.enter(phase)
    watchdog = StallWatchdog(job, run_dir, phase)
    watchdog.start(0)
    try:
        yield
    finally:
        watchdog.done.set()


IMPORTING_REWARDS = "importing the reward functions"

WATCHED_PHASES = (IMPORTING_REWARDS,)  # the supervisor reads these as steps too

STALLED_EXIT = 3

FORWARDS_TOLD_EVERY_S = 2.0  # how often forward passes reach progress.json (the supervisor checks each second)

CHECKPOINT_SAVING = threading.Event()  # set while a checkpoint is written (with_atomic_checkpoints)
