"""Fix it for me: choices that imply others (backend/spec/implied.py) and problems with one fix (Problem.fix)."""

from __future__ import annotations

import pytest

from tunedeck.backend.spec import JobSpec, flat_values, load_presets, set_paths
from tunedeck.backend.spec.implied import describe, implied
from tunedeck.backend.validate import validate


def _edit(spec: JobSpec, **changes) -> tuple[JobSpec, list]:
    """A person changes `changes` in the form; the form applies what they imply."""
    changes = {path.replace("__", "."): value for path, value in changes.items()}
    values = {**flat_values(spec), **changes}
    values, applied = implied(values, set(changes))
    return set_paths(JobSpec(), values), applied


def _fields(problems) -> set[str]:
    return {p.field for p in problems}


def test_choosing_qlora_sets_4bit_nf4_and_leaves_no_error():
    spec = load_presets()["7b-lora-ddp"].build()
    assert any(p.field == "quantization.bits" for p in validate(set_paths(spec, {"method": "qlora"})))  # by hand
    fixed, applied = _edit(spec, method="qlora")
    assert fixed.quantization.bits == 4 and fixed.quantization.bnb_4bit_quant_type == "nf4"
    assert not [p for p in validate(fixed) if p.level == "error"]
    assert "`quantization.bits` → `4`" in describe(applied)
    back, _ = _edit(fixed, method="lora")
    assert back.quantization.bits is None and not [p for p in validate(back) if p.level == "error"]


@pytest.mark.parametrize("kind", ["zero3", "fsdp"])
def test_sharded_qlora_makes_storage_compute_and_model_dtype_one(kind):
    spec = set_paths(load_presets()["7b-lora-ddp"].build(), {"model.dtype": "float16", "training.precision": "fp16"})
    fixed, applied = _edit(spec, method="qlora", strategy__kind=kind)
    q = fixed.quantization
    assert q.bnb_4bit_quant_storage == q.bnb_4bit_compute_dtype == fixed.model.dtype == "float16"
    assert not [p for p in validate(fixed) if p.level == "error"], validate(fixed)
    assert len(applied) == (3 if kind == "fsdp" else 2)  # FSDP also leaves RAM-efficient loading off


def test_fsdp_full_fine_tune_uses_fsdp_activation_checkpointing_and_back():
    spec = load_presets()["7b-full-zero2"].build()
    assert spec.training.gradient_checkpointing
    fixed, _ = _edit(spec, strategy__kind="fsdp")
    assert fixed.strategy.fsdp_activation_checkpointing and not fixed.training.gradient_checkpointing
    assert "strategy.fsdp_activation_checkpointing" not in _fields(validate(fixed))
    back, _ = _edit(fixed, strategy__kind="zero2")
    assert back.training.gradient_checkpointing and not back.strategy.fsdp_activation_checkpointing


def test_qlora_under_fsdp_leaves_ram_efficient_loading_off():
    spec = set_paths(load_presets()["7b-lora-ddp"].build(), {"method": "qlora", "quantization.bits": 4})
    assert spec.strategy.fsdp_cpu_ram_efficient_loading  # the default, for a 16-bit base
    assert "strategy.fsdp_cpu_ram_efficient_loading" in _fields(validate(set_paths(spec, {"strategy.kind": "fsdp"})))
    fixed, applied = _edit(spec, strategy__kind="fsdp")
    assert not fixed.strategy.fsdp_cpu_ram_efficient_loading
    assert "strategy.fsdp_cpu_ram_efficient_loading" not in _fields(validate(fixed))
    assert "load a 4-bit base on every rank" in describe(applied)
    lora = set_paths(load_presets()["7b-lora-ddp"].build(), {"strategy.kind": "fsdp"})
    assert _edit(lora, strategy__kind="fsdp")[0].strategy.fsdp_cpu_ram_efficient_loading  # 16 bits: kept


def test_ulysses_unpacks_the_rows_and_leaves_with_deepspeed_or_sft():
    spec = set_paths(load_presets()["7b-lora-ddp"].build(), {"strategy.kind": "zero3"})
    assert spec.dataset.packing
    fixed, applied = _edit(spec, strategy__sequence_parallel=2)
    assert fixed.strategy.sequence_parallel == 2 and not fixed.dataset.packing
    assert not [p for p in validate(fixed) if p.level == "error"], validate(fixed)
    assert (
        describe(applied)
        == "Set for you: under Ulysses, SDPA cannot keep packed rows apart: `dataset.packing` → `false`."
    )
    # flash attention keeps packed rows apart by their positions: packing stays
    flash = set_paths(spec, {"model.attn_implementation": "flash_attention_2"})
    assert _edit(flash, strategy__sequence_parallel=2)[0].dataset.packing
    for change in ({"strategy__kind": "fsdp"}, {"objective": "dpo"}):
        back, _ = _edit(fixed, **change)
        assert back.strategy.sequence_parallel == 1, change
        assert "strategy.sequence_parallel" not in _fields(validate(back))


def test_a_rule_fires_only_when_its_trigger_changed():
    spec, _ = _edit(load_presets()["7b-lora-ddp"].build(), method="qlora")
    values = {**flat_values(spec), "quantization.bits": 8}  # set by hand afterwards: kept, validation speaks
    assert implied(values, {"quantization.bits"}) == (values, [])


def _problems_with_fixes() -> list[tuple[JobSpec, str]]:
    demo = load_presets()["demo"].build()
    lora = load_presets()["7b-lora-ddp"].build()
    return [
        (set_paths(lora, {"method": "qlora"}), "quantization.bits"),
        (set_paths(demo, {"training.precision": "fp16"}), "training.precision"),
        (set_paths(lora, {"strategy.overlap_comm": False}), "strategy.overlap_comm"),  # ignored setting
        (set_paths(lora, {"training.ddp_find_unused_parameters": True}), "training.ddp_find_unused_parameters"),
        (
            set_paths(load_presets()["70b-qlora-fsdp"].build(), {"quantization.bnb_4bit_quant_storage": "uint8"}),
            "quantization.bnb_4bit_quant_storage",
        ),
    ]


@pytest.mark.parametrize("spec, field", _problems_with_fixes(), ids=lambda x: x if isinstance(x, str) else "")
def test_applying_a_fix_clears_its_problem(spec, field):
    problem = next(p for p in validate(spec) if p.field == field)
    assert problem.fix, problem
    assert (
        problem.fix_text() in problem.message
        or all(path in problem.message for path in problem.fix)
        or (problem.message.startswith("ignored"))
    )
    fixed = set_paths(spec, problem.fix)
    assert not [p for p in validate(fixed) if p.field == field and p.message == problem.message]


def test_every_fix_in_the_presets_variants_is_a_valid_spec_change():
    for spec, _ in _problems_with_fixes():
        for problem in validate(spec):
            if problem.fix:
                set_paths(spec, problem.fix)  # raises SpecError if a fix named a bad value


def test_a_problem_with_several_ways_out_has_no_fix():
    spec = set_paths(load_presets()["7b-lora-ddp"].build(), {"launch.num_processes": 3, "launch.num_machines": 2})
    problem = next(p for p in validate(spec) if p.field == "launch.num_processes")
    assert problem.fix is None
