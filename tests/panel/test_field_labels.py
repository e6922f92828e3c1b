"""Every spec field has a human label and a one-line help, kept with the field; Basic or Advanced."""

from __future__ import annotations

from tunedeck.backend.spec import JobSpec, flat_values, resolve_spec
from tunedeck.backend.spec.applies import applies
from tunedeck.backend.spec.fields import FORM_FIELDS, build_fields, section_titles
from tunedeck.backend.spec.presets import load_presets

LONGEST_LABEL = 32  # characters: a label reads at a glance; details go in the help


def test_every_field_has_a_label_and_a_one_line_help():
    unlabelled = [f.path for f in FORM_FIELDS if not f.label.strip()]
    assert not unlabelled, (
        f"fields without a label: {', '.join(unlabelled)}. Give each a human label next to it in the spec: "
        'Field(..., title="Learning rate", description="one line of help")'
    )
    for field in FORM_FIELDS:
        assert field.help.strip(), f"{field.path} has no help: give its Field a description="
        assert "\n" not in field.help, f"{field.path}: the help is one line"
        assert len(field.label) <= LONGEST_LABEL, f"{field.path}: label {field.label!r} is long; move detail to help"
        assert field.label != field.key, f"{field.path}: the label repeats the raw key; write it for a person"


def test_labels_are_distinct_within_a_section():
    for title in section_titles():
        labels = [f.label for f in FORM_FIELDS if f.section == title]
        assert len(labels) == len(set(labels)), (title, sorted(labels))


def test_each_section_has_basic_fields_and_the_knobs_fold_into_advanced():
    for title in section_titles():
        section = [f for f in FORM_FIELDS if f.section == title]
        assert any(f.basic for f in section), f"section {title} shows nothing before Advanced"
    basic = {f.path for f in FORM_FIELDS if f.basic}
    assert {"model.name_or_path", "method", "training.learning_rate", "strategy.kind", "launch.num_processes"} <= basic
    assert not {"strategy.stage3_max_reuse_distance", "training.seed", "model.trust_remote_code"} & basic
    for preset in sorted(load_presets()):  # what a job's form shows: the fields that apply to it (DPO's or GRPO's own)
        values = flat_values(resolve_spec(preset))
        training = [f for f in FORM_FIELDS if f.section == "Training" and f.basic and applies(f.path, values)]
        assert len(training) <= 9, f"the Training section's first view stays short ({preset})"


def test_a_new_field_without_a_label_is_named_by_the_check():
    from pydantic import Field, create_model

    extended = create_model(
        "Extended", __base__=JobSpec, liger_kernel=(bool, Field(False, description="Fused kernels."))
    )
    field = next(f for f in build_fields(extended) if f.path == "liger_kernel")
    assert field.label == "" and field.basic is False  # unlabelled, and Advanced until marked basic


def test_the_json_schema_carries_the_labels():
    schema = JobSpec.model_json_schema()
    assert schema["$defs"]["TrainingSpec"]["properties"]["learning_rate"]["title"] == "Learning rate"
    assert schema["$defs"]["TrainingSpec"]["properties"]["learning_rate"]["basic"] is True
