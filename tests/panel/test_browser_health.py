"""The training-health guard on real 2-rank demo runs, seen where people look: a NaN injected at step 30
(TUNEDECK_FAULT=nan=30) under each policy, the three runs trained side by side once for the module. warn marks the
run and trains on; stop ends it as failed naming the symptom, with the checkpoints from before; rollback resumes
from the checkpoint before step 30 with half the learning rate, skips the data window and finishes with a falling
loss. Each is checked in its records, in `tunedeck runs show` and in the page (state line, error, loss chart)."""

from __future__ import annotations

import math
import os

import pytest
from runs.helpers import logs_tail, read_metrics, tunedeck

from panel.browser import ARTIFACTS, PanelServer, open_run, stop_live_runs, text_of, wait_text

pytestmark = [pytest.mark.browser, pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(900)]

STEPS = {"training.max_steps": 60, "training.save_steps": 10, "training.save_total_limit": 3}
POLICIES = ("warn", "stop", "rollback")


@pytest.fixture(scope="module")
def server(tmp_path_factory, demo_home):
    server = PanelServer(tmp_path_factory.mktemp("runs"), "--preset", "demo")
    yield server
    stop_live_runs(server.runs_dir)
    server.stop()


@pytest.fixture(scope="module")
def runs(server):
    """{policy: (status, run folder, `tunedeck runs show`'s output)} of the three runs, trained at once."""
    from tunedeck.backend.runs.manager import RunManager
    from tunedeck.backend.spec import resolve_spec, set_paths

    manager = RunManager(server.runs_dir)
    os.environ["TUNEDECK_FAULT"] = "nan=30"  # the runs' supervisors inherit it at start
    try:
        ids = {
            policy: manager.start(set_paths(resolve_spec("demo"), {**STEPS, "training.health.policy": policy}))
            for policy in POLICIES
        }
    finally:
        del os.environ["TUNEDECK_FAULT"]
    done = {}
    for policy, run_id in ids.items():
        status = manager.wait(run_id, timeout=600)
        show = tunedeck("runs", "show", run_id, "--runs-dir", server.runs_dir)
        assert show.returncode == 0, show.stderr
        done[policy] = (status, manager.run_dir(run_id), show.stdout)
    return done


def losses(records) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in records if r["event"] == "log" and "loss" in r}


def chart_marks(page) -> list[str]:
    """The loss chart's annotations (the health guard's marks), as drawn."""
    return page.evaluate(
        """() => { const d = document.querySelector('#loss-chart .js-plotly-plot');
                   return ((d && d.layout && d.layout.annotations) || []).map(a => a.text); }"""
    )


def test_warn_marks_the_run_and_trains_on(page, server, runs):
    status, run_dir, show = runs["warn"]
    assert status.state == "finished", f"{status}\n{logs_tail(run_dir)}"
    (found,) = [r for r in read_metrics(run_dir) if r["event"] == "health"]
    assert (found["step"], found["text"], found["action"]) == (30, "loss NaN", "warned")
    assert math.isnan(losses(read_metrics(run_dir))[60])  # it trained on, broken: that is what warn does
    assert "health   ⚠ unhealthy: loss NaN at step 30 · trains on (training.health.policy=warn)" in show
    open_run(page, server.url, run_dir.name)
    wait_text(page, "#run-state", "⚠ unhealthy: loss NaN at step 30 · trains on")
    assert "hint: a learning rate too high" in text_of(page, "#run-state")
    page.wait_for_function("() => document.querySelector('#loss-chart .js-plotly-plot')")
    assert chart_marks(page) == ["⚠ loss NaN"]


def test_stop_ends_the_run_as_failed_naming_the_symptom_and_keeps_the_checkpoints_before(page, server, runs):
    status, run_dir, show = runs["stop"]
    assert status.state == "failed", f"{status}\n{logs_tail(run_dir)}"
    assert status.error.startswith("⚠ unhealthy: loss NaN at step 30; the newest checkpoint (step 20) predates it.")
    assert "Hint: a learning rate too high" in status.error
    assert sorted(p.name for p in (run_dir / "output").glob("checkpoint-*")) == ["checkpoint-10", "checkpoint-20"]
    assert max(losses(read_metrics(run_dir))) == 30  # it stopped at the step that showed it
    assert "error:\n⚠ unhealthy: loss NaN at step 30" in show
    open_run(page, server.url, run_dir.name)
    wait_text(page, "#run-error", "⚠ unhealthy: loss NaN at step 30")
    wait_text(page, "#run-state", "continues from its checkpoint at step 20")


def test_rollback_resumes_before_the_blow_up_with_half_the_learning_rate_and_finishes(page, server, runs):
    status, run_dir, show = runs["rollback"]
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

    def lr(part, step):
        return next(r["learning_rate"] for r in part if r.get("step") == step and "learning_rate" in r)

    assert lr(second, 25) == pytest.approx(0.5 * lr(first, 25), rel=1e-6)  # the same schedule position, halved
    after = losses(second)
    assert all(math.isfinite(loss) for loss in after.values()) and max(after) == 60
    assert sum(after[s] for s in range(51, 61)) < sum(after[s] for s in range(21, 31))  # the loss falls again
    assert (
        "health   ↺ roll-back 1: ⚠ unhealthy: loss NaN at step 30 → resumed from the checkpoint at step 20, "
        "learning rate x0.5, 10 steps of data skipped" in show
    )
    assert "attempt  1 ended rolled back: loss NaN at step 30" in show
    open_run(page, server.url, run_dir.name)
    wait_text(page, "#run-state", "↺ roll-back 1: ⚠ unhealthy: loss NaN at step 30 → resumed from the checkpoint")
    page.wait_for_function("() => document.querySelector('#loss-chart .js-plotly-plot')")
    assert chart_marks(page) == ["↺ roll-back to step 20"]
    page.locator("#loss-chart").screenshot(path=str(ARTIFACTS / "run-view-rollback-chart.png"))
    page.screenshot(path=str(ARTIFACTS / "run-view-rollback.png"), full_page=True)
