"""Runs that go wrong from outside, on real 2-rank runs (issue 8, points 5, 6 and 8).

A run whose folder is deleted keeps running: it must still be listed, stoppable, and say
what happened. A rank killed by a signal is the cause, not the survivor's lost connection.
A second Ctrl-C on `tunedeck train` exits 130, as documented.
"""

from __future__ import annotations

import functools
import operator
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from tunedeck.backend.runs.manager import RunManager

from .helpers import PACED, log_records, logs_tail, run_processes, still_alive, tunedeck, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

# Long enough to still run when the test acts, and writing nothing into its folder after the first
# log record (the first step is always logged).
QUIET_LONG = {"training.max_steps": 100000, "training.logging_steps": 100000, "training.save_steps": 100000}


@pytest.fixture(autouse=True)
def paced(monkeypatch):
    """Every run here trains until the test acts on it."""
    monkeypatch.setenv(*PACED)


def test_a_run_whose_folder_was_deleted_is_listed_and_stopped(runs_dir, demo_spec):
    manager = RunManager(runs_dir)
    run_id = manager.start(demo_spec(QUIET_LONG))
    run_dir = manager.run_dir(run_id)
    wait_for(lambda: log_records(run_dir), 180, what=f"training\n{logs_tail(run_dir)}")
    processes = run_processes(run_dir)
    supervisor = processes[0].parent()
    for _ in range(20):  # the live run writes into the folder while it goes: delete again what it wrote meanwhile
        shutil.rmtree(run_dir, ignore_errors=True)
        if not run_dir.exists():
            break
    assert not run_dir.exists()

    listing = tunedeck("runs", "--runs-dir", runs_dir)
    assert listing.returncode == 0, listing.stderr
    assert re.search(rf"^{run_id}\s+-\s+running\s", listing.stdout, re.M), listing.stdout  # no name: "-"
    assert "(folder deleted)" in listing.stdout, listing.stdout
    assert manager.active_run() == run_id
    show = tunedeck("runs", "show", run_id, "--runs-dir", runs_dir)
    assert show.returncode == 0 and f"{run_dir} was deleted while the run was live" in show.stdout, (
        show.stdout + show.stderr
    )

    stop = tunedeck("runs", "stop", run_id, "--grace", "30", "--runs-dir", runs_dir, timeout=180)
    assert stop.returncode == 0, stop.stdout + stop.stderr
    assert f"stopping run {run_id}: {run_dir} was deleted while it ran" in stop.stdout
    assert (
        f"run {run_id}: stopped ({run_dir} was deleted while the run was live; its processes have ended" in stop.stdout
    )
    assert still_alive([supervisor, *processes]) == []
    assert RunManager(runs_dir).list_runs() == []


def test_a_rank_killed_by_a_signal_is_reported_as_the_cause(runs_dir, demo_spec):
    manager = RunManager(runs_dir)
    # Not started again (launch.max_restarts=0): the error it ends with (tests/runs/test_restarts.py: started again).
    run_id = manager.start(
        demo_spec({"training.max_steps": 2000, "training.save_steps": 1000, "launch.max_restarts": 0})
    )
    run_dir = manager.run_dir(run_id)
    wait_for(lambda: log_records(run_dir), 180, what=f"training\n{logs_tail(run_dir)}")
    ranks = {p.environ().get("RANK"): p for p in run_processes(run_dir)[0].children()}
    ranks["1"].send_signal(signal.SIGKILL)  # as the kernel's OOM killer would

    status = manager.wait(run_id, timeout=180)
    assert status.state == "failed", f"{status}\n{logs_tail(run_dir)}"
    headline, *rest = status.error.splitlines()
    assert headline == (
        "rank 1 was killed by SIGKILL (signal 9): out of memory (the kernel's OOM killer: see `dmesg`) "
        "or killed by hand; see logs/rank1.log"
    ), status.error
    assert "exitcode  : -9" in (run_dir / "logs" / "launcher.log").read_text()  # what torch's launcher said
    assert status.failure == {
        "kind": "comm",  # the kernel's OOM killer killed nothing (its count in the memory cgroup did not grow)
        "reason": "rank 1 was lost: killed by SIGKILL from outside the run",
        "not_retried": "it was started again 0 times already (launch.max_restarts=0)",
    }
    if rest:  # the survivor's error, when it wrote one, comes after, as a consequence
        assert rest[0].startswith("then rank 0 failed:")
    assert still_alive(list(ranks.values())) == []


@pytest.mark.parametrize("pause", [True, False], ids=["after-the-request", "at-once"])
def test_a_second_ctrl_c_leaves_the_run_stopping_and_exits_130(runs_dir, demo_home, pause):
    """Pressed again while the stop is being requested, the request is still made whole before the command leaves."""
    train = subprocess.Popen(
        [
            str(Path(sys.executable).parent / "tunedeck"),
            "train",
            "demo",
            "--runs-dir",
            str(runs_dir),
            *functools.reduce(operator.iadd, (["--set", f"{k}={v}"] for k, v in QUIET_LONG.items()), []),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        for line in train.stdout:
            if "step 1/" in line:  # training, per the progress bar
                break
        train.send_signal(signal.SIGINT)
        if pause:
            wait_for(lambda: RunManager(runs_dir).list_runs()[0].state == "stopping", 60, what="the stop request")
            first = ""
        else:  # as soon as the first press is answered: while the request is being made
            first = train.stderr.readline()
        train.send_signal(signal.SIGINT)
        _, stderr = train.communicate(timeout=60)
        stderr = first + stderr
    finally:
        train.kill()
    assert train.returncode == 130, stderr
    assert "stopping: the ranks finish their step" in stderr and "stopping in the background" in stderr
    assert "Traceback" not in stderr
    manager = RunManager(runs_dir)
    run_id = manager.list_runs()[0].run_id
    assert manager.wait(run_id, timeout=120).state == "stopped"
    assert not any(
        p.info["cmdline"] and str(runs_dir) in " ".join(p.info["cmdline"]) for p in psutil.process_iter(["cmdline"])
    )
