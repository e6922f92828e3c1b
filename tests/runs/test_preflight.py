"""Inputs that cannot work are named before launch (issue 8, point 6): the field, the file and line, the fix.

Without these checks a missing local model reads "Repo id must be in the form ..." and a
bad JSONL file StopIteration or "'list' object has no attribute 'endswith'", minutes in.
The same checks run in train.py, so a bundle run without tunedeck says the same words.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tunedeck.backend.render import render_bundle, write_bundle
from tunedeck.backend.runs.manager import RunError, RunManager
from tunedeck.backend.runs.preflight import preflight

from .helpers import tunedeck


def jsonl(path: Path, *rows) -> str:
    path.write_text("".join((row if isinstance(row, str) else json.dumps(row)) + "\n" for row in rows))
    return str(path)


@pytest.fixture
def files(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    good = {"prompt": "Q: 1+1?", "completion": "2"}
    (tmp_path / "no-config").mkdir()
    return {
        "malformed": jsonl(data / "malformed.jsonl", good, '{"prompt": "Q: 2+2?", "completion": "4"', good),
        "empty": jsonl(data / "empty.jsonl"),
        "wrong type": jsonl(data / "lists.jsonl", good, {"prompt": ["Q: 3+3?"], "completion": "6"}),
        "missing column": jsonl(data / "columns.jsonl", {"question": "Q", "answer": "A"}),
        "not an object": jsonl(data / "array.jsonl", good, [1, 2]),
        "no-config": str(tmp_path / "no-config"),
    }


CASES = {
    # name: (overrides, field, the words of the message; {path} is the file)
    "missing model": (
        {"model.name_or_path": "/nowhere/llama-7b"},
        "model.name_or_path",
        "/nowhere/llama-7b does not exist: give the folder a model was saved to (with config.json) or a Hugging Face hub id",
    ),
    "relative model": (
        {"model.name_or_path": "./models/mine"},
        "model.name_or_path",
        "./models/mine does not exist (a relative path is taken from the run folder, {runs}/<run-id>)",
    ),
    "no config.json": (
        {"model.name_or_path": "no-config"},
        "model.name_or_path",
        "the folder {path} has no config.json: give the folder a model was saved to",
    ),
    "malformed": (
        {"dataset.path": "malformed"},
        "dataset.path",
        "{path} line 2 is not valid JSON (Expecting ',' delimiter): fix or remove that line",
    ),
    "empty": (
        {"dataset.path": "empty"},
        "dataset.path",
        '{path} has no rows: give a file with one JSON object per line, e.g. {{"prompt": "...", "completion": "..."}}',
    ),
    "wrong type": (
        {"dataset.path": "wrong type"},
        "dataset.prompt_field",
        "{path} line 2: column 'prompt' holds a list whose item 0 is not a message with role and content, but dataset.format prompt-completion needs a string, or a list of messages such as",
    ),
    "missing column": (
        {"dataset.path": "missing column"},
        "dataset.prompt_field",
        "{path} line 1 has no column 'prompt' (it has 'question', 'answer'): set dataset.prompt_field to the column that holds the prompt, or change dataset.format",
    ),
    "not an object": (
        {"dataset.path": "not an object"},
        "dataset.path",
        "{path} line 2 holds a list, not a JSON object",
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_each_problem_names_the_field_the_file_and_line_and_the_fix(case, files, demo_spec, runs_dir):
    overrides, field, words = CASES[case]
    overrides = {key: files.get(value, value) for key, value in overrides.items()}
    path = next(iter(overrides.values()))
    problems = preflight(demo_spec(overrides), runs_dir)
    assert problems and {p.level for p in problems} == {"error"} and problems[0].field == field, problems
    assert words.format(path=path, runs=runs_dir) in problems[0].message


def test_good_inputs_and_hub_ids_pass(demo_spec, runs_dir, demo_home):
    assert preflight(demo_spec(), runs_dir) == []
    for fmt in ("text", "prompt-completion", "messages", "alpaca"):
        spec = demo_spec({"dataset.path": str(demo_home / "formats" / f"{fmt}.jsonl"), "dataset.format": fmt})
        assert preflight(spec, runs_dir) == [], fmt
    hub = demo_spec(
        {"model.name_or_path": "meta-llama/Llama-2-7b-hf", "dataset.path": "timdettmers/openassistant-guanaco"}
    )
    assert preflight(hub, runs_dir) == []  # nothing to check without the network


def test_start_refuses_before_anything_is_launched(files, demo_spec, runs_dir):
    spec = demo_spec({"model.name_or_path": "/nowhere/llama-7b", "dataset.path": files["wrong type"]})
    with pytest.raises(RunError) as refused:
        RunManager(runs_dir).start(spec)
    message = str(refused.value)
    assert message.startswith("the job's inputs have problems:\n- model.name_or_path: /nowhere/llama-7b does not exist")
    assert f"- dataset.prompt_field: {files['wrong type']} line 2" in message
    assert [p.name for p in runs_dir.iterdir() if not p.name.startswith(".")] == []


def test_validate_and_train_print_the_problems_and_exit_2(files, runs_dir):
    bad_data = ["--set", f"dataset.path={files['malformed']}"]
    validate = tunedeck("validate", "demo", *bad_data)
    assert validate.returncode == 2 and "Traceback" not in validate.stderr
    assert f"error: dataset.path: {files['malformed']} line 2 is not valid JSON" in validate.stderr
    train = tunedeck(
        "train", "demo", "--set", "model.name_or_path=/nowhere/llama-7b", *bad_data, "--runs-dir", runs_dir
    )
    assert train.returncode == 2 and "Traceback" not in train.stderr, train.stderr
    assert "error: model.name_or_path: /nowhere/llama-7b does not exist" in train.stderr
    assert f"error: dataset.path: {files['malformed']} line 2" in train.stderr and "nothing started" in train.stderr
    assert [p.name for p in runs_dir.iterdir() if not p.name.startswith(".")] == []


@pytest.mark.timeout(300)
def test_a_bundle_run_without_tunedeck_says_the_same(files, demo_spec, tmp_path):
    spec = demo_spec(
        {"model.name_or_path": str(tmp_path / "no-config"), "dataset.path": files["empty"], "launch.num_processes": 1}
    )
    expected = "\n".join(f"{p.field}: {p.message}" for p in preflight(spec, tmp_path))
    bundle = tmp_path / "bundle"
    write_bundle(render_bundle(spec), bundle)  # exported as a user would, then run by hand on a node
    poison = tmp_path / "poison"  # packages named like tunedeck's, first on the path, that refuse to be imported
    for package in ("backend", "app"):
        (poison / package).mkdir(parents=True)
        (poison / package / "__init__.py").write_text("raise ImportError('the bundle must not import tunedeck')\n")
    result = subprocess.run(
        [sys.executable, "train_sft.py", "--job", "job.yaml", "--training-args", "training_args.yaml"],
        cwd=bundle,
        env={**os.environ, "PYTHONPATH": str(poison), "HF_HUB_OFFLINE": "1"},
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert result.returncode == 1
    (failure,) = [json.loads(line) for line in (bundle / "errors.jsonl").read_text().splitlines()]
    assert failure["error"] == expected and failure["traceback"] is None
    assert expected.startswith("model.name_or_path: the folder") and "\ndataset.path: " in expected
