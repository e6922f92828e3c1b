"""A run's name and notes (notes.json), its results in one line, and what Resume continues from."""

from __future__ import annotations

import json
import math
import re

import pytest

from tunedeck.backend.runs.manager import RunError, RunManager
from tunedeck.backend.runs.notes import NotesError, read_notes, write_notes
from tunedeck.backend.runs.records import RunRecords
from tunedeck.backend.runs.resume import resume_spec
from tunedeck.backend.runs.summary import report
from tunedeck.backend.spec import resolve_spec, spec_to_yaml

from .helpers import fake_run, tunedeck

RUN_ID = "20250101-120000-0000aa"


def test_notes_are_stored_in_the_run_folder_and_shown_by_the_cli(runs_dir):
    folder = fake_run(runs_dir, RUN_ID, "stopped", None)
    assert read_notes(folder).name == ""  # none set
    write_notes(folder, "  baseline lr 5e-3 ", "first try\n\tloss falls fast")
    assert json.loads((folder / "notes.json").read_text()) == {
        "name": "baseline lr 5e-3",
        "notes": "first try\n\tloss falls fast",
    }
    listing = tunedeck("runs", "--runs-dir", runs_dir)
    assert any(line.startswith(RUN_ID) and "baseline lr 5e-3" in line for line in listing.stdout.splitlines())
    noted = tunedeck("runs", "note", RUN_ID, "--notes", "second thoughts", "--runs-dir", runs_dir)
    assert noted.returncode == 0, noted.stderr
    show = tunedeck("runs", "show", RUN_ID, "--runs-dir", runs_dir).stdout
    assert "name     baseline lr 5e-3\n" in show and "notes:\nsecond thoughts" in show  # the name was kept


@pytest.mark.parametrize(
    ("name", "notes", "says"),
    [
        ("a\x1b[2Jb", "", "name: U+001B (escape) at character 2"),
        ("two\nlines", "", "name: U+000A (line feed)"),
        ("x" * 81, "", "name: 81 characters, at most 80"),
        ("ok", "bell\x07", "notes: U+0007"),
    ],
)
def test_a_name_or_notes_that_cannot_be_stored_is_refused_naming_the_field(runs_dir, name, notes, says):
    folder = fake_run(runs_dir, RUN_ID, "stopped", None)
    with pytest.raises(NotesError, match=re.escape(says)):
        write_notes(folder, name, notes)
    assert not (folder / "notes.json").exists()


def test_damaged_notes_read_as_none(runs_dir):
    folder = fake_run(runs_dir, RUN_ID, "stopped", None)
    for text in ("{", "[1]", '{"name": 5}', '{"name": "' + "x" * 500 + '"}'):
        (folder / "notes.json").write_text(text)
        assert read_notes(folder).name == ""


def test_the_report_gives_final_best_tokens_and_speed_and_skips_what_is_not_finite():
    run = RunRecords()
    run.add([
        {"event": "start", "resumed_from_step": 30},
        {"event": "log", "step": 31, "loss": 2.0, "num_tokens": 1000.0, "tokens_per_second": 100.0},
        {"event": "log", "step": 32, "loss": 1.5, "num_tokens": 2000.0, "tokens_per_second": 300.0},
        {"event": "log", "step": 32, "eval_loss": 1.7},
        {"event": "log", "step": 33, "loss": math.nan, "num_tokens": 3000.0, "tokens_per_second": math.inf},
        {"event": "log", "step": 34, "loss": 1.8, "gpu_peak_allocated_gb": [3.5, 4.25]},
    ])  # fmt: skip
    line = report(run, started_at=100.0, ended_at=165.0).line()
    assert line == (
        "resumed from step 30 · final loss 1.8000 · best 1.5000 at step 32 · eval loss 1.7000 · 3,000 tokens"
        " · 1:05 wall · 200 tokens/s mean · peak 4.25 GB per GPU"
    )
    assert report(RunRecords(), None, None).line() == ""
    live = report(run, started_at=100.0, ended_at=None, now=130.0).line()  # a run still going: no final loss yet
    assert live.startswith("resumed from step 30 · latest loss 1.8000 · best") and "0:30 wall" in live
    reshaped = RunRecords()  # resumed on 1 process from a checkpoint saved on 2 (tunedeck runs resume --num-processes)
    reshaped.add(
        [{"event": "start", "resumed_from_step": 8, "world_size": 1, "restored": {"saved": {"data_parallel": 2}}}]
    )
    assert report(reshaped, None, None).line() == "resumed from step 8 · saved on 2 processes"
    reshaped.start["world_size"] = 2  # on the processes it was saved on: nothing more to say
    assert report(reshaped, None, None).line() == "resumed from step 8"


def _stopped_run(manager: RunManager, state: str = "stopped", checkpoints=(3, 12)):
    folder = fake_run(manager.runs_dir, RUN_ID, state, None)
    (folder / "job.yaml").write_text(spec_to_yaml(resolve_spec("demo")))
    for step in checkpoints:
        (folder / "output" / f"checkpoint-{step}").mkdir(parents=True)
    (folder / "output" / ".incomplete" / "checkpoint-20").mkdir(parents=True)  # cut short: never a resume point
    return folder


def test_resume_continues_the_same_job_from_the_newest_checkpoint_in_the_runs_own_folder(runs_dir):
    manager = RunManager(runs_dir)
    folder = _stopped_run(manager)
    spec, step, _ = resume_spec(manager, RUN_ID)
    assert step == 12
    assert spec.training.resume_from_checkpoint is True
    assert spec.output_dir == str((folder / "output").resolve())  # absolute: the new run writes on in the same folder
    assert (
        spec.model == resolve_spec("demo").model and spec.training.max_steps == resolve_spec("demo").training.max_steps
    )


@pytest.mark.parametrize(
    ("state", "checkpoints", "says"),
    [
        ("finished", (3,), "is finished: only a stopped or failed run can be resumed"),
        ("failed", (), "saved no checkpoint in .*output: there is nothing to continue from"),
    ],
)
def test_resume_says_why_it_cannot(runs_dir, state, checkpoints, says):
    manager = RunManager(runs_dir)
    _stopped_run(manager, state, checkpoints)
    with pytest.raises(RunError, match=says):
        resume_spec(manager, RUN_ID)
