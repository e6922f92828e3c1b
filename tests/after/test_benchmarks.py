"""Standard benchmarks (lm-evaluation-harness) and the forgetting check (the loss on general text) in `tunedeck eval`:
real runs of the harness and the models on a copy of the session's trained demo run, offline; and every bad flag
said in one line before anything loads."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from tunedeck.backend.after import EvalDataError
from tunedeck.backend.after.eval_results import save_results
from tunedeck.backend.after.general_text import forgetting_lines

from .helpers import tunedeck


@pytest.fixture
def own_run(demo_run, tmp_path):
    """A copy of the demo run (its eval.json is this test's own)."""
    runs_dir, run_id = demo_run
    shutil.copytree(runs_dir / run_id, tmp_path / "runs" / run_id, ignore=shutil.ignore_patterns("merged", "eval*"))
    return tmp_path / "runs", run_id


@pytest.mark.integration
def test_demo_arith_scores_the_adapter_above_the_base_and_general_text_loss_is_measured_for_both(own_run):
    runs_dir, run_id = own_run
    flags = ["--limit", "8", "--tasks", "demo_arith", "--tasks-limit", "all", "--forgetting"]
    offline = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    result = tunedeck("eval", run_id, "--runs-dir", runs_dir, *flags, env=offline)
    assert result.returncode == 0, result.stderr[-3000:]
    saved = json.loads((runs_dir / run_id / "eval.json").read_text())["results"]
    base, final = saved["base"]["benchmarks"]["demo_arith"], saved["final"]["benchmarks"]["demo_arith"]
    assert base["metric"] == "exact_match" and base["samples"] == base["of"] == final["samples"] > 100  # all of it
    assert final["score"] > base["score"], (base, final)  # the adapter learned the demo's arithmetic; the base not
    line = f"base {100 * base['score']:.1f}%, final {100 * final['score']:.1f}%"
    assert f"benchmark demo_arith (exact_match, {base['of']} of {base['of']} questions): {line}" in result.stdout

    texts = saved["base"]["general_text"], saved["final"]["general_text"]
    assert texts[0]["source"] == texts[1]["source"] == "built-in" and texts[0]["tokens"] == texts[1]["tokens"] > 1000
    assert texts[0]["loss"] != texts[1]["loss"]  # the adapter changed how it reads general text
    losses = f"base {texts[0]['loss']:.4f}, final {texts[1]['loss']:.4f}"
    assert f"general-text loss (built-in, {texts[0]['tokens']} tokens): {losses}" in result.stdout
    assert forgetting_lines(saved)[0] in result.stdout  # flagged or not, the verdict with its figures


@pytest.mark.slow  # indexes lm-evaluation-harness's ~15,000 tasks: 10 s on an idle 2-core machine, 20 s beside a CI
def test_an_unknown_task_name_names_tasks_the_local_ones_and_the_fix():
    """What the worker says before a model loads (tunedeck eval and the page show it as it is): the harness's own
    index is read (about 10 s), so the name is unknown everywhere, not only locally."""
    from tunedeck.backend.after.benchmarks import Benchmarks, task_manager

    with pytest.raises(EvalDataError) as refused:
        task_manager(Benchmarks(("demo_arith", "demo_arithmetic")))
    said = str(refused.value)
    assert said.startswith("--tasks: no task named 'demo_arithmetic' on this machine (local: demo_arith;")
    assert said.endswith("fix the name, or give its folder of task YAMLs with --task-dir") and "\n" not in said
    assert refused.value.said("page").startswith("Benchmarks: no task named 'demo_arithmetic' on this machine")


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        (["--tasks", "demo_arith", "--tasks-limit", "some"], "--tasks-limit: 'some' is not a number of questions"),
        (["--tasks", " , "], "--tasks: give one or more task names, e.g. --tasks demo_arith"),
        (["--tasks", "demo_arith", "--task-dir", "/no/such/folder"], "--task-dir: /no/such/folder is not a folder"),
        (["--task-dir", "."], "--task-dir: name the tasks to run from it with --tasks NAMES"),
        (["--general-text", "/no/such/text.txt"], "--general-text: /no/such/text.txt cannot be read (No such file"),
    ],
)
def test_bad_benchmark_and_general_text_flags_are_one_line_before_anything_loads(flags, said, capsys):
    from tunedeck.backend.cli import main

    assert main(["eval", "no-such-run", "--runs-dir", "/no/runs", *flags]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: {said}") and "\n" not in err


def test_a_general_text_file_that_is_not_text_names_the_flag_and_the_fix(tmp_path, capsys):
    from tunedeck.backend.cli import main

    (tmp_path / "empty.txt").write_text("  \n")
    (tmp_path / "binary.txt").write_bytes(b"\xff\xfe\x00\x81" * 64)
    for name, what in (("empty.txt", "holds no text"), ("binary.txt", "cannot be read")):
        assert main(["eval", "no-such-run", "--general-text", str(tmp_path / name)]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith(f"error: --general-text: {tmp_path / name} {what}") and "\n" not in err
        assert err.endswith(
            "give a plain-text (UTF-8) file of general prose, or leave the flag out for the built-in sample"
        )


def test_a_rise_in_general_text_loss_above_the_threshold_is_flagged_with_its_size(tmp_path):
    def measured(loss, source="built-in"):
        return {"general_text": {"loss": loss, "perplexity": 1.0, "tokens": 100, "source": source}}

    data = save_results(tmp_path, {"base": measured(3.10), "checkpoint-30": measured(3.15), "final": measured(3.52)})
    assert forgetting_lines(data["results"]) == [
        "checkpoint-30: general-text loss (3.10 → 3.15, +2%): no sign of forgetting (flagged above +5%)",
        "⚠ final: general-text loss rose 0.42 (3.10 → 3.52, +14%): the adapter forgot some general language",
    ]
    other = save_results(tmp_path, {"final": measured(9.0, source="/elsewhere.txt")})  # not comparable: no line
    assert forgetting_lines(other["results"]) == [
        "checkpoint-30: general-text loss (3.10 → 3.15, +2%): no sign of forgetting (flagged above +5%)"
    ]
