"""The job spec: presets, YAML round trip, --set parsing, field registry, light imports."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import yaml

from tunedeck.backend.spec import (
    FIELD_PATHS,
    JobSpec,
    SpecError,
    field_info,
    load_presets,
    parse_assignments,
    resolve_spec,
    set_paths,
    spec_from_yaml,
    spec_to_yaml,
)

from .conftest import PRESET_IDS

REQUIRED_PATHS = [
    "model.name_or_path",
    "method",
    "lora.r",
    "lora.target_modules",
    "quantization.bits",
    "dataset.max_seq_length",
    "training.per_device_train_batch_size",
    "training.gradient_accumulation_steps",
    "training.gradient_checkpointing",
    "training.max_steps",
    "strategy.kind",
    "strategy.offload_optimizer",
    "strategy.offload_params",
    "launch.num_machines",
    "launch.num_processes",
]


@pytest.mark.parametrize("preset", PRESET_IDS)
def test_every_preset_round_trips_through_yaml(preset):
    spec = load_presets()[preset].build()
    text = spec_to_yaml(spec)
    again = spec_from_yaml(text)
    assert again == spec
    assert spec_to_yaml(again) == text


def test_presets_are_the_ones_promised():
    presets = load_presets()
    assert {"7b-lora-ddp", "70b-qlora-zero3", "7b-full-zero2", "13b-lora-fsdp", "70b-qlora-fsdp", "demo"} <= set(
        presets
    )
    assert presets["7b-lora-ddp"].title == "7B LoRA DDP"
    assert presets["70b-qlora-zero3"].title == "70B QLoRA ZeRO-3"
    for preset in presets.values():
        assert preset.description and "\n" not in preset.description


def test_named_presets_hold_the_promised_values():
    ddp = resolve_spec("7b-lora-ddp")
    assert (ddp.method, ddp.strategy.kind, ddp.launch.num_processes) == ("lora", "ddp", 4)
    assert (ddp.training.precision, ddp.training.ddp_find_unused_parameters) == ("bf16", False)
    z3 = resolve_spec("70b-qlora-zero3")
    q = z3.quantization
    assert (z3.method, z3.strategy.kind, z3.launch.num_processes) == ("qlora", "zero3", 8)
    assert (q.bits, q.bnb_4bit_quant_type, q.bnb_4bit_use_double_quant) == (4, "nf4", True)
    assert q.bnb_4bit_compute_dtype == "bfloat16" and q.bnb_4bit_quant_storage == "bfloat16"
    demo = resolve_spec("demo")
    assert (demo.launch.num_processes, demo.launch.use_cpu, demo.training.precision) == (2, True, "fp32")


def test_every_field_has_a_description_and_the_required_paths_exist():
    for path in FIELD_PATHS:
        assert field_info(path).description, path
    assert set(REQUIRED_PATHS) <= set(FIELD_PATHS)


def test_set_paths_reads_yaml_scalars():
    spec = set_paths(
        JobSpec(),
        parse_assignments(
            [
                "lora.r=8",
                "training.gradient_checkpointing=false",
                "quantization.bits=null",
                "lora.target_modules=q_proj, v_proj",
            ]
        ),
    )
    assert spec.lora.r == 8
    assert spec.training.gradient_checkpointing is False
    assert spec.quantization.bits is None
    assert spec.lora.target_modules == ["q_proj", "v_proj"]


def test_set_paths_keeps_text_fields_as_typed():
    # YAML would read these as numbers (0123456 even as octal) and the string fields would refuse them.
    spec = set_paths(
        JobSpec(),
        parse_assignments(
            ["model.revision=0123456", "dataset.split=2023", "output_dir=1e3", "dataset.eval_split=null"]
        ),
    )
    assert (spec.model.revision, spec.dataset.split, spec.output_dir) == ("0123456", "2023", "1e3")
    assert spec.dataset.eval_split is None
    assert spec_from_yaml(spec_to_yaml(spec)) == spec


def test_bad_values_raise_spec_errors_naming_the_field():
    with pytest.raises(SpecError) as err:
        set_paths(JobSpec(), {"lora.lora_dropout": "1.5", "launch.num_processes": "0"})
    fields = [p.field for p in err.value.problems]
    assert fields == ["lora.lora_dropout", "launch.num_processes"]
    # inf passes `gt=0`, then the Trainer's math.ceil(epochs x steps) raises OverflowError at launch.
    with pytest.raises(SpecError) as err:
        set_paths(
            JobSpec(),
            {"training.num_train_epochs": ".inf", "training.warmup_steps": ".inf", "training.max_grad_norm": ".nan"},
        )
    assert [p.field for p in err.value.problems] == [
        "training.num_train_epochs",
        "training.warmup_steps",
        "training.max_grad_norm",
    ]
    assert "finite number" in err.value.problems[0].message
    with pytest.raises(SpecError) as err:
        spec_from_yaml(yaml.safe_dump({"training": {"learning_rat": 0.1}}))
    assert err.value.problems[0].field == "training.learning_rat"


def test_panel_side_modules_import_no_heavy_library():
    """Fresh interpreter: import the panel-side modules, render and validate, then look at sys.modules."""
    code = """
import json, sys
import tunedeck.backend.spec, tunedeck.backend.validate, tunedeck.backend.render, tunedeck.backend.spec.catalog, tunedeck.backend.cli, tunedeck.backend.cli.spec, tunedeck.backend.render.bundle_check
from tunedeck.backend.cli import build_parser
from tunedeck.backend.spec import resolve_spec
build_parser()
for preset in ("70b-qlora-zero3", "13b-lora-fsdp", "demo"):
    spec = resolve_spec(preset)
    tunedeck.backend.validate.validate(spec)
    tunedeck.backend.render.zip_bundle(tunedeck.backend.render.render_bundle(spec))
heavy = ("torch", "transformers", "trl", "peft", "deepspeed", "bitsandbytes", "accelerate")
print(json.dumps(sorted(m for m in sys.modules if m.split(".")[0] in heavy)))
"""
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert json.loads(result.stdout) == []
