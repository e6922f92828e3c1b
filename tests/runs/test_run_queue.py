"""A run queued after another (tunedeck train --queue, ⇥ Queue in the panel) starts by itself when that one ends,
on real 2-rank CPU runs; its supervisor does the waiting, so nothing else needs to stay open."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from tunedeck.backend.runs.manager import RunManager

from .helpers import PACED, end_record, log_records, logs_tail, start_record, tunedeck, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

QUIET_LONG = {"training.max_steps": 100000, "training.logging_steps": 100000, "training.save_steps": 100000}


def test_a_queued_run_starts_by_itself_when_the_run_ahead_has_ended(runs_dir, demo_spec, monkeypatch):
    monkeypatch.setenv(*PACED)
    manager = RunManager(runs_dir)
    ahead = manager.start(demo_spec(QUIET_LONG))
    wait_for(lambda: log_records(manager.run_dir(ahead)), 180, what=f"training\n{logs_tail(manager.run_dir(ahead))}")
    train = subprocess.Popen(
        [str(Path(sys.executable).parent / "tunedeck"), "train", "demo", "--queue", "--runs-dir", str(runs_dir),
         "--set", "training.max_steps=3"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    try:
        queued = wait_for(lambda: next((r.run_id for r in manager.list_runs() if r.run_id != ahead), None), 60)
        wait_for(lambda: manager.status(queued).waits_for, 30, what="the queued run's record")
        time.sleep(4)  # its supervisor looks each second: nothing may start while the run ahead trains
        status = manager.status(queued)
        assert (status.state, status.waits_for, status.pid) == ("queued", [ahead], None)
        assert not (manager.run_dir(queued) / "metrics.jsonl").exists()
        shown = tunedeck("runs", "show", queued, "--runs-dir", runs_dir)
        assert f"queue    waits for run {ahead} to end" in shown.stdout.splitlines(), shown.stdout

        manager.stop(ahead, grace_s=30)
        out, err = train.communicate(timeout=300)
    finally:
        train.kill()
    assert train.returncode == 0, out + err + logs_tail(manager.run_dir(queued))
    assert f"queued: waits for run {ahead} to end" in out.splitlines()
    first = manager.status(ahead)
    assert first.state == "stopped"
    assert start_record(manager.run_dir(queued))["time"] >= first.ended_at  # after, not beside it
    assert end_record(manager.run_dir(queued))["status"] == "finished"
