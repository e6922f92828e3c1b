"""`tunedeck check-export`: held-out prompts replayed greedily through the adapter and the exported model as it will be
served; identical answers for the demo's merged model, a flag when the chat template did not travel."""

from __future__ import annotations

import json

import pytest

from .helpers import tunedeck

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]
PROMPTS = 12


def merge(runs_dir, run_id, out, *extra) -> str:
    result = tunedeck("merge", run_id, "-o", out, "--dtype", "float32", "--runs-dir", runs_dir, *extra)
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stdout + result.stderr
    return result.stdout


def check(runs_dir, run_id, target) -> dict:
    result = tunedeck("check-export", run_id, str(target), "--prompts", str(PROMPTS), "--runs-dir", runs_dir, "--json")
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stdout + result.stderr
    return json.loads(result.stdout)


def test_the_demos_merged_model_answers_as_its_adapter_does(demo_run, tmp_path):
    runs_dir, run_id = demo_run
    printed = merge(runs_dir, run_id, tmp_path / "merged", "--check", str(PROMPTS))  # the check after the merge
    assert printed.splitlines()[-1] == f"{PROMPTS}/{PROMPTS} answers identical after export"
    assert (
        "--check: give a positive number"
        in tunedeck("merge", run_id, "-o", tmp_path / "m2", "--check", "-1", "--runs-dir", runs_dir).stderr
    )


def test_a_merged_chat_model_without_its_chat_template_is_flagged(chat_run, tmp_path):
    runs_dir, run_id = chat_run
    folder = tmp_path / "merged-chat"
    merge(runs_dir, run_id, folder)
    assert check(runs_dir, run_id, folder)["flags"] == []  # as merged: the template travelled
    (folder / "chat_template.jinja").unlink(missing_ok=True)  # what a copy of the weights alone loses
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    report = check(runs_dir, run_id, folder)
    assert report["identical"] == 0 and report["template"] == "chat"
    assert report["flags"] == [
        "merged-chat has no chat template: a server cannot wrap a conversation as the run trained"
    ]
    assert "0/12 answers identical after export; 1 flag: merged-chat has no chat template" in report["summary"]
