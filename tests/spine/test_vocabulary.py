"""One vocabulary: the strategy and dataset-format tables (backend/recipe/vocabulary.py, which the recipe reads in
every run and tunedeck imports). The spec's choices, the dataset's column fields, the gate's engines, the demo's
data and what TRL gets all come from the tables.
"""

from __future__ import annotations

import random
import typing

import pytest
import yaml

from tunedeck.backend import recipe
from tunedeck.backend.data.demo import RECIPE_PATH, as_format, make_examples
from tunedeck.backend.recipe.vocabulary import DATASET_FORMATS, STRATEGIES, column_fields
from tunedeck.backend.render import render_bundle
from tunedeck.backend.spec import DatasetSpec, resolve_spec
from tunedeck.backend.spec.fields import FIELDS_BY_PATH


@pytest.mark.parametrize("kind", STRATEGIES)
def test_the_gate_expects_the_tables_engine(kind):
    job = {"strategy": {"kind": kind}, "launch": {"num_processes": 2}}
    expected = recipe.expected_run(job)
    assert (expected["engine"], expected["zero_stage"]) == (STRATEGIES[kind].engine, STRATEGIES[kind].zero_stage)


def test_the_gate_names_a_strategy_the_table_does_not_have():
    with pytest.raises(recipe.JobError, match="strategy.kind: 'zero4' is not one of ddp"):
        recipe.expected_run({"strategy": {"kind": "zero4"}})


def test_the_words_say_every_kind_of_column():
    assert {c.kind for fmt in DATASET_FORMATS.values() for c in fmt.columns} <= set(recipe.KIND_NEEDS)


def test_the_spec_offers_the_tables_choices_and_columns():
    assert FIELDS_BY_PATH["strategy.kind"].choices == tuple(STRATEGIES)
    assert FIELDS_BY_PATH["dataset.format"].choices == tuple(DATASET_FORMATS)
    columns = {name: info.default for name, info in DatasetSpec.model_fields.items() if name.endswith("_field")}
    assert columns == {name: column.default for name, (column, _) in column_fields().items()}
    assert typing.get_args(DatasetSpec.model_fields["format"].annotation) == tuple(DATASET_FORMATS)


@pytest.mark.parametrize("kind", STRATEGIES)
def test_accelerate_gets_the_tables_distributed_type(kind):
    spec = resolve_spec("7b-full-zero2", [f"strategy.kind={kind}"])
    files = render_bundle(spec)
    assert yaml.safe_load(files["accelerate_config.yaml"])["distributed_type"] == STRATEGIES[kind].distributed_type
    assert ("ds_config.json" in files) is STRATEGIES[kind].is_deepspeed
    assert f"- Strategy: {STRATEGIES[kind].title}" in files["README.md"]


@pytest.mark.parametrize("name", DATASET_FORMATS)
def test_each_format_reaches_trl_as_the_table_says(name):
    # The demo writes the format under its default columns; train_sft.py turns it into what SFTTrainer reads.
    from datasets import Dataset

    demo_recipe = yaml.safe_load(RECIPE_PATH.read_text(encoding="utf-8"))["data"]
    rows = [as_format(example, name) for example in make_examples(random.Random(0), 4, demo_recipe)]
    fmt = DATASET_FORMATS[name]
    assert set(rows[0]) == {c.default for c in fmt.columns}
    converted = recipe.to_trl_format(Dataset.from_list(rows), {"format": name}, "text")
    assert tuple(converted.column_names) == fmt.trl_columns
