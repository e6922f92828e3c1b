"""Stop, failure and manager restart, on real 2-rank runs."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tunedeck.backend.runs.manager import RunManager
from tunedeck.backend.runs.supervisor import is_alive
from tunedeck.backend.runs.tail import JsonlTail

from .helpers import (
    PACED,
    end_record,
    log_records,
    logs_tail,
    processes_working_in,
    run_processes,
    start_record,
    status_json,
    still_alive,
    wait_for,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

BIN = Path(sys.executable).parent
LONG = {"training.max_steps": 2000, "training.save_steps": 1000}


def wait_for_training(run_dir: Path, timeout: float = 120) -> None:
    tail = JsonlTail(run_dir / "metrics.jsonl")
    wait_for(
        lambda: any(r.get("event") == "log" for r in tail.read_new()),
        timeout,
        what=f"a log record\n{logs_tail(run_dir)}",
    )


def test_stop_saves_a_checkpoint_and_leaves_no_process_five_times(runs_dir, demo_spec, monkeypatch):
    monkeypatch.setenv(*PACED)
    manager = RunManager(runs_dir)
    for attempt in range(5):
        run_id = manager.start(demo_spec(LONG))
        run_dir = manager.run_dir(run_id)
        wait_for_training(run_dir)
        processes = run_processes(run_dir)
        assert len(processes) >= 3  # the launcher and two ranks
        if attempt == 0:  # once through the CLI, as a user would
            result = subprocess.run(
                [str(BIN / "tunedeck"), "runs", "stop", run_id, "--runs-dir", str(runs_dir)],
                capture_output=True,
                text=True,
                timeout=120,
            )
            assert result.returncode == 0 and f"run {run_id}: stopped" in result.stdout, result.stdout + result.stderr
        else:
            assert manager.stop(run_id, grace_s=60).state == "stopping"
        status = manager.wait(run_id, timeout=90)
        assert status.state == "stopped", f"attempt {attempt}: {status}\n{logs_tail(run_dir)}"
        assert end_record(run_dir)["status"] == "stopped"
        last_step = log_records(run_dir)[-1]["step"]
        assert (run_dir / "output" / f"checkpoint-{last_step}" / "trainer_state.json").is_file()
        assert still_alive(processes) == [], f"attempt {attempt}: processes of the run are left"
        assert processes_working_in(run_dir) == []
        assert not is_alive(status_json(run_dir)["supervisor"])


def test_failures_are_reported_with_the_first_failing_rank(runs_dir, demo_spec, monkeypatch):
    manager = RunManager(runs_dir)

    # A problem only the run can find (a missing path is refused before launch: test_preflight.py).
    missing = manager.start(demo_spec({"dataset.split": "validation"}))
    status = manager.wait(missing, timeout=120)
    assert status.state == "failed" and status.exit_code != 0
    assert re.match(r'rank [01] failed first: ValueError: Unknown split "validation"', status.error), status.error
    assert status_json(manager.run_dir(missing))["error"] == status.error

    # One rank raises mid-training; the other is blocked in a collective and must not hang the run. A failure of no
    # known class is started again once (at once here), and fails the same way.
    monkeypatch.setenv("TUNEDECK_FAULT", "rank=1,step=2")
    faulty = manager.start(demo_spec({"training.max_steps": 50, "launch.restart_backoff_s": 0}))
    status = manager.wait(faulty, timeout=120)
    run_dir = manager.run_dir(faulty)
    assert status.state == "failed" and status.exit_code != 0, f"{status}\n{logs_tail(run_dir)}"
    assert status.error.startswith(
        "rank 1 failed first: RuntimeError: fault injected by TUNEDECK_FAULT on rank 1 at step 2"
    )
    failed_at = min(json.loads(line)["time"] for line in (run_dir / "errors.jsonl").read_text().splitlines())
    assert status.ended_at - failed_at < 15, "the failure took too long to be reported"
    assert processes_working_in(run_dir) == []
    assert [(a["attempt"], a["end"], a["retried"]) for a in status.attempts] == [
        (1, "unknown", True),
        (2, "unknown", False),
    ]
    assert status.failure and status.failure["not_retried"] == "an unknown failure is retried once"
    assert (run_dir / "errors.attempt-1.jsonl").exists()  # the first attempt's errors, set aside
    monkeypatch.delenv("TUNEDECK_FAULT")

    # The manager keeps working: the failed runs are listed and a new run trains.
    states = {run.run_id: run.state for run in manager.list_runs()}
    assert states == {missing: "failed", faulty: "failed"}
    ok = manager.start(demo_spec({"training.max_steps": 2, "launch.num_processes": 1}))
    assert manager.wait(ok, timeout=120).state == "finished"


MANAGER_SCRIPT = textwrap.dedent(
    """
    import sys, time
    from tunedeck.backend.runs.manager import RunManager
    from tunedeck.backend.spec import resolve_spec, set_paths
    manager = RunManager(sys.argv[1])
    run_id = manager.start(set_paths(resolve_spec("demo"), {"training.max_steps": 40}))
    print(run_id, flush=True)
    time.sleep(600)
    """
)


def test_killed_manager_reattaches_and_every_step_is_logged_once(runs_dir, demo_home, monkeypatch):
    monkeypatch.setenv(*PACED)  # 40 steps of half a second: still training when the new manager looks
    manager_proc = subprocess.Popen(
        [sys.executable, "-c", MANAGER_SCRIPT, str(runs_dir)], stdout=subprocess.PIPE, text=True
    )
    try:
        run_id = manager_proc.stdout.readline().strip()
        manager = RunManager(runs_dir)
        run_dir = manager.run_dir(run_id)
        wait_for_training(run_dir)
        manager_proc.send_signal(signal.SIGKILL)
        manager_proc.wait()
    finally:
        manager_proc.kill()

    restarted = RunManager(runs_dir)  # a fresh manager, as after a panel restart
    assert restarted.status(run_id).state == "running"
    assert restarted.active_run() == run_id
    status = restarted.wait(run_id, timeout=120)
    assert status.state == "finished" and status.exit_code == 0, f"{status}\n{logs_tail(run_dir)}"
    assert start_record(run_dir)["world_size"] == 2
    assert [r["step"] for r in log_records(run_dir)] == list(range(1, 41))
    assert restarted.active_run() is None


def test_a_slow_rank_is_named_while_rank_0_waits_for_it(runs_dir, demo_home):
    """A slow node holds up the whole run before its first step: the page's progress line and `tunedeck train` name
    it, not only rank 0's phase."""
    from tunedeck.backend.runs.startup import phase_now, read_phases

    slow = {**os.environ, "TUNEDECK_FAULT": "rank=1,seconds=25,phase=loading the model"}  # rank 1 loads 25 s longer
    train = subprocess.Popen(
        [str(BIN / "tunedeck"), "train", "demo", "--runs-dir", str(runs_dir), "--set", "training.max_steps=5"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        text=True,
        env=slow,
    )
    try:
        run_dir = wait_for(lambda: next(runs_dir.glob("*/startup.json"), None), timeout=120).parent
        lines = []
        wait_for(
            lambda: lines.append(phase_now(run_dir) or "") or "rank 1 still" in lines[-1],
            timeout=120,
            interval=0.5,
            what=lambda: f"rank 1 named; the line said {sorted(set(lines))}\n{logs_tail(run_dir)}",
        )
        said, _ = train.communicate(timeout=180)
    finally:
        train.kill()
    assert train.returncode == 0, said
    waiting = re.fullmatch(r"(.+) for (\d+):(\d\d) · rank 1 still loading the model for (\d+):(\d\d)", lines[-1])
    assert waiting, lines[-1]
    assert waiting.group(1) not in ("importing the libraries", "joining the other processes", "loading the model")
    assert int(waiting.group(4)) * 60 + int(waiting.group(5)) >= 10  # named once rank 0 has waited a while
    # The terminal says it once, between the phases, not every second.
    assert len(re.findall(r"^  waiting: rank 1 still loading the model for \d+:\d\d$", said, re.M)) == 1, said
    # Rank 1's own list ends like rank 0's: the first step is shared.
    rank1 = json.loads((run_dir / "logs" / "rank1.startup.json").read_text())["phases"]
    assert [p["phase"] for p in rank1] == [p for p, _ in read_phases(run_dir)]
