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


# job.yaml files this version does not read as a job: an older version's flat `model:` (a str where a section
# is now) with a field since renamed, a damaged file, none at all.
OTHER_VERSION, DAMAGED_JOB, NO_JOB = "20250103-120000-00000a", "20250103-120000-00000b", "20250103-120000-00000c"
ODD_JOBS = {OTHER_VERSION: "model: gpt2\nmethod: lora\nlora_rank: 8\n", DAMAGED_JOB: "model: [gpt2\n", NO_JOB: None}


def test_a_job_yaml_of_another_version_is_named_and_breaks_no_listing(runs_dir):
    from tunedeck.app.run_index import UNREADABLE_MARK, RunsIndex, table_row, unreadable_line
    from tunedeck.backend.spec import resolve_spec, spec_to_yaml

    (good_run(runs_dir) / "job.yaml").write_text(spec_to_yaml(resolve_spec("demo")))
    for run_id, text in ODD_JOBS.items():
        folder = good_run(runs_dir, run_id)
        if text is not None:
            (folder / "job.yaml").write_text(text)

    listing = tunedeck("runs", "--runs-dir", runs_dir)
    assert listing.returncode == 0 and "Traceback" not in listing.stderr, listing.stderr
    lines = {line.split()[0]: line for line in listing.stdout.splitlines()[1:]}
    assert "job.yaml not readable" not in lines[GOOD] and "3/3" in lines[GOOD]
    assert all("(job.yaml not readable: see runs show)" in lines[run_id] for run_id in ODD_JOBS)

    show = tunedeck("runs", "show", OTHER_VERSION, "--runs-dir", runs_dir)
    assert show.returncode == 0 and "Traceback" not in show.stderr, show.stderr
    (said,) = [line for line in show.stdout.splitlines() if line.startswith("job ")]
    assert "is not a job this version of tunedeck can read: written by another version" in said
    assert "model:" in said and "lora_rank: unknown field" in said  # each field named, with what is wrong
    assert "state    finished" in show.stdout and "progress step 3/3" in show.stdout  # the rest as for any run
    damaged = tunedeck("runs", "show", DAMAGED_JOB, "--runs-dir", runs_dir)
    assert damaged.returncode == 0 and "could not be read as YAML" in damaged.stdout, damaged.stderr
    missing = tunedeck("runs", "show", NO_JOB, "--runs-dir", runs_dir)
    assert missing.returncode == 0 and "the file is missing" in missing.stdout, missing.stderr

    index = RunsIndex(RunManager(runs_dir))  # the page's runs table and run view
    rows = {run.run_id: (table_row(run, index.facts(run)), unreadable_line(index.facts(run))) for run in index.runs()}
    assert rows[GOOD][0][3] == "demo/model · lora · ddp · 2xCPU" and rows[GOOD][1] == ""
    for run_id in ODD_JOBS:
        assert rows[run_id][0][3].endswith(UNREADABLE_MARK) and str(runs_dir / run_id / "job.yaml") in rows[run_id][1]
    assert "lora_rank: unknown field" in rows[OTHER_VERSION][1]


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
