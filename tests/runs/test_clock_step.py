"""A step of the wall clock during a live run (NTP, a VM resumed), on a real 2-rank run.

Found by CI: its machine's clock went back while a demo run trained, and the panel called the
live run failed ("the run's processes are gone": the processes' start times, as wall-clock
times, had moved), offered Resume instead of Stop, and lost the ETA. The clock is really
stepped here (root only), and put back at the end.

The run must stay live and stoppable, its ETA and elapsed time must stay right.
"""

from __future__ import annotations

import contextlib
import os
import time

import pytest

from tunedeck.backend.runs.manager import RunManager
from tunedeck.backend.runs.records import read_records
from tunedeck.backend.runs.summary import summarize

from .helpers import log_records, logs_tail, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

STEPS_S = (-600.0, 600.0)  # back ten minutes, then forward again: the clock ends where it would have been


@contextlib.contextmanager
def clock_stepped(seconds: float):
    """The system's wall clock stepped by `seconds` while the block runs (CAP_SYS_TIME: root; skips elsewhere)."""
    try:
        time.clock_settime(time.CLOCK_REALTIME, time.time() + seconds)
    except PermissionError:
        # CI runs as root: there a missing capability is a failure, never a skip that hides it (as tests/conftest.py
        # does for the Slurm cluster); a developer without root gets a skip that says why.
        unavailable = pytest.fail if os.environ.get("CI") == "true" else pytest.skip
        unavailable("stepping the wall clock needs CAP_SYS_TIME (root)")
    try:
        yield
    finally:
        time.clock_settime(time.CLOCK_REALTIME, time.time() - seconds)


def test_a_clock_step_leaves_a_live_run_live_stoppable_and_its_times_right(runs_dir, demo_spec):
    manager = RunManager(runs_dir)
    run_id = manager.start(demo_spec({"training.max_steps": 5000}))
    launched = time.monotonic()
    run_dir = manager.run_dir(run_id)
    try:
        wait_for(lambda: len(log_records(run_dir)) >= 2, 180, what=f"two log records\n{logs_tail(run_dir)}")
        for step in STEPS_S:
            with clock_stepped(step):
                seen = len(log_records(run_dir))
                wait_for(lambda seen=seen: len(log_records(run_dir)) >= seen + 3, 60, what="log records after the step")
                status = RunManager(runs_dir).status(run_id)  # as a panel that reattaches reads it
                assert status.state == "running", f"clock stepped by {step:+.0f} s: {status.state}: {status.error}"
                summary = summarize(read_records(run_dir), status.started_at, None)
                assert "ETA" in summary.progress, summary.progress
                assert 0 < summary.elapsed_s < time.monotonic() - launched + 2, summary.progress
        assert manager.stop(run_id, grace_s=60).state == "stopping"
        assert manager.wait(run_id, timeout=90).state == "stopped"
    finally:
        if manager.status(run_id).state in ("queued", "running", "stopping"):
            manager.stop(run_id, grace_s=0)
            manager.wait(run_id, timeout=60)
    records = log_records(run_dir)
    assert all(r["seconds_per_step"] > 0 for r in records[1:])  # the trainer's own clock never went back
    assert all(r["tokens_per_second"] > 0 for r in records if "tokens_per_second" in r)


def test_a_run_just_queued_stays_queued_through_a_clock_step_and_an_abandoned_one_does_not(runs_dir, demo_spec):
    """Between its folder written and its supervisor recorded, a run is queued with no supervisor; readers give it
    30 s on the monotonic clock (it was the wall clock: a step forward failed a fresh run, a step back kept a run
    whose supervisor never came queued for as long)."""
    from tunedeck.backend.runs.supervisor import update_status

    manager = RunManager(runs_dir)
    run_id = manager._write_run_folder(demo_spec(), ["true"], None, {})  # queued; no supervisor started
    with clock_stepped(+600):
        assert RunManager(runs_dir).status(run_id).state == "queued"
    update_status(manager.run_dir(run_id), created_monotonic=time.monotonic() - 31)  # its supervisor never came
    with clock_stepped(-600):
        status = RunManager(runs_dir).status(run_id)
    assert status.state == "failed", (status.state, status.error)
