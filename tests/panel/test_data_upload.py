"""⬆ Upload data: the files go under the runs folder, the job points at them, and a run trains on them."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tunedeck.app.data_upload import fill_from_upload
from tunedeck.backend.data.uploads import DATASETS_DIR
from tunedeck.backend.spec import resolve_spec
from tunedeck.backend.spec.fields import values_from_spec


def _jsonl(path, rows) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return str(path)


CHAT = [{"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]}]
QA = [{"prompt": f"Q: {i} + 1\nA:", "completion": f" {i + 1}"} for i in range(40)]


def _fill(files, runs_dir, preset="7b-lora-ddp"):
    return fill_from_upload(values_from_spec(resolve_spec(preset)), files, runs_dir)


def test_one_file_is_kept_under_the_runs_folder_and_its_format_is_read_from_its_columns(tmp_path):
    upload = tmp_path / "upload" / "my chat data.jsonl"
    upload.parent.mkdir()
    spec, message = _fill([_jsonl(upload, CHAT)], tmp_path / "runs")
    kept = spec.dataset.path
    assert kept.startswith(str(tmp_path / "runs" / DATASETS_DIR)) and kept.endswith("/my_chat_data.jsonl")
    assert open(kept, encoding="utf-8").read() == upload.read_text(encoding="utf-8")
    # The preset's hub dataset had a test split; one file has none: no evaluation during training.
    assert (spec.dataset.format, spec.dataset.messages_field, spec.dataset.eval_split) == ("messages", "messages", None)
    assert "Row format **messages** (its columns: messages)." in message
    assert "No held-out file" in message

    again, _ = _fill([str(upload)], tmp_path / "runs")  # the same file again: the same folder, not a copy
    assert again.dataset.path == kept and len(list((tmp_path / "runs" / DATASETS_DIR).iterdir())) == 1


def test_a_training_file_and_its_held_out_file_become_the_splits_of_one_folder(tmp_path):
    train, held_out = tmp_path / "qa.jsonl", tmp_path / "qa-eval.jsonl"
    spec, message = _fill([_jsonl(held_out, QA[:8]), _jsonl(train, QA)], tmp_path / "runs")
    folder = tmp_path / "runs" / DATASETS_DIR
    [kept] = folder.iterdir()
    assert spec.dataset.path == str(kept) and sorted(p.name for p in kept.iterdir()) == [
        "train.jsonl",
        "validation.jsonl",
    ]
    assert (kept / "train.jsonl").read_text() == train.read_text()
    assert (spec.dataset.split, spec.dataset.eval_split, spec.dataset.format) == (
        "train",
        "validation",
        "prompt-completion",
    )
    assert "The second file is the evaluation split" in message


@pytest.mark.slow  # imports the datasets library
def test_the_datasets_library_reads_the_kept_folder_as_train_and_validation(tmp_path):
    from tunedeck.backend.recipe import load_split

    spec, _ = _fill([_jsonl(tmp_path / "train.jsonl", QA), _jsonl(tmp_path / "test.jsonl", QA[:8])], tmp_path / "runs")
    config = spec.dataset.model_dump()
    assert len(load_split(config, "train")) == 40 and len(load_split(config, "validation")) == 8


@pytest.mark.parametrize(
    ("names", "says"),
    [
        (["notes.txt"], "notes.txt is not a data file; upload JSONL, JSON, CSV or Parquet"),
        (["a.jsonl", "b.jsonl"], "of a.jsonl and b.jsonl, which is the training data? Name the held-out file"),
        (["train.jsonl", "eval.csv"], "a training file with its held-out file of the same type"),
        (["train.jsonl", "eval.jsonl", "test.jsonl"], "upload one data file, or a training file with its held-out"),
        ([], "no file received"),
    ],
)
def test_an_upload_that_cannot_be_used_changes_nothing_and_says_why(tmp_path, names, says):
    files = [_jsonl(tmp_path / name, QA) for name in names]
    spec, message = _fill(files, tmp_path / "runs")
    assert spec is None and message.startswith("✗ data upload: ") and says in message
    assert message.endswith("the form is unchanged.")
    assert not (tmp_path / "runs" / DATASETS_DIR).exists() or not any((tmp_path / "runs" / DATASETS_DIR).iterdir())


def test_a_file_name_cannot_lead_out_of_the_folder_and_unknown_columns_keep_the_format(tmp_path):
    odd = tmp_path / "..%2F..%2Fescape.jsonl"
    spec, message = _fill([_jsonl(odd, [{"question": "q", "answer": "a"}])], tmp_path / "runs", preset="demo")
    kept = tmp_path / "runs" / DATASETS_DIR
    assert spec.dataset.path.startswith(str(kept)) and "/" not in spec.dataset.path[len(str(kept)) + 18 :]
    assert spec.dataset.format == "prompt-completion"  # the preset's, unchanged
    assert "Its columns (question, answer) are no format's own: set dataset.format" in message


@pytest.mark.integration
def test_a_run_trains_on_the_uploaded_files_and_evaluates_on_the_held_out_one(demo_home, runs_dir, tmp_path):
    from runs.helpers import logs_tail, read_metrics

    from tunedeck.backend.runs.manager import RunManager
    from tunedeck.backend.spec import set_paths

    files = [str(demo_home / "data" / name) for name in ("train.jsonl", "eval.jsonl")]
    demo = set_paths(
        resolve_spec("demo"), {"training.max_steps": 4, "training.eval_steps": 2, "training.save_steps": 4}
    )
    spec, _ = fill_from_upload(values_from_spec(demo), files, runs_dir)
    manager = RunManager(runs_dir)
    run_id = manager.start(spec)
    status = manager.wait(run_id, timeout=240)
    run_dir = manager.run_dir(run_id)
    assert status.state == "finished", logs_tail(run_dir)
    evals = [r for r in read_metrics(run_dir) if "eval_loss" in r]  # measured on validation.jsonl
    assert [r["step"] for r in evals] == [2, 4], logs_tail(run_dir)
    assert [run.run_id for run in manager.list_runs()] == [run_id]  # the datasets folder is not a run


def test_a_copy_that_fails_halfway_leaves_nothing_behind(tmp_path):
    """A disk that fills during the copy (here: a file size limit, EFBIG, in a process of its own) is said in the
    notice, and no folder is left under the runs folder, not even the copy's .partial one."""
    upload = tmp_path / "big.jsonl"
    _jsonl(upload, [{"text": "x" * 1000}] * 2000)  # 2 MB
    script = f"""
import resource, signal
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG instead of killing
resource.setrlimit(resource.RLIMIT_FSIZE, (2**20, 2**20))
from tunedeck.app.data_upload import fill_from_upload
from tunedeck.backend.spec.fields import values_from_spec
from tunedeck.backend.spec import resolve_spec
spec, message = fill_from_upload(values_from_spec(resolve_spec("demo")), [{str(upload)!r}], {str(tmp_path / "runs")!r})
print(spec is None, message)
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.stdout.startswith("True ✗ data upload: could not keep the files (File too large)"), done
    assert list((tmp_path / "runs" / DATASETS_DIR).iterdir()) == []


def test_an_upload_with_nothing_held_out_is_offered_a_fix_that_holds_rows_out(tmp_path):
    """Issue 31: at upload, the page offers to hold out rows of the training file (a warning with a Fix); the Fix's
    two slices are disjoint and together the whole file, as the datasets library reads them for the run."""
    from datasets import load_dataset

    from tunedeck.backend.data.uploads import held_out_offer
    from tunedeck.backend.spec import set_paths

    upload = tmp_path / "upload" / "qa.jsonl"
    upload.parent.mkdir()
    spec, _ = _fill([_jsonl(upload, QA)], tmp_path / "runs")
    offer = held_out_offer(spec, tmp_path / "runs")
    assert offer.level == "warning" and offer.field == "dataset.eval_split"
    assert (
        "qa.jsonl was uploaded without a held-out file" in offer.message and "about 2 of its 40 rows" in offer.message
    )
    assert offer.fix == {"dataset.split": "train[:95%]", "dataset.eval_split": "train[95%:]"}

    fixed = set_paths(spec, offer.fix)
    assert held_out_offer(fixed, tmp_path / "runs") is None  # the Fix clears it
    rows = [
        list(load_dataset("json", data_files=fixed.dataset.path, split=s)["prompt"])
        for s in ("train[:95%]", "train[95%:]")
    ]
    assert (
        len(rows[1]) == 2
        and not set(rows[0]) & set(rows[1])
        and sorted(rows[0] + rows[1]) == sorted(r["prompt"] for r in QA)
    )

    # A file of one's own elsewhere (not an upload) is left to its owner; a preset's hub data too.
    assert held_out_offer(set_paths(spec, {"dataset.path": str(upload)}), tmp_path / "runs") is None
    assert held_out_offer(resolve_spec("7b-lora-ddp"), tmp_path / "runs") is None
