"""A run that stops making progress is called stalled, and each rank's Python stack goes to its log.

Real 2-rank runs of the demo. A rank is frozen with SIGSTOP, as a rank stuck in a driver call, a
dead NFS mount or a deadlocked data loader leaves its peers: they wait in their next collective,
and no step comes. Each rank's watchdog (train.py's StallWatchdog, in every bundle) writes every
thread's stack to its log and, with launch.stop_when_stalled, ends the run as a failure that says
so; tunedeck's supervisor marks the run stalled in status.json from progress.json (rank 0's last
step) for the page's state line and `tunedeck runs show`, until a step comes again.
"""

from __future__ import annotations

import json
import re
import signal
import time

import psutil
import pytest

from tunedeck.app.run_actions import stacks_notice
from tunedeck.app.run_shown import RunShown
from tunedeck.backend import recipe
from tunedeck.backend.recipe import write_progress
from tunedeck.backend.runs import supervisor
from tunedeck.backend.runs.manager import RunManager
from tunedeck.backend.runs.status import from_status_file

from .helpers import log_records, logs_tail, run_processes, start_record, still_alive, tunedeck, wait_for

LIVE = [pytest.mark.integration, pytest.mark.timeout(600)]

LONG = {"training.max_steps": 100000, "training.logging_steps": 100000, "training.save_steps": 100000}
HEADER = "tunedeck: stalled: no training step"  # train.py's line before every thread's stack


def frozen_rank(run_dir, rank: int) -> psutil.Process:
    """The run's rank `rank`, stopped (SIGSTOP)."""
    (process,) = [p for p in run_processes(run_dir)[1:] if p.environ().get("RANK") == str(rank)]
    process.send_signal(signal.SIGSTOP)
    return process


def rank_log(run_dir, rank: int) -> str:
    return (run_dir / "logs" / f"rank{rank}.log").read_text(errors="replace")


@LIVE[0]
@LIVE[1]
def test_a_frozen_rank_stalls_the_run_each_rank_writes_its_stack_and_a_step_clears_it(runs_dir, demo_spec):
    manager = RunManager(runs_dir)
    run_id = manager.start(demo_spec({**LONG, "launch.stall_minutes": 0.1}))  # 6 s without a step
    run_dir = manager.run_dir(run_id)
    wait_for(lambda: log_records(run_dir), 180, what=lambda: f"training\n{logs_tail(run_dir)}")
    frozen = frozen_rank(run_dir, 1)
    try:
        status = wait_for(lambda: manager.status(run_id).stalled and manager.status(run_id), 90, what="a stall")
        assert status.state == "running"
        assert re.match(r"⚠ stalled: no training step for over \d+ s after step \d+ · each rank writes", status.where)
        assert status.stalled["step"] >= 1 and status.stalled["limit_s"] >= 6
        # Rank 0's own watchdog: it waits for its frozen peer in a collective, in the backward pass whose
        # gradient all-reduce (DDP's hooks, in C++) never completes, or in DDP's forward, whose bucket rebuild at
        # the second step is a collective too (seen in CI when the peer froze right after step 1). Its stack says which.
        log = wait_for(lambda: HEADER in rank_log(run_dir, 0) and rank_log(run_dir, 0), 30, what="rank 0's stack")
        dump = log[log.index(HEADER) :]
        assert re.match(HEADER + r" for 0 min after step \d+ on rank 0; every thread's stack:\n", dump), dump
        assert "in _run_epoch" in dump, dump  # the main thread, inside the training loop
        assert re.search(r"distributed_c10d\.py\", line \d+ in \w+|in _engine_run_backward|in _pre_forward", dump), dump
        show = tunedeck("runs", "show", run_id, "--runs-dir", str(runs_dir))
        assert re.search(r"^stalled\s+⚠ stalled: no training step", show.stdout, re.M), show.stdout
        # Stacks on demand: rank 0 answers at once; the frozen rank cannot, and that is said too.
        stacks = tunedeck("runs", "stacks", run_id, "--runs-dir", str(runs_dir), timeout=60)
        assert stacks.returncode == 0, stacks.stderr
        rank0, rank1 = stacks.stdout.split("=== rank 1")
        assert rank0.startswith("=== rank 0 (also in logs/rank0.log)") and "most recent call first" in rank0
        assert "in _run_epoch" in rank0 and "(no answer: the process is stopped" in rank1
        notice = stacks_notice(manager, RunShown(run=run_id))  # the Run tab's Stacks button
        assert notice.startswith("**Stacks written** by rank 0 to its log") and "Rank 1: no answer" in notice
        listing = tunedeck("runs", "--runs-dir", str(runs_dir))
        assert re.search(rf"^{run_id}\s+-\s+running \(stalled\)\s", listing.stdout, re.M), listing.stdout
    finally:
        frozen.send_signal(signal.SIGCONT)
    wait_for(lambda: manager.status(run_id).stalled is None, 60, what="steps again")
    assert manager.status(run_id).state == "running" and manager.status(run_id).where == ""
    manager.stop(run_id, grace_s=60)
    ended = wait_for(
        lambda: manager.status(run_id).state not in ("running", "stopping") and manager.status(run_id), 120
    )
    assert ended.state == "stopped", ended.error
    late = tunedeck("runs", "stacks", run_id, "--runs-dir", str(runs_dir))
    assert late.returncode == 2 and f"run {run_id} is stopped and runs nowhere now" in late.stderr


@LIVE[0]
@LIVE[1]
def test_a_run_that_stays_stalled_is_ended_as_failed_with_its_processes_killed(runs_dir, demo_spec):
    manager = RunManager(runs_dir)
    # 3 s; not started again (a stall between steps is retried as a hung collective: tests/runs/test_restarts.py)
    spec = demo_spec({**LONG, "launch.stall_minutes": 0.05, "launch.stop_when_stalled": True, "launch.max_restarts": 0})
    run_id = manager.start(spec)
    run_dir = manager.run_dir(run_id)
    wait_for(lambda: log_records(run_dir), 180, what=lambda: f"training\n{logs_tail(run_dir)}")
    processes = run_processes(run_dir)
    frozen_rank(run_dir, 1)
    ended = wait_for(lambda: manager.status(run_id).state == "failed" and manager.status(run_id), 120, what="the end")
    assert re.search(r"stalled: no training step for 0 min after step \d+ \(launch\.stall_minutes", ended.error)
    assert "each rank's stack is in its log" in ended.error, ended.error
    assert still_alive(processes) == []  # the frozen rank too: SIGKILL ends a stopped process
    assert HEADER in rank_log(run_dir, 0) and "most recent call first" in rank_log(run_dir, 0)


def test_the_status_of_a_stalled_run_says_so_and_an_ended_one_does_not():
    stalled = {"step": 37, "since": 1.0e9, "limit_s": 900.0}
    base = {"state": "running", "launcher": {}, "stalled": stalled}
    assert from_status_file("r", base).where.startswith("⚠ stalled: no training step for over 15 min after step 37")
    assert from_status_file("r", {**base, "state": "failed"}).where == ""  # the error says why it ended


def test_the_supervisor_calls_a_run_stalled_by_its_limit_and_three_times_its_longest_gap(tmp_path):
    (tmp_path / "status.json").write_text(json.dumps({"state": "running"}))
    watch = supervisor.StallWatch(tmp_path, {"after_s": 10})

    def at(now: float, step: int | None = None, saving: bool = False, micro: int = 0) -> dict | None:
        if step is not None:
            write_progress(tmp_path, step, saving, micro)
        watch.check(now)
        return json.loads((tmp_path / "status.json").read_text()).get("stalled")

    assert at(0.0) is None  # no progress yet: loading is not watched
    assert at(100.0, step=0) is None and at(102.0, step=1) is None  # steps 2 s apart: the limit is the 10 s
    assert at(111.0) is None and at(113.0)["step"] == 1  # 11 s without one
    assert at(114.0, step=2) is None  # a step clears it; a stall's own gap does not raise the limit
    assert at(123.0, step=3) is None  # a 9 s gap (an evaluation) does: 3 x 9 s
    assert at(149.0) is None and at(151.0)["limit_s"] == 27.0
    assert at(152.0, step=4) is None
    assert at(153.0, step=4, saving=True) is None and at(400.0) is None  # a checkpoint save is no stall
    assert at(401.0, step=4) is None and at(427.0) is None and at(429.0)["step"] == 4  # timed from the save's end
    assert at(430.0, step=4, micro=1) is None  # a micro-batch of a long step is progress too
    assert at(456.0, step=4, micro=1) is None and at(458.0)["step"] == 4


@LIVE[0]
@LIVE[1]
def test_a_step_of_many_micro_batches_longer_than_the_limit_is_no_stall(runs_dir, demo_spec, monkeypatch):
    # 24 micro-batches of gradient accumulation a step, each a quarter of a second at least (a big model's on a GPU,
    # without its CPU): 6 s a step, the limit 3 s.
    monkeypatch.setenv("TUNEDECK_FAULT", "pace=0.25")
    spec = demo_spec(
        {"training.max_steps": 2, "training.gradient_accumulation_steps": 24, "launch.stall_minutes": 0.05}
    )
    manager = RunManager(runs_dir)
    run_id = manager.start(spec)
    run_dir = manager.run_dir(run_id)
    ended = manager.wait(run_id, timeout=300)
    assert ended.state == "finished", ended.error
    started, first = start_record(run_dir)["time"], log_records(run_dir)[0]["time"]
    assert first - started > 3  # the first step alone took longer than the limit
    assert json.loads((run_dir / "progress.json").read_text())["micro"] >= 2 * 24  # micro-batches, seen as they came
    assert HEADER not in rank_log(run_dir, 0) + rank_log(run_dir, 1)
    assert "stalled" not in (run_dir / "logs" / "supervisor.log").read_text()


def test_each_ranks_watchdog_writes_its_stacks_once_a_stall_outlasts_the_limit_and_never_during_a_save(tmp_path, capfd):
    watchdog = recipe.StallWatchdog({"launch": {"stall_minutes": 0.03}}, tmp_path)  # 1.8 s
    watchdog.start(step=7)
    try:
        recipe.CHECKPOINT_SAVING.set()  # a save longer than the limit
        time.sleep(3.5)
        recipe.CHECKPOINT_SAVING.clear()
        time.sleep(1.0)  # the wait starts again when the save ends
        assert HEADER not in capfd.readouterr().err
        time.sleep(2.5)
        dump = capfd.readouterr().err
        assert HEADER + " for 0 min after step 7 on rank 0; every thread's stack:" in dump
        assert "most recent call first" in dump and "in test_each_ranks_watchdog" in dump  # the main thread, waiting
        time.sleep(2.0)
        assert HEADER not in capfd.readouterr().err  # once a stall
    finally:
        watchdog.done.set()
        recipe.CHECKPOINT_SAVING.clear()
    assert not (tmp_path / "errors.jsonl").exists()  # without stop_when_stalled the run goes on
