"""Real runs on real small disks (tmpfs) that fill up mid-run (issue 8, point 4).

A checkpoint that does not fit must leave no half-written checkpoint-N for resume to
load; a run whose disk fills must end recorded as failed (the supervisor frees the room
it kept for that), and every reader must go on working.
"""

from __future__ import annotations

import json
import re

import gradio as gr
import pytest

from tunedeck.app.registry import Registry
from tunedeck.app.run_view import RunShown, RunView
from tunedeck.app.section import Page
from tunedeck.backend.runs.manager import RunManager
from tunedeck.backend.runs.supervisor import RESERVE_FILE, is_alive

from .helpers import fill, log_records, logs_tail, status_json, tunedeck, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]


def test_a_checkpoint_that_does_not_fit_leaves_the_last_complete_one_for_resume(small_disk, demo_spec):
    from transformers.trainer_utils import get_last_checkpoint

    disk = small_disk("2m")  # the run folder and one checkpoint (1.1 MB) fit; a second does not
    manager = RunManager(disk)
    # Keeping one checkpoint passes the preflight's room check (one checkpoint and the final model), but
    # the Trainer writes the next checkpoint before it deletes the old one.
    job = {"training.max_steps": 8, "training.save_steps": 2, "training.save_total_limit": 1}
    run_id = manager.start(demo_spec({**job, "launch.num_processes": 1}))
    status = manager.wait(run_id, timeout=240)
    run_dir = manager.run_dir(run_id)
    assert status.state == "failed", f"{status}\n{logs_tail(run_dir)}"
    assert status.error.startswith(
        f"rank 0 failed first: output_dir: the disk holding {run_dir / 'output'} is full: checkpoint-4 did not fit"
    )
    output = run_dir / "output"
    assert sorted(p.name for p in output.iterdir() if p.is_dir()) == [
        "checkpoint-2"
    ]  # nothing half-written, no staging left
    assert get_last_checkpoint(str(output)) == str(output / "checkpoint-2")
    assert json.loads((output / "checkpoint-2" / "trainer_state.json").read_text())["global_step"] == 2
    assert not is_alive(status_json(run_dir)["supervisor"])


def test_a_disk_that_fills_mid_run_ends_recorded_and_every_reader_works(small_disk, demo_spec, monkeypatch):
    disk = small_disk("4m")  # room for what the job keeps at the start (the preflight checks it); filled below
    manager = RunManager(disk)
    run_id = manager.start(demo_spec({"training.max_steps": 2000, "training.save_steps": 1000}))
    run_dir = manager.run_dir(run_id)
    wait_for(lambda: log_records(run_dir), 180, what=f"training\n{logs_tail(run_dir)}")
    fill(disk)  # as another job on the same disk would

    status = manager.wait(run_id, timeout=180)
    assert status.state == "failed", f"{status}\n{logs_tail(run_dir)}"
    assert status.error.startswith(f"the disk holding {run_dir} is full (No space left on device): free space")
    assert status_json(run_dir)["state"] == "failed"  # written by the supervisor, into the room it kept
    assert not (run_dir / RESERVE_FILE).exists()
    assert not is_alive(status_json(run_dir)["supervisor"])

    listing = tunedeck("runs", "--runs-dir", disk)
    assert listing.returncode == 0 and re.search(rf"^{run_id}\s+-\s+failed\s", listing.stdout, re.M), listing.stdout
    show = tunedeck("runs", "show", run_id, "--runs-dir", disk)
    assert show.returncode == 0 and "state    failed" in show.stdout and "is full" in show.stdout, show.stderr
    monkeypatch.setattr("tunedeck.app.run_watch.MIN_REFRESH_S", 0)
    view = RunView(manager)
    with gr.Blocks():
        view.build(Page(Registry()))
    out = view.render(RunShown(), 0.6, False, None)
    assert out[view.shown].run == run_id and "failed" in out[view.status] and "is full" in out[view.error]["value"]
