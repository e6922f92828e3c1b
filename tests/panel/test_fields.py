"""The form's field registry: derived from the spec, hides what does not apply."""

from __future__ import annotations

import pytest

from tunedeck.backend.spec import FIELD_PATHS, JobSpec, SpecError, load_presets, set_paths
from tunedeck.backend.spec.fields import (
    FIELDS_BY_PATH,
    FORM_FIELDS,
    applies,
    section_titles,
    spec_from_values,
    values_from_form,
    values_from_spec,
)


def visible(spec: JobSpec) -> set[str]:
    values = values_from_spec(spec)
    return {f.path for f in FORM_FIELDS if applies(f.path, values)}


def test_every_spec_field_is_in_the_form_with_its_description():
    assert [f.path for f in FORM_FIELDS] == FIELD_PATHS
    for field in FORM_FIELDS:
        assert field.help, f"{field.path} has no help text"
    assert section_titles() == [
        "Model",
        "Dataset",
        "LoRA/Quantization",
        "Strategy",
        "Training",
        "Rewards",
        "Hardware/Launch",
    ]


def test_widget_kinds_follow_the_field_types():
    assert FIELDS_BY_PATH["strategy.kind"].kind == "choice"
    assert FIELDS_BY_PATH["quantization.bits"].choices == (None, 4, 8)
    assert FIELDS_BY_PATH["training.gradient_checkpointing"].kind == "bool"
    assert FIELDS_BY_PATH["lora.r"].kind == "int"
    assert FIELDS_BY_PATH["training.learning_rate"].kind == "float"
    assert FIELDS_BY_PATH["strategy.reduce_bucket_size"].accepts_int


def test_an_optional_yes_or_no_can_stay_unset_in_the_form():
    """A checkbox cannot say "unset": launch.network_check (unset = on for several machines) was a checkbox, so every
    job from the page turned the network check off. It is a choice of (none), true and false."""
    from tunedeck.app.form import _component

    field = FIELDS_BY_PATH["launch.network_check"]
    widget = _component(field, field.to_form(None))
    assert type(widget).__name__ == "Dropdown" and widget.choices == [
        ("(none)", ""),
        ("true", "true"),
        ("false", "false"),
    ]
    assert [field.from_form(field.to_form(v)) for v in (None, True, False)] == [None, True, False]
    optional_bools = [f.path for f in FORM_FIELDS if f.kind == "bool" and f.optional]
    assert not optional_bools, optional_bools


@pytest.mark.parametrize("preset_id", sorted(load_presets()))
def test_form_round_trips_every_preset(preset_id):
    spec = load_presets()[preset_id].build()
    widgets = [f.to_form(v) for f, v in zip(FORM_FIELDS, values_from_spec(spec).values())]
    assert spec_from_values(values_from_form(widgets)) == spec


def test_hidden_fields_follow_the_job():
    ddp_lora = load_presets()["7b-lora-ddp"].build()
    shown = visible(ddp_lora)
    assert "lora.r" in shown and "training.ddp_find_unused_parameters" in shown
    assert not {"strategy.stage3_max_live_parameters", "strategy.fsdp_version", "strategy.overlap_comm"} & shown
    assert "quantization.bnb_4bit_quant_type" not in shown  # no 4-bit

    full_zero3 = set_paths(ddp_lora, {"method": "full", "strategy.kind": "zero3"})
    shown = visible(full_zero3)
    assert "lora.r" not in shown and "quantization.bits" not in shown
    assert {"strategy.stage3_max_live_parameters", "strategy.offload_params", "strategy.overlap_comm"} <= shown
    assert "strategy.allgather_bucket_size" not in shown and "strategy.nvme_path" not in shown

    nvme = set_paths(full_zero3, {"strategy.offload_optimizer": "nvme"})
    assert "strategy.nvme_path" in visible(nvme)

    qlora = load_presets()["70b-qlora-zero3"].build()
    assert "quantization.bnb_4bit_quant_storage" in visible(qlora)


def test_dataset_field_names_shown_for_the_chosen_format():
    spec = set_paths(JobSpec(), {"dataset.format": "alpaca"})
    shown = visible(spec)
    assert {"dataset.instruction_field", "dataset.input_field", "dataset.output_field"} <= shown
    assert "dataset.text_field" not in shown and "dataset.prompt_field" not in shown


def test_multi_machine_fields_only_with_several_machines():
    assert "launch.main_process_ip" not in visible(JobSpec())
    two = set_paths(JobSpec(), {"launch.num_machines": 2, "launch.num_processes": 16})
    assert {"launch.main_process_ip", "launch.machine_rank"} <= visible(two)


def test_bad_widget_values_name_the_field():
    values = values_from_spec(JobSpec())
    values["lora.r"] = 0
    values["training.learning_rate"] = FIELDS_BY_PATH["training.learning_rate"].from_form("fast")
    with pytest.raises(SpecError) as err:
        spec_from_values(values)
    assert {"lora.r", "training.learning_rate"} <= {p.field for p in err.value.problems}


def test_text_widgets_read_back_typed_values():
    assert FIELDS_BY_PATH["training.learning_rate"].from_form(" 2e-4 ") == 2e-4
    assert FIELDS_BY_PATH["strategy.reduce_bucket_size"].from_form("5_000_000") == 5_000_000
    assert FIELDS_BY_PATH["strategy.reduce_bucket_size"].from_form("auto") == "auto"
    assert FIELDS_BY_PATH["dataset.eval_split"].from_form("  ") is None
    assert FIELDS_BY_PATH["quantization.bits"].from_form("") is None
    assert FIELDS_BY_PATH["lora.target_modules"].to_form(["q_proj", "v_proj"]) == "q_proj, v_proj"
