"""The run view as a person uses it, in headless Chromium with real runs (2 CPU ranks, gloo).

Smoke test button; one demo run shared by the module (started, stopped, resumed) for the
summary, the past-runs table, name and notes, notices and Resume.
"""

from __future__ import annotations

import re

import pytest
from runs.helpers import PACED, wait_for

from panel.browser import ARTIFACTS, PanelServer, fill, plot_points, settle, stop_live_runs, text_of
from panel.browser import wait_text as _wait_text

pytestmark = [pytest.mark.browser, pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(600)]

LONG_RUN = 5000  # steps: the shared demo run is stopped long before


@pytest.fixture(scope="module")
def server(tmp_path_factory, demo_home):
    # Every run here trains until the test stops it (or fails at once): paced, it leaves the CPU to the page.
    server = PanelServer(tmp_path_factory.mktemp("runs"), "--preset", "demo", env=dict([PACED]))
    yield server
    stop_live_runs(server.runs_dir)  # whatever failed
    server.stop()


def wait_text(page, selector: str, text: str, timeout: float = 60_000) -> None:
    _wait_text(page, selector, text, timeout)  # these tests share 2 cores with training runs


@pytest.fixture(autouse=True)
def patient(page):
    page.set_default_timeout(60_000)  # these tests share 2 cores with training runs


def load(page, server):
    page.goto(server.url)
    page.wait_for_selector("#file-view .cm-content")
    wait_text(page, "#job-issues", "No problems")


def test_smoke_test_button_runs_the_shown_job_and_shows_its_verdict(page, server):
    load(page, server)
    page.click("#preset-7b-lora-ddp")  # 4 GPUs: Start cannot run it here, its smoke run can
    wait_text(page, "#notice", "7B LoRA DDP")
    wait_text(page, "#job-issues", "no NVIDIA GPU found here")  # Start would refuse it here: the smoke run is for this
    page.click("#smoke-run")
    wait_text(page, "#notice", "Started smoke run", timeout=120_000)  # the first builds the tiny model
    wait_text(page, "#run-state", "Smoke test")
    wait_text(page, "#run-state", "smoke test passed", timeout=300_000)
    line = text_of(page, "#run-state")
    assert "2 ranks on 1 machine · DDP" in line and "trainable parameters; loss" in line
    wait_text(page, "#runs-table", "smoke test · ")


# ---------------------------------------------------------------- one demo run, stopped, shared by the tests below


@pytest.fixture(scope="module")
def stopped_run(server):
    """A demo run stopped after a few steps (as `tunedeck runs stop` does): (run id, its checkpoint step)."""
    from tunedeck.backend.runs.manager import RunManager
    from tunedeck.backend.runs.records import read_records
    from tunedeck.backend.runs.resume import newest_checkpoint
    from tunedeck.backend.spec import resolve_spec, set_paths

    manager = RunManager(server.runs_dir)
    run_id = manager.start(set_paths(resolve_spec("demo"), {"training.max_steps": LONG_RUN}))
    run_dir = manager.run_dir(run_id)
    try:
        wait_for(lambda: len(read_records(run_dir).records) >= 3, 240, what="three logged steps")
    finally:
        manager.stop(run_id, grace_s=60)
    assert manager.wait(run_id, timeout=180).state == "stopped"
    found = newest_checkpoint(run_dir / "output")
    assert found is not None, "a stopped run saves a checkpoint"
    return run_id, found[0]


def open_run(page, server, run_id: str) -> None:
    page.goto(server.url)
    page.click("#tab-run-button")
    wait_text(page, "#runs-table", run_id)
    pick_run(page, run_id)
    wait_text(page, "#run-state", run_id)
    # The page may already follow this run: wait for the pick's own answer too, which fills the name and
    # notes boxes (answered after typing began, it would empty what the test types).
    settle(page)


def test_a_stopped_run_shows_its_summary_and_its_loss_in_past_runs(page, server, stopped_run):
    from tunedeck.backend.runs.records import read_records

    run_id, checkpoint = stopped_run
    open_run(page, server, run_id)
    wait_text(page, "#run-summary", "Summary:")
    summary = text_of(page, "#run-summary")
    losses = [r["loss"] for r in read_records(server.runs_dir / run_id).records if "loss" in r]
    assert f"final loss {losses[-1]:.4f}" in summary and f"best {min(losses):.4f} at step" in summary
    assert " tokens · " in summary and " wall" in summary and "tokens/s mean" in summary
    state = text_of(page, "#run-state")
    assert "stopped" in state and f"continues from its checkpoint at step {checkpoint}" in state
    assert page.locator("#resume-run").is_enabled() and page.locator("#stop-run").is_disabled()
    wait_text(page, "#runs-table", f"{losses[-1]:.4f}")  # the loss column, as `tunedeck runs` prints it


def test_a_run_is_named_and_noted_in_the_page_and_the_cli_shows_it(page, server, stopped_run):
    import subprocess
    import sys
    from pathlib import Path

    run_id, _ = stopped_run
    open_run(page, server, run_id)
    fill(page.locator("#run-name textarea"), "lr 5e-3 baseline")
    page.locator("#run-name textarea").press("Enter")
    fill(page.locator("#run-notes textarea"), "loss falls fast; try 2e-3 next")
    page.locator("#run-summary").click()  # leaving the box saves it
    wait_text(page, "#runs-table", "lr 5e-3 baseline")
    wait_text(page, "#run-state", "lr 5e-3 baseline")
    notes = wait_for(
        lambda: (
            "try 2e-3" in (server.runs_dir / run_id / "notes.json").read_text()
            and (server.runs_dir / run_id / "notes.json").read_text()
        ),
        30,  # the page saves on blur; these tests share 2 cores with training runs
        what="notes.json to hold the notes",
    )
    assert '"name": "lr 5e-3 baseline"' in notes
    cli = Path(sys.executable).parent / "tunedeck"
    listed = subprocess.run(
        [str(cli), "runs", "--runs-dir", str(server.runs_dir)], capture_output=True, text=True, timeout=60
    )
    assert any(run_id in line and "lr 5e-3 baseline" in line for line in listed.stdout.splitlines()), listed.stdout
    page.reload()  # a new page shows what was stored
    page.click("#tab-run-button")
    pick_run(page, run_id)
    page.wait_for_function(
        "() => document.querySelector('#run-notes textarea').value.includes('try 2e-3')", timeout=20_000
    )


def test_resume_continues_at_the_step_after_the_checkpoint_and_stop_leaves_no_stale_notice(page, server, stopped_run):
    from tunedeck.backend.runs.records import read_records

    run_id, checkpoint = stopped_run
    open_run(page, server, run_id)
    page.click("#resume-run")
    page.wait_for_function(
        "() => /Resumed run|Not resumed/.test(document.querySelector('#notice').innerText)", timeout=90_000
    )
    assert f"from its checkpoint at step {checkpoint}" in page.inner_text("#notice")
    new_id = shown_run_id(page)
    assert new_id != run_id
    # Before its first step the chart shows the loss of the run it continues (lighter), not an empty chart.
    logged = len(read_records(server.runs_dir / run_id).records)
    wait_for(lambda: plot_points(page, "loss-chart").get("before resume loss") == logged, 30, what="the parent's loss")
    page.screenshot(path=str(ARTIFACTS / "run-view-before-first-step.png"))
    new_dir = server.runs_dir / new_id
    first = wait_for(lambda: read_records(new_dir).records, 240, what="the resumed run's first step")[0]
    assert first["step"] == checkpoint + 1
    assert read_records(new_dir).start["resumed_from_step"] == checkpoint
    wait_for(lambda: "this run loss" in plot_points(page, "loss-chart"), 30, what="the loss chart")
    assert min_step(page) >= checkpoint + 1
    # Its own curve goes on where the parent's, cut at the checkpoint it continues, ends.
    wait_for(lambda: trace_steps(page, "before resume loss")[-1:] == [checkpoint], 30, what="the parent's curve cut")
    assert trace_steps(page, "before resume loss") == list(range(1, checkpoint + 1))
    page.locator("#loss-chart").screenshot(path=str(ARTIFACTS / "run-view-resumed-chart.png"))
    wait_text(page, "#run-summary", f"resumed from step {checkpoint}")

    page.click("#stop-run")
    wait_text(page, "#run-state", "stopped", timeout=180_000)
    wait_text(page, "#run-state", "Resume")
    state, notice = text_of(page, "#run-state"), page.inner_text("#notice")
    assert "stopping" not in state.lower() and "stopping" not in notice.lower(), (state, notice)
    assert "stopped at step" in state


def test_resume_on_another_number_of_processes_keeps_the_global_batch(page, server, stopped_run):
    """The Resume box's process count (issue 34 part 3): the demo's 2 processes go on as 1, accumulating twice."""
    from tunedeck.backend.runs.records import read_records

    run_id, _ = stopped_run
    open_run(page, server, run_id)
    fill(page.locator("#resume-processes input"), "1")
    page.click("#resume-run")
    wait_text(page, "#notice", "Resumed run", timeout=90_000)
    assert (
        "on 1 process (1 machine) instead of 2, gradient accumulation 1 → 2: the global batch stays 4"
        in page.inner_text("#notice")
    )
    page.screenshot(path=str(ARTIFACTS / "run-view-resume-on-processes.png"))
    new_dir = server.runs_dir / shown_run_id(page)
    start = wait_for(lambda: read_records(new_dir).start, 240, what="the resumed run's start record")
    assert start["world_size"] == 1
    wait_text(page, "#run-summary", "resumed from step")
    assert "saved on 2 processes" in text_of(page, "#run-summary")
    page.click("#stop-run")
    wait_text(page, "#run-state", "stopped", timeout=180_000)


def test_a_broken_job_yaml_upload_keeps_its_line_and_column(page, server, tmp_path):
    load(page, server)
    bad = tmp_path / "broken.yaml"
    bad.write_text("model:\n  name_or_path: x\n method: lora\n")  # the third line is indented one space short
    with page.expect_file_chooser() as chooser:
        page.click("#upload-job")
    chooser.value.set_files(str(bad))
    wait_text(page, "#notice", "was not loaded")
    assert "line 3, column 2" in page.inner_text("#notice")


def shown_run_id(page) -> str:
    return re.search(r"\d{8}-\d{6}-[0-9a-f]{6}", text_of(page, "#run-state")).group(0)


def min_step(page) -> int:
    return page.evaluate(
        """() => { const d = document.querySelector('#loss-chart .js-plotly-plot');
                   return Math.min(...d.data.filter(t => t.name === 'this run loss')[0].x); }"""
    )


def trace_steps(page, name: str) -> list[int]:
    """The steps of one trace of the loss chart."""
    return page.evaluate(
        """name => { const d = document.querySelector('#loss-chart .js-plotly-plot');
                     const t = d && d.data && d.data.find(t => t.name === name); return t ? Array.from(t.x) : []; }""",
        name,
    )


def pick_run(page, run_id: str) -> None:
    page.locator("#run-select input").click()
    page.locator(f'#run-select li[role=option][aria-label*="{run_id} · "]').click()  # not a run named after it
