"""One Objective table (backend/recipe/objectives_table.py): every layer that reads an objective agrees with its row.

Without training: the spec's choices and description, the formats rule and its fixes, which knobs apply,
training_args.yaml's fixed arguments, the bundle README, the speed and memory passes, the record keys, the
Run tab's charts and the facts line. tests/spine/test_library_checks.py asks TRL for each row's classes.
"""

from __future__ import annotations

import typing
from fnmatch import fnmatchcase

import pytest

from tunedeck.app.charts import GRPO_PANELS, PREFERENCE_PANELS, chart_family, second_row
from tunedeck.backend.estimate import speed
from tunedeck.backend.estimate.memory import estimate
from tunedeck.backend.estimate.memory_job import Job, input_values
from tunedeck.backend.recipe.objectives_table import OBJECTIVES, REFERENCE_OBJECTIVES, knob_readers
from tunedeck.backend.recipe.vocabulary import DATASET_FORMATS
from tunedeck.backend.render import render_bundle
from tunedeck.backend.render.training_args import training_args_dict
from tunedeck.backend.runs.records import LogRecord
from tunedeck.backend.runs.summary import facts_line
from tunedeck.backend.spec import FIELD_PATHS, JobSpec, flat_values, flops, resolve_spec, set_paths
from tunedeck.backend.spec.applies import applies
from tunedeck.backend.validate import validate

ROWS = list(OBJECTIVES.values())


def job(objective: str, fmt: str | None = None, **changes) -> JobSpec:
    """The 7B LoRA preset with this objective on its first format (or `fmt`), KTO's batch of two."""
    o = OBJECTIVES[objective]
    values = {"objective": objective, "dataset.format": fmt or o.formats[0], "training.per_device_train_batch_size": 2}
    return set_paths(resolve_spec("7b-lora-ddp"), {**values, **changes})


def test_the_spec_offers_each_row_and_describes_it():
    assert typing.get_args(JobSpec.model_fields["objective"].annotation) == tuple(OBJECTIVES)
    described = JobSpec.model_fields["objective"].description
    assert all(f"{o.name} ({o.learns}" in described for o in ROWS)
    readers = [o.name for o in ROWS if o.section == "preference"]
    assert all(name in JobSpec.model_fields["preference"].description for name in readers)


def test_every_format_is_read_by_some_objective_and_every_row_reads_known_formats():
    read = {fmt for o in ROWS for fmt in o.formats}
    assert read == set(DATASET_FORMATS)


@pytest.mark.parametrize("objective", OBJECTIVES)
def test_the_formats_rule_accepts_the_rows_formats_and_fixes_every_other(objective):
    for fmt in DATASET_FORMATS:
        spec = job(objective, fmt)
        problems = [p for p in validate(spec) if p.field in ("objective", "dataset.format") and p.level == "error"]
        if fmt in OBJECTIVES[objective].formats:
            assert not problems, [p.message for p in problems]
            continue
        (problem,) = problems
        fixed = set_paths(spec, problem.fix)
        assert fixed.dataset.format in OBJECTIVES[fixed.objective].formats, (objective, fmt, problem.fix)


def test_each_knob_applies_exactly_with_the_objectives_that_read_it():
    readers = knob_readers()  # the first knob that matches a field decides, as in applies.py
    sections = {o.section for o in ROWS if o.section}
    values = {o.name: flat_values(job(o.name)) for o in ROWS}
    for path in [p for p in FIELD_PATHS if p.split(".")[0] in sections]:
        names = next(names for knob, names in readers.items() if fnmatchcase(path, knob))
        for o in ROWS:
            assert applies(path, values[o.name]) == (o.name in names), (path, o.name)


@pytest.mark.parametrize("objective", OBJECTIVES)
def test_training_args_carry_the_rows_fixed_arguments_and_the_readme_its_trainer(objective):
    spec = job(objective)
    args = training_args_dict(spec)
    assert all(args[name] == value for name, value in OBJECTIVES[objective].fixed)
    readme = render_bundle(spec)["README.md"]
    assert OBJECTIVES[objective].trainer in readme and OBJECTIVES[objective].config in readme


def test_the_speed_and_memory_passes_are_the_rows():
    assert tuple(o.name for o in ROWS if o.reference_passes) == REFERENCE_OBJECTIVES
    for o in ROWS:
        assert flops.extra_forwards(o.name) == o.reference_passes + o.own_passes
        assert flops.extra_forwards(o.name, precomputed=True) == o.own_passes
        assert flops.sequences_per_row(o.name) == o.sequences_per_row


def test_a_full_fine_tune_holds_a_reference_copy_and_runs_its_passes_only_where_the_row_has_one():
    def compute_s(spec) -> float:
        job = Job.from_values(input_values(spec))
        return speed.predict(job, speed.Hardware.named("H100"), speed.schedule_of(spec, 10_000)).parts["compute"]

    dpo = job("dpo", **{"method": "full", "strategy.kind": "zero2"})
    for o in ROWS:
        if o.section != "preference":
            continue
        full = job(o.name, **{"method": "full", "strategy.kind": "zero2"})
        assert (estimate(full).breakdown["reference"] > 13) == o.needs_reference, o.name  # GiB: a 16-bit 7B copy
        if o.sequences_per_row == 2:  # pairs, as DPO's: a token's forward, backward and recomputation (4) + passes
            passes = o.reference_passes + o.own_passes
            assert compute_s(full) / compute_s(dpo) == pytest.approx((4 + passes) / 5, abs=0.02), o.name


def test_each_rows_record_keys_are_log_record_fields_and_draw_its_chart_family():
    fields = set(LogRecord.__annotations__)
    families = {**PREFERENCE_PANELS, "answers": GRPO_PANELS}
    for o in ROWS:
        assert set(o.record_keys) <= fields, o.name
        if o.chart is None:
            assert not o.logs
            continue
        assert chart_family(set(o.record_keys)) == o.chart, o.name
        assert chart_family({key for key in o.record_keys if key.startswith("eval_")}) == o.chart, o.name
        drawn = {key for keys, _ in second_row(set(o.record_keys)) for key in keys}
        assert drawn and drawn <= set(o.record_keys), o.name
        assert o.chart in families


def test_the_facts_line_names_each_objective_and_its_reference():
    for o in ROWS:
        line = facts_line({"world_size": 2, "objective": o.name, "reference": "adapters off", "method": "lora"})
        if o.name == "sft":
            assert "SFT" not in line
        elif o.name != "grpo":
            assert o.title in line and (("reference: adapters off" in line) == o.needs_reference), line


def test_the_recipe_records_each_rows_keys_and_trains_with_its_classes():
    from tunedeck.backend.recipe.objectives import objective_classes, objective_record

    for o in ROWS:
        logged = dict.fromkeys(o.record_keys.values(), 1.0) | {"rewards/other": 2.0}
        assert objective_record(o.name, logged) == dict.fromkeys(o.record_keys, 1.0), o.name
        config, trainer = objective_classes({"objective": o.name})  # imported from the row's TRL module
        assert (config.__name__, trainer.__name__) == (o.config, o.trainer)
        assert trainer.__module__.startswith(o.trl_module), (trainer.__module__, o.trl_module)
