"""The run view as a person uses it, in headless Chromium with real runs (2 CPU ranks, gloo).

Smoke test button; one demo run shared by the module (started, stopped, resumed) for the
summary, the past-runs table, name and notes, notices and Resume.
"""

from __future__ import annotations

import pytest

from panel.browser import PanelServer, text_of, wait_text

pytestmark = [pytest.mark.browser, pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(600)]


@pytest.fixture(scope="module")
def server(tmp_path_factory, demo_home):
    server = PanelServer(tmp_path_factory.mktemp("runs"), "--preset", "demo")
    yield server
    from tunedeck.backend.runs import RunManager

    manager = RunManager(server.runs_dir)  # never leave a run behind, whatever failed
    for run in manager.list_runs():
        if run.state in ("queued", "running", "stopping"):
            manager.stop(run.run_id, grace_s=5)
            manager.wait(run.run_id, timeout=60)
    server.stop()


def load(page, server):
    page.goto(server.url)
    page.wait_for_selector("#file-view .cm-content")
    wait_text(page, "#job-issues", "No problems")


def test_smoke_test_button_runs_the_shown_job_and_shows_its_verdict(page, server):
    load(page, server)
    page.click("#preset-7b-lora-ddp")  # 4 GPUs: Start cannot run it here, its smoke run can
    wait_text(page, "#notice", "7B LoRA DDP")
    wait_text(page, "#job-issues", "No problems")
    page.click("#smoke-run")
    wait_text(page, "#notice", "Started smoke run", timeout=120_000)  # the first builds the tiny model
    wait_text(page, "#run-state", "Smoke test", timeout=30_000)
    wait_text(page, "#run-state", "smoke test passed", timeout=300_000)
    line = text_of(page, "#run-state")
    assert "2 ranks on 1 machine · DDP" in line and "trainable parameters; loss" in line
    wait_text(page, "#runs-table", "smoke test · ")
