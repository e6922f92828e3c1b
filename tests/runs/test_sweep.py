"""`tunedeck sweep`: one run per combination of --vary values, queued one after another, then a table."""

from __future__ import annotations

import re

import pytest

from tunedeck.backend.runs.manager import RunManager
from tunedeck.backend.runs.notes import read_notes
from tunedeck.backend.runs.sweep import MAX_RUNS, SweepError, combinations, label, preview

from .helpers import end_record, start_record, tunedeck


def test_every_combination_in_order_named_by_its_values():
    assert combinations(["lora.target_modules=[q_proj, v_proj],all-linear"]) == [
        {"lora.target_modules": "[q_proj, v_proj]"},
        {"lora.target_modules": "all-linear"},
    ]  # a [list] is one value
    grid = combinations(["training.learning_rate=1e-4, 2e-4", "lora.r=8,16,8"])
    assert grid == [
        {"training.learning_rate": "1e-4", "lora.r": "8"},
        {"training.learning_rate": "1e-4", "lora.r": "16"},
        {"training.learning_rate": "2e-4", "lora.r": "8"},
        {"training.learning_rate": "2e-4", "lora.r": "16"},
    ]  # the first --vary changes slowest; a value given twice is one run
    assert label(grid[1]) == "learning_rate=1e-4 · r=16"
    assert preview(grid, shown=2) == (
        "4 runs, queued one after another: learning_rate=1e-4 · r=8, learning_rate=1e-4 · r=16, and 2 more"
    )


@pytest.mark.parametrize(
    ("vary", "message"),
    [
        (["training.learning_rate"], "vary 'training.learning_rate': write PATH=V1,V2"),
        (["lora.r=8", "lora.r=16"], "vary lora.r: given twice; list all its values at once"),
        (
            ["a=" + ",".join(map(str, range(9))), "b=" + ",".join(map(str, range(8)))],
            f"72 combinations, at most {MAX_RUNS}",
        ),
    ],
)
def test_a_vary_that_cannot_be_swept_says_how_to_write_it(vary, message):
    with pytest.raises(SweepError, match=re.escape(message)):
        combinations(vary)


def test_one_bad_value_queues_nothing(runs_dir, demo_home):
    done = tunedeck("sweep", "demo", "--vary", "training.learning_rate=1e-4,fast", "--runs-dir", runs_dir)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "error: training.learning_rate: [learning_rate=fast] " in done.stderr
    assert done.stderr.rstrip().endswith("nothing queued: fix the errors above")
    assert RunManager(runs_dir).list_runs() == []


@pytest.mark.integration
@pytest.mark.timeout(600)
def test_a_sweep_trains_each_value_one_after_another_and_tables_them(runs_dir, demo_home):
    done = tunedeck(
        "sweep", "demo", "--set", "training.max_steps=4", "--vary", "training.learning_rate=1e-3,3e-3",
        "--runs-dir", runs_dir, timeout=500,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    manager = RunManager(runs_dir)
    named = {read_notes(runs_dir / run.run_id).name: run.run_id for run in manager.list_runs()}
    first, second = named.pop("learning_rate=1e-3"), named.pop("learning_rate=3e-3")
    assert named == {}
    assert f"  {second}  learning_rate=3e-3" in done.stdout.splitlines()
    # One after another: the second started training once the first had ended.
    assert start_record(runs_dir / second)["time"] >= manager.status(first).ended_at
    assert end_record(runs_dir / second)["status"] == "finished"
    table = done.stdout.splitlines()[-3:]
    assert table[0].split() == [
        "RUN",
        "training.learning_rate",
        "STATE",
        "STEPS",
        "LOSS",
        "BEST",
        "EVAL",
        "LOSS",
        "TIME",
    ]
    assert [row.split()[:4] for row in table[1:]] == [
        [first, "1e-3", "finished", "4/4"],
        [second, "3e-3", "finished", "4/4"],
    ]
