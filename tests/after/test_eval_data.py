"""Evaluate says what stops it in its own status line, in the page's words (issue 31, point 2): a run without
held-out rows is told to pick or upload a file, or to use rows of its training file; the CLI keeps its flag's
words. An evaluation file that is the training file (a copy too) is a warning as soon as it is picked.
No model is loaded here: each check answers before a worker would start."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from runs.helpers import fake_run

from tunedeck.app.after_view import AfterView
from tunedeck.backend.after.eval_data import NoEvalData, eval_source, sample_training_rows, seen_in_training
from tunedeck.backend.after.scoring import eval_rows
from tunedeck.backend.runs.manager import RunManager
from tunedeck.backend.spec import JobSpec, resolve_spec, set_paths, spec_to_dict

RUN_ID = "20250101-120000-abcdef"
ROWS = [{"prompt": f"Q: {i} + 1 =", "completion": f" {i + 1}"} for i in range(30)]


@pytest.fixture
def run(tmp_path) -> tuple[AfterView, Path, JobSpec]:
    """A finished LoRA run with a final adapter, trained on data/train.jsonl with no held-out file beside it."""
    data = tmp_path / "data" / "train.jsonl"
    data.parent.mkdir()
    data.write_text("".join(json.dumps(row) + "\n" for row in ROWS))
    folder = fake_run(tmp_path / "runs", RUN_ID, "finished", None)
    job = set_paths(resolve_spec("demo"), {"dataset.path": str(data)})
    (folder / "job.yaml").write_text(yaml.safe_dump(spec_to_dict(job)))
    (folder / "output").mkdir()
    (folder / "output" / "adapter_model.safetensors").write_bytes(b"")
    return AfterView(RunManager(tmp_path / "runs")), folder, job


def test_evaluate_without_held_out_rows_says_what_to_do_in_its_status_line(run):
    view, folder, job = run
    updates = list(view.evaluate(RUN_ID, "final"))
    assert updates == [
        {
            "after.eval_status": "✗ This run kept no held-out rows: its job has no evaluation split and no eval, test "
            "or validation file lies beside train.jsonl. Upload an evaluation file in the box above (in the run's "
            "dataset format), or press Evaluate on training rows (rows the model has seen)."
        }
    ]
    assert view.pool.live() == {}  # said before a worker (and its model) started
    with pytest.raises(NoEvalData) as cli:  # the worker, for `tunedeck eval`: the same fact, the CLI's words
        eval_rows(folder, job)
    assert str(cli.value).endswith("pass --data FILE (in the run's dataset format)") and "Upload" not in str(cli.value)


def test_an_evaluation_file_that_is_the_training_file_is_a_warning_when_picked(run, tmp_path):
    view, _, job = run
    copy = tmp_path / "upload" / "mine.jsonl"
    copy.parent.mkdir()
    copy.write_bytes(Path(job.dataset.path).read_bytes())  # another name, the same bytes
    for picked in (job.dataset.path, str(copy)):
        note = view.eval_data_note(RUN_ID, picked)["after.eval_status"]
        assert note.startswith(f"⚠ {Path(picked).name} is the run's training file (train.jsonl, the same content)")
        assert "the model trained on these rows" in note and "`dataset.eval_split`" in note
    other = tmp_path / "upload" / "held-out.jsonl"
    other.write_text(json.dumps({"prompt": "Q: 100 + 1 =", "completion": " 101"}) + "\n")
    assert view.eval_data_note(RUN_ID, str(other)) == {}


def test_rows_of_the_training_file_are_sampled_into_the_run_folder_and_said_to_be_seen(run):
    _, folder, job = run
    sample = sample_training_rows(folder, job, 8)
    assert sample == folder / "eval-data" / "training-rows-8.jsonl"
    rows = [json.loads(line) for line in sample.read_text().splitlines()]
    assert len(rows) == 8 and all(row in ROWS for row in rows) and len({row["prompt"] for row in rows}) == 8
    assert sample_training_rows(folder, job, 8).read_text() == sample.read_text()  # the same rows each time
    assert eval_source(folder, job, str(sample))[2] == str(sample)
    assert (
        seen_in_training(folder, job, str(sample))
        == "training-rows-8.jsonl holds rows sampled from the run's training file"
    )


def test_tunedeck_eval_keeps_its_flags_words_and_loads_no_model(run, capsys):
    from tunedeck.backend.cli import main

    _, folder, _ = run
    assert main(["eval", RUN_ID, "--runs-dir", str(folder.parent)]) == 2
    said = capsys.readouterr().err
    assert "the run has no evaluation data" in said and "pass --data FILE (in the run's dataset format)" in said
    assert "Upload an evaluation file" not in said and "loading" not in said
