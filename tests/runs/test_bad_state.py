"""Bad state never breaks the tool (issue 8, points 4 and 7): damaged run folders, full disks, a runs folder that is a file.

The disks are real tmpfs mounts that really fill up; the commands are the real `tunedeck`.
"""

from __future__ import annotations

import json
import re
import subprocess
import time

import pytest

from tunedeck.backend.runs.manager import RunError, RunManager

from .helpers import fake_run, fill, tunedeck

GOOD = "20250101-120000-000001"
# Newer than the good run, so a reader that stops at the first bad one never reaches it.
DAMAGED = {
    "20250102-120000-00000a": ("[1, 2]", "holds a JSON list"),
    "20250102-120000-00000b": ('{"state": 5, "title": "t"}', "state: Input should be"),
    "20250102-120000-00000c": ('{"state": "running", "created_at": "yesterday"}', "created_at"),
    "20250102-120000-00000d": ('{"state": "finished", "started_at": 1e300}', "started_at"),
    "20250102-120000-00000e": ('{"state": "fini', "cannot be read"),
    "20250102-120000-00000f": (None, "no status.json"),
}


def good_run(runs_dir, run_id: str = GOOD):
    folder = fake_run(runs_dir, run_id, "finished", None)
    status = json.loads((folder / "status.json").read_text())
    status.update(ended_at=time.time() - 10, exit_code=0, title="demo/model · lora · ddp · 2xCPU")
    (folder / "status.json").write_text(json.dumps(status))
    records = [{"event": "start", "world_size": 2, "distributed_type": "MULTI_CPU", "max_steps": 3}]
    records += [
        {"event": "log", "step": s, "max_steps": 3, "loss": 3.0 / s, "time": time.time() - 40 + s} for s in (1, 2, 3)
    ]
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return folder


def damaged_runs(runs_dir):
    good_run(runs_dir)
    for run_id, (text, _) in DAMAGED.items():
        (runs_dir / run_id).mkdir()
        if text is not None:
            (runs_dir / run_id / "status.json").write_text(text)


def test_damaged_status_files_are_one_damaged_run_each_and_break_nothing(runs_dir):
    damaged_runs(runs_dir)
    manager = RunManager(runs_dir)
    runs = {run.run_id: run for run in manager.list_runs()}
    assert runs[GOOD].state == "finished"
    for run_id, (_, reason) in DAMAGED.items():
        assert runs[run_id].state == "damaged", runs[run_id]
        assert reason in runs[run_id].error and str(runs_dir / run_id) in runs[run_id].error
    assert manager.active_run() is None
    assert manager.status("20250102-120000-00000b").state == "damaged"

    listing = tunedeck("runs", "--runs-dir", runs_dir)
    assert listing.returncode == 0 and "Traceback" not in listing.stderr, listing.stderr
    lines = {line.split()[0]: line for line in listing.stdout.splitlines()[1:]}
    assert "finished" in lines[GOOD] and "3/3" in lines[GOOD]
    assert all("damaged" in lines[run_id] for run_id in DAMAGED)

    show = tunedeck("runs", "show", "20250102-120000-00000a", "--runs-dir", runs_dir)
    assert show.returncode == 0 and "state    damaged" in show.stdout and "holds a JSON list" in show.stdout, (
        show.stderr
    )
    stop = tunedeck("runs", "stop", "20250102-120000-00000a", "--runs-dir", runs_dir)
    assert stop.returncode == 0 and "is not running (damaged)" in stop.stdout, stop.stderr


def test_a_start_on_a_full_disk_is_a_clear_error_and_leaves_no_run_folder(small_disk, demo_spec):
    disk = small_disk("1m")
    manager = RunManager(disk)
    for leave in (0, 40_000):  # nothing fits; part of the run folder fits
        filler = fill(disk, leave)
        # The preflight sees it first: no room for the checkpoints the job keeps (backend/runs/preflight_launch.py).
        with pytest.raises(RunError, match=r"output_dir: .* free, and the job keeps 2 checkpoint\(s\).*free space"):
            manager.start(demo_spec())
        assert [p.name for p in disk.iterdir() if not p.name.startswith(("filler", ".start.lock"))] == []
        filler.unlink()

    fill(disk)
    result = tunedeck("train", "demo", "--runs-dir", disk)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert "output_dir" in result.stderr and "free space" in result.stderr
    assert [p.name for p in disk.iterdir() if not p.name.startswith(("filler", ".start.lock"))] == []


def test_an_end_nobody_could_record_is_worked_out_by_every_reader(small_disk):
    # The supervisor died and the disk is full: the manager can no longer write the end, but says it.
    disk = small_disk("256k")
    holder = subprocess.Popen(["sleep", "120"])
    run_dir = fake_run(disk, "20250101-120000-bbbbbb", "running", holder)
    (run_dir / "metrics.jsonl").write_text(json.dumps({"event": "end", "status": "finished"}) + "\n")
    holder.kill()
    holder.wait()
    fill(disk)
    status = RunManager(disk).status("20250101-120000-bbbbbb")
    assert status.state == "finished"
    assert json.loads((run_dir / "status.json").read_text())["state"] == "running"  # indeed not recorded
    listing = tunedeck("runs", "--runs-dir", disk)
    assert listing.returncode == 0, listing.stderr
    assert re.search(r"^20250101-120000-bbbbbb\s+-\s+finished\s", listing.stdout, re.M), listing.stdout


@pytest.mark.parametrize("command", [["train", "demo"], ["runs"], ["runs", "show", GOOD], ["runs", "stop", GOOD]])
def test_a_runs_dir_that_is_a_file_or_cannot_be_made_is_named(command, tmp_path):
    a_file = tmp_path / "runs.txt"
    a_file.write_text("not a folder\n")
    for runs_dir, says in ((a_file, "is a file, not a folder"), (a_file / "runs", "cannot be created")):
        if command[0] != "train" and says == "cannot be created":
            continue  # reading a runs folder that does not exist is fine: there are no runs
        result = tunedeck(*command, "--runs-dir", runs_dir)
        assert result.returncode == 2, result.stdout + result.stderr
        assert f"error: --runs-dir: {runs_dir}" in result.stderr and says in result.stderr
        assert "Traceback" not in result.stderr


def test_the_panel_refuses_a_runs_dir_that_is_a_file(tmp_path):
    a_file = tmp_path / "runs.txt"
    a_file.write_text("")
    for runs_dir, says in ((a_file, "is a file, not a folder"), (a_file / "sub", "cannot be created")):
        result = tunedeck("ui", "--runs-dir", runs_dir, "--port", "7999", timeout=60)
        assert (
            result.returncode == 2 and f"tunedeck ui: --runs-dir: {runs_dir}" in result.stderr and says in result.stderr
        )
        assert "Traceback" not in result.stderr
