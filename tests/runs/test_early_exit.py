"""A run that ended before its last step is never "finished": what the run's own records say it got decides, not the
launcher's exit code (a rank that calls os._exit(0), in a library or a reward, exits 0 without its end record)."""

from __future__ import annotations

import json

import pytest

from tunedeck.backend.runs.manager import RunManager
from tunedeck.backend.runs.supervisor import final_state

from .helpers import log_records, logs_tail, read_metrics


def records(run_dir, *lines: dict, step: int | None = None) -> None:
    """metrics.jsonl with these records, and progress.json at `step`, as rank 0 writes them."""
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    if step is not None:
        (run_dir / "progress.json").write_text(json.dumps({"step": step, "micro": 0, "forwards": 0, "time": 1.0}))


START = {"event": "start", "time": 1.0, "world_size": 2, "max_steps": 60}


def test_an_exit_code_of_0_without_the_end_record_is_a_failure_that_says_where_it_stopped(tmp_path):
    records(tmp_path, START, step=0)
    assert final_state(tmp_path, 0, stop_requested=False) == (
        "failed",
        "rank 0 exited with code 0 at step 0 of 60 without its end record: something in the run ended it early "
        "(a library or a reward calling exit); see logs/rank0.log",
    )
    records(tmp_path, START, {"event": "log", "step": 12, "max_steps": 60, "loss": 1.0})  # no progress.json: the log
    (tmp_path / "progress.json").unlink()
    assert final_state(tmp_path, 0, False)[1].startswith("rank 0 exited with code 0 at step 12 of 60 without")
    (tmp_path / "metrics.jsonl").unlink()  # it never began training
    assert final_state(tmp_path, 0, False)[1].startswith("rank 0 exited with code 0 before training began without")
    assert final_state(tmp_path, 0, stop_requested=True) == ("stopped", None)  # a stop before training: no failure


def test_an_end_record_short_of_the_last_step_is_not_finished(tmp_path):
    end = {"event": "end", "time": 2.0, "status": "finished", "runtime_s": 1.0, "error": None}
    records(tmp_path, START, end, step=3)
    state, error = final_state(tmp_path, 0, stop_requested=False)
    assert (state, error.split(":")[0]) == ("failed", "rank 0 ended its training at step 3 of 60 and wrote it finished")
    records(tmp_path, START, end, step=60)
    assert final_state(tmp_path, 0, False) == ("finished", None)
    assert final_state(tmp_path, 1, False) == ("finished", None)  # a crash after the end record: what it got stands
    stopped = {**end, "status": "stopped"}
    records(tmp_path, START, stopped, step=3)
    assert final_state(tmp_path, 0, stop_requested=True) == ("stopped", None)
    assert final_state(tmp_path, 0, stop_requested=False) == ("stopped", None)  # a SIGTERM from outside (Slurm's)


@pytest.mark.integration
@pytest.mark.timeout(600)
def test_ranks_that_leave_with_exit_code_0_before_their_first_step_fail_the_run(runs_dir, demo_spec, monkeypatch):
    monkeypatch.setenv("TUNEDECK_FAULT", "rank=*,step=0,exit=0")  # every rank: os._exit(0) as training begins
    manager = RunManager(runs_dir)
    run_id = manager.start(demo_spec({"training.max_steps": 5}))
    status = manager.wait(run_id, timeout=300)
    run_dir = manager.run_dir(run_id)
    assert (status.state, status.exit_code) == ("failed", 0), f"{status}\n{logs_tail(run_dir)}"
    assert status.error.startswith("rank 0 exited with code 0 at step 0 of 5 without its end record"), status.error
    assert log_records(run_dir) == [] and not [r for r in read_metrics(run_dir) if r["event"] == "end"]
    assert "fault injected by TUNEDECK_FAULT: os._exit(0) at step 0" in (run_dir / "logs" / "rank1.log").read_text()
