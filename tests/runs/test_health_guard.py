"""The training-health guard's verdicts on logged (step, loss, grad norm) series, and what the readers make of its
records: the state line's words, the curve that continues from the checkpoint after a roll-back."""

from __future__ import annotations

import json
import math

from tunedeck.backend.recipe.health import HealthGuard
from tunedeck.backend.recipe.rollback import checkpoint_before, plan_rollback, rollback_checkpoint
from tunedeck.backend.runs import health_lines, read_records

NAN = math.nan


def guard(objective: str = "sft", **health) -> HealthGuard:
    return HealthGuard({"objective": objective, "training": {"health": {"policy": "warn", **health}}})


def feed(g: HealthGuard, points) -> list:
    return [(step, s.line) for step, loss, norm in points if (s := g.check(step, loss, norm))]


def test_nan_inf_and_a_zero_loss_with_a_broken_gradient_count_at_once():
    assert feed(guard(), [(10, 1.0, 0.5), (20, NAN, 0.5)]) == [(20, "⚠ unhealthy: loss NaN at step 20")]
    assert feed(guard(), [(10, 1.0, 0.5), (20, 0.9, NAN)]) == [(20, "⚠ unhealthy: grad norm NaN at step 20")]
    assert feed(guard(), [(10, 1.0, math.inf)]) == [(10, "⚠ unhealthy: grad norm Inf at step 10")]
    zero = feed(guard(), [(10, 1.0, 0.5), (20, 0.0, 0.0)])
    assert zero == [(20, "⚠ unhealthy: loss exactly 0 with a zero grad norm at step 20")]
    # GRPO's loss and gradient are 0 whenever a group's answers score alike: no symptom there
    assert feed(guard("grpo"), [(10, 0.0, 0.0), (20, 0.0, 0.0)]) == []


def test_an_episode_is_reported_once_and_again_only_after_a_healthy_step():
    points = [(10, 1.0, 0.5), (20, NAN, NAN), (30, NAN, NAN), (40, 1.0, 0.5), (50, NAN, 0.5)]
    assert [step for step, _ in feed(guard(), points)] == [20, 50]


def test_a_spike_counts_once_it_lasts_patience_logged_steps_and_names_its_first_step():
    calm = [(step, 1.0 - step / 1000, 0.5) for step in range(10, 60, 10)]
    spike = [(60, 5.0, 0.5), (70, 5.0, 0.5), (80, 5.0, 0.5)]
    g = guard(patience=3)
    found = feed(g, calm + spike)
    assert found == [(80, "⚠ unhealthy: loss 5 > 2x its running mean 0.97 at step 60, for 3 logged steps")]
    assert g.last_good == 50  # a checkpoint at or before step 50 predates it
    # two high steps then a normal one: no spike; the window forgot neither the calm nor the high values
    assert feed(guard(patience=3), [*calm, (60, 5.0, 0.5), (70, 5.0, 0.5), (80, 0.95, 0.5)]) == []
    # the gradient norm against its running median
    norms = feed(guard(patience=1), [*calm, (60, 0.95, 8.0)])
    assert norms == [(60, "⚠ unhealthy: grad norm 8 > 10x its running median 0.5 at step 60")]
    # too little history to tell a spike from the start of training
    assert feed(guard(patience=1), [(10, 1.0, 0.01), (20, 1.0, 5.0)]) == []
    assert feed(guard(policy="off"), [(10, NAN, NAN)]) == []


def test_the_hints_name_the_likely_causes_that_apply():
    g = HealthGuard(
        {
            "training": {"precision": "fp16", "health": {"policy": "stop"}},
            "strategy": {"kind": "zero2", "overlap_comm": True},
        }
    )
    (symptom,) = [s for s in [g.check(10, NAN, NAN)] if s]
    said = " ".join(symptom.hints)
    assert "bf16" in said and "overlap_comm=false" in said and "learning rate" in said
    assert not any("flash" in hint for hint in symptom.hints)


def test_a_rollback_goes_to_the_newest_checkpoint_before_the_first_bad_step(tmp_path, monkeypatch):
    monkeypatch.delenv("TUNEDECK_ROLLBACK", raising=False)
    for step in (10, 20, 30):
        (tmp_path / f"checkpoint-{step}").mkdir()
    (tmp_path / ".incomplete").mkdir()
    assert checkpoint_before(tmp_path, 25) == (tmp_path / "checkpoint-20", 20)
    assert checkpoint_before(tmp_path, 5) is None
    g = guard(policy="rollback")
    (symptom,) = [s for step, loss in [(10, 1.0), (20, 1.0), (25, NAN)] if (s := g.check(step, loss, 0.5))]
    job = {"training": {"health": {"policy": "rollback", "lr_scale": 0.5, "max_rollbacks": 2}}}
    plan, why_not = plan_rollback(symptom, job, str(tmp_path))
    assert why_not == "" and plan is not None
    assert (plan["checkpoint_step"], plan["skip_steps"], plan["lr_scale"], plan["rollbacks"]) == (20, 5, 0.5, 1)
    # the second roll-back halves it again; past max_rollbacks there is none, and the run stops
    (tmp_path / "rollback.json").write_text(json.dumps(plan))
    monkeypatch.setenv("TUNEDECK_ROLLBACK", str(tmp_path / "rollback.json"))
    assert plan_rollback(symptom, job, str(tmp_path))[0]["lr_scale"] == 0.25
    (tmp_path / "rollback.json").write_text(json.dumps({**plan, "rollbacks": 2}))
    assert plan_rollback(symptom, job, str(tmp_path)) == (
        None,
        "it was rolled back 2 times already (training.health.max_rollbacks)",
    )
    monkeypatch.delenv("TUNEDECK_ROLLBACK")
    early = guard(policy="rollback")
    (first,) = [s for s in [early.check(5, NAN, 0.5)] if s]
    assert "no checkpoint was saved at or before step 0" in plan_rollback(first, job, str(tmp_path / "none"))[1]


def test_an_attempt_started_again_after_a_rollback_keeps_it_and_goes_on_from_what_it_saved_since(tmp_path):
    """A lost rank after a roll-back: the next attempt keeps the roll-back (scaled learning rate, skipped window) and
    loads the newest checkpoint saved since it, never one saved before it (past the first bad step: the blow-up)."""
    import os
    import time

    for step in (20, 30):  # checkpoint-30 was saved after the bad step 25 by the attempt that blew up
        (tmp_path / f"checkpoint-{step}").mkdir()
        os.utime(tmp_path / f"checkpoint-{step}", (time.time() - 60, time.time() - 60))
    plan = {"checkpoint": str((tmp_path / "checkpoint-20").resolve()), "written_at": time.time() - 30}
    assert rollback_checkpoint(plan, tmp_path, restarted=False) == plan["checkpoint"]
    assert rollback_checkpoint(plan, tmp_path, restarted=True) == plan["checkpoint"]  # nothing saved since
    (tmp_path / "checkpoint-25").mkdir()  # saved by the attempt that rolled back, then lost a rank
    assert rollback_checkpoint(plan, tmp_path, restarted=True) == str((tmp_path / "checkpoint-25").resolve())
    assert rollback_checkpoint(plan, tmp_path, restarted=False) == plan["checkpoint"]


def test_after_a_rollback_the_curve_continues_from_the_checkpoint_and_the_lines_say_what_happened(tmp_path):
    lines = [
        {"event": "start", "max_steps": 60, "resumed_from_step": None},
        *[{"event": "log", "step": step, "loss": 1.0} for step in (10, 20, 30)],
        {"event": "log", "step": 40, "loss": NAN},
        {
            "event": "health",
            "step": 40,
            "text": "loss NaN",
            "line": "⚠ unhealthy: loss NaN at step 40",
            "action": "rolled back",
            "checkpoint_step": 30,
            "skip_steps": 10,
            "lr_scale": 0.5,
            "rollbacks": 1,
        },
        {"event": "end", "status": "rollback", "error": "rolling back"},
        {"event": "start", "max_steps": 60, "resumed_from_step": 30, "rollback": {"rollbacks": 1, "lr_scale": 0.5}},
        {"event": "log", "step": 40, "loss": 0.9},
    ]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    run = read_records(tmp_path)
    assert [(r["step"], r["loss"]) for r in run.records] == [(10, 1.0), (20, 1.0), (30, 1.0), (40, 0.9)]
    assert [r["step"] for r in run.superseded] == [40] and run.end is None
    assert run.unhealthy is None  # healed by the roll-back
    assert health_lines(run) == [
        "↺ roll-back 1: ⚠ unhealthy: loss NaN at step 40 → resumed from the checkpoint at step 30, learning rate "
        "x0.5, 10 steps of data skipped"
    ]
    warned = {
        "event": "health",
        "step": 50,
        "line": "⚠ unhealthy: grad norm NaN at step 50",
        "action": "warned",
        "hints": ["a learning rate too high"],
    }
    (tmp_path / "metrics.jsonl").write_text(json.dumps(lines[0]) + "\n" + json.dumps(warned) + "\n")
    assert health_lines(read_records(tmp_path)) == [
        "⚠ unhealthy: grad norm NaN at step 50 · trains on (training.health.policy=warn)",
        "  hint: a learning rate too high",
    ]


def test_a_rollback_without_a_checkpoint_in_reach_is_said_before_the_run(demo_spec):
    from tunedeck.backend.validate import validate

    said = {
        p.field: p.message
        for p in validate(demo_spec({"training.health.policy": "rollback", "training.max_steps": 60}))
    }
    assert "none is saved within 60 steps" in said["training.health.policy"]
    fine = demo_spec({"training.health.policy": "rollback", "training.max_steps": 60, "training.save_steps": 10})
    assert "training.health.policy" not in {p.field for p in validate(fine)}
