"""Resume on another number of processes, on real demo runs (issue 34, part 3; backend/runs/reshape.py): a DDP run
that failed on 2 processes goes on with `tunedeck runs resume ID --num-processes 1` and a 1-process run with
`--num-processes 2`, each with the same global batch; the first losses after the resume are those the run had at
those steps before it failed, within what two identical runs differ by (measured and printed)."""

from __future__ import annotations

import os

import pytest

from tunedeck.backend.runs.manager import RunManager

from .helpers import logs_tail, read_metrics, tunedeck

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

STEPS = {"training.max_steps": 14, "training.save_steps": 8, "launch.max_restarts": 0}
FAIL_AT = 12  # after the checkpoint at step 8: steps 9 to 12 are trained before the failure and again after


def losses(run_dir) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in read_metrics(run_dir) if r["event"] == "log" and "loss" in r}


def failed_run(manager: RunManager, demo_spec, changes: dict) -> str:
    os.environ["TUNEDECK_FAULT"] = f"rank=0,step={FAIL_AT}"  # its supervisor inherits it; the resumed run does not
    try:
        run_id = manager.start(demo_spec({**STEPS, **changes}))
    finally:
        del os.environ["TUNEDECK_FAULT"]
    status = manager.wait(run_id, timeout=300)
    assert status.state == "failed" and (manager.run_dir(run_id) / "output" / "checkpoint-8").is_dir(), (
        f"{status}\n{logs_tail(manager.run_dir(run_id))}"
    )
    return run_id


def test_a_ddp_run_goes_on_with_another_number_of_processes_and_the_same_global_batch(runs_dir, demo_spec):
    manager = RunManager(runs_dir)
    two = failed_run(manager, demo_spec, {"launch.num_processes": 2})  # 2 processes x 2 rows x 1 step = 4
    twin = failed_run(manager, demo_spec, {"launch.num_processes": 2})  # the same job again: the noise
    one = failed_run(manager, demo_spec, {"launch.num_processes": 1, "training.gradient_accumulation_steps": 2})
    first, again = losses(manager.run_dir(two)), losses(manager.run_dir(twin))
    noise = max(abs(first[s] - again[s]) for s in range(9, FAIL_AT) if s in first and s in again)
    for run_id, before, after in ((two, 2, 1), (one, 1, 2)):
        resumed = tunedeck("runs", "resume", run_id, "--num-processes", str(after), "--runs-dir", runs_dir, timeout=600)
        assert resumed.returncode == 0, resumed.stdout + resumed.stderr
        accumulation = (1, 2) if before == 2 else (2, 1)
        assert (
            f"continues run {run_id} from its checkpoint at step 8, on {after} process{'es' * (after > 1)} "
            f"(1 machine) instead of {before}, gradient accumulation {accumulation[0]} → {accumulation[1]}: the "
            "global batch stays 4"
        ) in resumed.stdout, resumed.stdout
        new_id = resumed.stdout.split()[1].rstrip(":")
        new_dir = manager.run_dir(new_id)
        assert manager.status(new_id).state == "finished", logs_tail(new_dir)
        start = next(r for r in read_metrics(new_dir) if r["event"] == "start")
        assert start["resumed_from_step"] == 8 and start["world_size"] == after, start
        old, new = losses(manager.run_dir(run_id)), losses(new_dir)
        gaps = [abs(new[s] - old[s]) for s in range(9, FAIL_AT) if s in old]
        print(
            f"{before} -> {after} processes: loss gaps after the resume {[f'{g:.5f}' for g in gaps]}, noise {noise:.5f}"
        )
        assert max(new) == STEPS["training.max_steps"] and min(new) == 9 and gaps
        assert max(gaps) <= max(noise, 0.01 * old[9]), (gaps, noise)
