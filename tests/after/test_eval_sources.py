"""Evaluate on a dataset.mix run's held-out rows: each source's rows of the eval split, scored alone as well."""

from __future__ import annotations

import pytest

from tunedeck.app.eval_display import evaluation
from tunedeck.backend.after.eval_results import table_rows
from tunedeck.backend.after.evaluate import evaluate_run
from tunedeck.backend.after.scoring import SOURCE_KEY, eval_rows
from tunedeck.backend.spec import resolve_spec
from tunedeck.tests.runs.helpers import split_demo_files

pytestmark = pytest.mark.timeout(300)


@pytest.fixture
def mixed_job(demo_home, tmp_path):
    """Additions as the job's data, subtractions mixed in; both keep their last 10% out of training."""
    paths = split_demo_files(demo_home, tmp_path)
    mixed = f"{paths[1]}:train[:90%]#300"
    sets = [f"dataset.path={paths[0]}", f"dataset.mix={mixed}", "dataset.split=train[:90%]",
            "dataset.eval_split=train[90%:]", "dataset.packing=false"]  # fmt: skip
    return resolve_spec("demo", sets), mixed


def test_the_held_out_rows_of_a_mixed_run_carry_their_source(mixed_job, tmp_path):
    job, mixed = mixed_job
    rows, source = eval_rows(tmp_path, job, limit=5)
    assert [row[SOURCE_KEY] for row in rows] == ["dataset.path"] * 5 + [mixed] * 5
    assert all(row["prompt"].startswith("Q: Subtract") for row in rows[5:])
    assert source.endswith(f" + {mixed} [train[90%:]]")
    plain = job.model_copy(update={"dataset": job.dataset.model_copy(update={"mix": []})})
    assert all(SOURCE_KEY not in row for row in eval_rows(tmp_path, plain, limit=5)[0])
    # A source that trains on all of its split holds the held-out slice: its rows would be training rows.
    whole = mixed.replace(":train[:90%]", "")
    leaky = job.model_copy(update={"dataset": job.dataset.model_copy(update={"mix": [whole]})})
    rows, source = eval_rows(tmp_path, leaky, limit=5)
    assert [row[SOURCE_KEY] for row in rows] == ["dataset.path"] * 5 and whole not in source


@pytest.mark.slow  # loads the demo model and generates answers: about 10 s of CPU
def test_evaluate_reports_each_sources_loss_and_scores(mixed_job, tmp_path):
    job, mixed = mixed_job
    got = evaluate_run(tmp_path, job, ["base"], "cpu", limit=4)["results"]["base"]
    sources = got["by_source"]
    assert list(sources) == ["dataset.path", mixed]
    assert [s["examples"] for s in sources.values()] == [4, 4] and got["examples"] == 8
    assert sum(s["tokens"] for s in sources.values()) == got["tokens"]
    weighted = sum(s["loss"] * s["tokens"] for s in sources.values()) / got["tokens"]  # the loss is per token
    assert weighted == pytest.approx(got["loss"], rel=1e-9)
    for name, scores in sources.items():
        said = got["answers"][:4] if name == "dataset.path" else got["answers"][4:]
        assert scores["exact_match"] == sum(a["exact_match"] for a in said) / 4
    shown = [row[0] for row in table_rows({"results": {"base": got}})]
    assert shown == ["base", "base · dataset.path", "base · subtract.jsonl:train[:90%]#300"]
    table = evaluation({"results": {"base": got}})["after.eval_table"]["data"]
    assert table[2][-1] == "subtract.jsonl:train[:90%]#300" and table[2][1] == round(sources[mixed]["loss"], 4)
