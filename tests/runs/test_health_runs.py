"""The training-health guard on real 2-rank demo runs: a NaN injected at step 30 (TUNEDECK_FAULT=nan=30) under each
policy. warn marks the run and trains on; stop ends it as failed, naming the symptom, with the checkpoints from
before; rollback resumes from the checkpoint before step 30 with half the learning rate, skips the data window and
finishes with a falling loss; `tunedeck runs show` says each."""

from __future__ import annotations

import math

import pytest

from tunedeck.backend.runs.manager import RunManager

from .helpers import logs_tail, read_metrics, tunedeck

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

STEPS = {"training.max_steps": 60, "training.save_steps": 10, "training.save_total_limit": 3}


def run(runs_dir, demo_spec, monkeypatch, policy: str):
    monkeypatch.setenv("TUNEDECK_FAULT", "nan=30")
    manager = RunManager(runs_dir)
    run_id = manager.start(demo_spec({**STEPS, "training.health.policy": policy}))
    status = manager.wait(run_id, timeout=600)
    run_dir = manager.run_dir(run_id)
    show = tunedeck("runs", "show", run_id, "--runs-dir", runs_dir)
    assert show.returncode == 0, show.stderr
    return status, run_dir, show.stdout


def health(run_dir) -> list[dict]:
    return [r for r in read_metrics(run_dir) if r["event"] == "health"]


def losses(records) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in records if r["event"] == "log" and "loss" in r}


def test_warn_marks_the_run_and_trains_on(runs_dir, demo_spec, monkeypatch):
    status, run_dir, show = run(runs_dir, demo_spec, monkeypatch, "warn")
    assert status.state == "finished", f"{status}\n{logs_tail(run_dir)}"
    (found,) = health(run_dir)
    assert (found["step"], found["text"], found["action"]) == (30, "loss NaN", "warned")
    assert math.isnan(losses(read_metrics(run_dir))[60])  # it trained on, broken: that is what warn does
    assert "health   ⚠ unhealthy: loss NaN at step 30 · trains on (training.health.policy=warn)" in show


def test_stop_ends_the_run_as_failed_naming_the_symptom_and_keeps_the_checkpoints_before(
    runs_dir, demo_spec, monkeypatch
):
    status, run_dir, show = run(runs_dir, demo_spec, monkeypatch, "stop")
    assert status.state == "failed", f"{status}\n{logs_tail(run_dir)}"
    assert status.error.startswith("⚠ unhealthy: loss NaN at step 30; the newest checkpoint (step 20) predates it.")
    assert "Hint: a learning rate too high" in status.error
    assert sorted(p.name for p in (run_dir / "output").glob("checkpoint-*")) == ["checkpoint-10", "checkpoint-20"]
    assert max(losses(read_metrics(run_dir))) == 30  # it stopped at the step that showed it
    assert "error:\n⚠ unhealthy: loss NaN at step 30" in show


def test_rollback_resumes_before_the_blow_up_with_half_the_learning_rate_and_finishes(runs_dir, demo_spec, monkeypatch):
    status, run_dir, show = run(runs_dir, demo_spec, monkeypatch, "rollback")
    assert status.state == "finished", f"{status}\n{logs_tail(run_dir)}"
    (attempt,) = status.attempts
    assert (attempt["end"], attempt["checkpoint_step"], attempt["skip_steps"]) == ("rolled back", 20, 10)
    records = read_metrics(run_dir)
    starts = [r for r in records if r["event"] == "start"]
    assert [s.get("resumed_from_step") for s in starts] == [None, 20]
    assert starts[1]["rollback"] == {
        "rollbacks": 1,
        "checkpoint_step": 20,
        "bad_step": 30,
        "lr_scale": 0.5,
        "skipped_steps": 10,
    }
    first, second = records[: records.index(starts[1])], records[records.index(starts[1]) :]
    lr = lambda part, step: next(r["learning_rate"] for r in part if r.get("step") == step and "learning_rate" in r)  # noqa: E731
    assert lr(second, 25) == pytest.approx(0.5 * lr(first, 25), rel=1e-6)  # the same schedule position, halved
    after = losses(second)
    assert all(math.isfinite(loss) for loss in after.values()) and max(after) == 60
    assert sum(after[s] for s in range(51, 61)) < sum(after[s] for s in range(21, 31))  # the loss falls again
    assert (
        "health   ↺ roll-back 1: ⚠ unhealthy: loss NaN at step 30 → resumed from the checkpoint at step 20, "
        "learning rate x0.5, 10 steps of data skipped" in show
    )
    assert "attempt  ended rolled back: loss NaN at step 30" in show
