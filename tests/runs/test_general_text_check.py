"""The general-text check while training (dataset.general_text, backend/recipe/general_text.py), without a run: where
it applies, what the bundle carries and runs, what is refused before launch, and how a run's records read.

A real run's check (2 ranks on ZeRO-3, a chat dataset) is in test_training_runs.py.
"""

from __future__ import annotations

import json

import pytest
import yaml

from tunedeck.app.charts import loss_figure
from tunedeck.backend.recipe.general_text import general_text_set
from tunedeck.backend.render import render_bundle
from tunedeck.backend.render.bundle_data import bundle_files
from tunedeck.backend.runs.preflight import preflight
from tunedeck.backend.runs.records import RunRecords
from tunedeck.backend.runs.summary import report
from tunedeck.backend.spec import GENERAL_TEXT_SAMPLE
from tunedeck.backend.validate import validate

EVALUATED = {"dataset.eval_split": "train[:16]", "dataset.general_text": "built-in"}


def test_it_applies_to_sft_with_an_evaluation_split_and_is_said_to_be_ignored_elsewhere(demo_spec):
    assert validate(demo_spec(EVALUATED)) == []
    for without, has in (
        ({"dataset.eval_split": None}, "dataset.eval_split=null"),
        ({"objective": "dpo"}, "objective=dpo"),
    ):
        (problem,) = [p for p in validate(demo_spec({**EVALUATED, **without})) if p.field == "dataset.general_text"]
        assert problem.level == "warning" and problem.message.startswith(
            "ignored: it applies only with objective=sft, an evaluation split (dataset.eval_split) and "
            f"strategy.sequence_parallel=1, and this job has {'objective=sft, ' if 'objective' not in has else ''}"
        ), problem.message
        assert has in problem.message and problem.message.endswith(": clear it.")
    assert demo_spec({**EVALUATED, "dataset.general_text": "  "}).dataset.general_text is None  # a cleared box


def test_the_bundle_carries_the_built_in_sample_and_evaluates_before_the_first_step(demo_spec):
    files = render_bundle(demo_spec(EVALUATED))
    assert files["general-text.txt"] == GENERAL_TEXT_SAMPLE.read_text(encoding="utf-8")
    args = yaml.safe_load(files["training_args.yaml"])
    assert args["eval_strategy"] == "steps" and args["eval_on_start"] is True  # the model as it started, measured
    assert "- `general-text.txt`: the general prose whose loss each evaluation measures too" in files["README.md"]
    plain = render_bundle(demo_spec({"dataset.eval_split": "train[:16]"}))
    assert "general-text.txt" not in plain and "eval_on_start" not in yaml.safe_load(plain["training_args.yaml"])
    ignored = render_bundle(demo_spec({"dataset.general_text": "built-in"}))  # no evaluation: nothing measures it
    assert "eval_on_start" not in yaml.safe_load(ignored["training_args.yaml"])


def test_your_own_file_rides_in_the_bundle_and_a_missing_one_is_named_before_launch(demo_spec, tmp_path, runs_dir):
    prose = tmp_path / "my prose.txt"
    prose.write_text("Plain sentences about everyday things, as a general reader meets them.\n")
    spec = demo_spec({**EVALUATED, "dataset.general_text": str(prose)})
    files, plan = bundle_files(spec)
    assert yaml.safe_load(files["job.yaml"])["dataset"]["general_text"] == "./data/my_prose.txt"
    assert plan.files["data/my_prose.txt"] == prose
    assert preflight(spec, runs_dir) == []

    gone = tmp_path / "gone.txt"
    (problem,) = preflight(demo_spec({**EVALUATED, "dataset.general_text": str(gone)}), runs_dir)
    assert (problem.level, problem.field) == ("error", "dataset.general_text")
    assert problem.message == (
        f"{gone} does not exist: give a plain-text (UTF-8) file of general prose, or built-in for the sample tunedeck "
        "ships"
    )
    binary = tmp_path / "weights.bin"
    binary.write_bytes(b"\xff\xfe\x00\x81" * 8)
    (problem,) = preflight(demo_spec({**EVALUATED, "dataset.general_text": str(binary)}), runs_dir)
    assert problem.message.startswith(f"{binary} cannot be read (not UTF-8 text): ")
    empty = tmp_path / "empty.txt"
    empty.write_text(" \n")
    (problem,) = preflight(demo_spec({**EVALUATED, "dataset.general_text": str(empty)}), runs_dir)
    assert problem.message.startswith(f"{empty} holds no text: ")


def test_the_sample_is_cut_into_blocks_of_the_jobs_sequence_length_each_after_the_bos(demo_spec, demo_home, tmp_path):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(demo_home / "model")
    job = json.loads(demo_spec(EVALUATED).model_dump_json())
    (tmp_path / "general-text.txt").write_text(GENERAL_TEXT_SAMPLE.read_text(encoding="utf-8"))
    blocks = general_text_set(job, tokenizer, tmp_path)["input_ids"]
    length = job["dataset"]["max_seq_length"]
    assert len(blocks) > 10 and all(b[0] == tokenizer.bos_token_id for b in blocks)
    assert {len(b) for b in blocks[:-1]} == {length} and 1 < len(blocks[-1]) <= length
    assert general_text_set({**job, "objective": "kto"}, tokenizer, tmp_path) is None  # where it does not apply


def records(*general: float) -> RunRecords:
    """A run's records: its training losses and, at steps 0, 10, 20 ..., evaluations with these general-text losses."""
    logs = [{"event": "log", "step": s, "loss": 2.0 - s / 100} for s in range(1, 10 * len(general))]
    logs += [
        {"event": "log", "step": 10 * i, "eval_loss": 1.9, "eval_general_text_loss": loss}
        for i, loss in enumerate(general)
    ]
    return RunRecords(start={"event": "start", "world_size": 2}, records=sorted(logs, key=lambda r: r["step"]))


@pytest.mark.parametrize(
    "general, said",
    [
        ((3.10, 3.30, 3.52), "⚠ general text 3.100 → 3.520 (+14%): forgetting general language"),
        ((3.10, 3.12, 3.20), "general text 3.100 → 3.200 (+3%)"),
        ((3.10,), None),  # measured once, before the first step: nothing to compare yet
    ],
)
def test_the_summary_compares_the_last_general_text_loss_with_the_one_before_the_first_step(general, said):
    line = report(records(*general), 0.0, 1.0).line()
    if said is None:
        assert "general text" not in line, line
    else:
        assert line.endswith(f"eval loss 1.9000 · {said}"), line  # after the eval loss it is compared beside


def test_the_loss_chart_draws_the_general_text_loss_beside_the_eval_loss():
    figure = loss_figure([("this run", records(3.10, 3.30, 3.52).records)])
    (general,) = [trace for trace in figure.data if trace.name == "this run general-text loss"]
    assert list(general.x) == [0, 10, 20] and list(general.y) == [3.10, 3.30, 3.52]
    assert {"this run eval loss", "this run loss"} <= {trace.name for trace in figure.data}


def test_a_slurm_jobs_file_that_is_not_here_is_a_warning_for_its_nodes(demo_spec, runs_dir):
    spec = demo_spec({**EVALUATED, "launch.backend": "slurm", "dataset.general_text": "/cluster/prose/general.txt"})
    (problem,) = [p for p in preflight(spec, runs_dir) if p.field == "dataset.general_text"]
    assert problem.level == "warning" and problem.message == (
        "/cluster/prose/general.txt does not exist on this machine; it must exist on the cluster's nodes "
        "(the same path on each, or storage they share)"
    )
