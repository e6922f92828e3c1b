"""One applicability table: it hides a field in the form, warns when the field is set but ignored,
and decides whether training_args.yaml copies an SFTConfig argument."""

from __future__ import annotations

import pytest

from tunedeck.backend.recipe.objectives_table import OBJECTIVES
from tunedeck.backend.render.training_args import SFT_ARGUMENTS, training_args_dict
from tunedeck.backend.spec import flat_values, resolve_spec
from tunedeck.backend.spec.applies import applies
from tunedeck.backend.spec.fields import FORM_FIELDS, visible
from tunedeck.backend.validate import validate

from .conftest import PRESET_IDS

# (preset, overrides, the ignored field, words of the message: when it applies, what the job has, the fix)
IGNORED = [
    ("7b-lora-ddp", ["strategy.stage3_max_live_parameters=5"], "strategy.stage3_max_live_parameters",
     ["with strategy.kind=zero3", "this job has strategy.kind=ddp", "set it back to 1000000000"]),
    ("7b-lora-ddp", ["strategy.overlap_comm=false"], "strategy.overlap_comm",
     ["strategy.kind=zero1 or zero2 or zero3", "set it back to true"]),
    ("7b-lora-ddp", ["dataset.prompt_field=question"], "dataset.prompt_field",
     ["with dataset.format=prompt-completion", "this job has dataset.format=text", "set it back to prompt"]),
    ("7b-full-zero2", ["lora.r=64"], "lora.r", ["with method=lora or qlora", "this job has method=full"]),
    ("7b-lora-ddp", ["quantization.bnb_4bit_quant_storage=bfloat16"], "quantization.bnb_4bit_quant_storage",
     ["with quantization.bits=4", "quantization.bits=null"]),
    ("7b-lora-ddp", ["launch.main_process_ip=10.0.0.1"], "launch.main_process_ip",
     ["several machines", "launch.num_machines=1", "clear it"]),
    ("7b-lora-ddp", ["training.per_device_eval_batch_size=4"], "training.per_device_eval_batch_size",
     ["dataset.eval_split", "set it back to 1"]),
    ("70b-qlora-fsdp", ["strategy.kind=zero3", "strategy.fsdp_activation_checkpointing=false",
                        "training.gradient_checkpointing=true"], "strategy.fsdp_cpu_ram_efficient_loading",
     ["with strategy.kind=fsdp", "set it back to true"]),
]  # fmt: skip


@pytest.mark.parametrize("preset, overrides, field, words", IGNORED, ids=[",".join(c[1]) for c in IGNORED])
def test_a_setting_the_job_ignores_is_a_warning_that_says_when_it_applies(preset, overrides, field, words):
    spec = resolve_spec(preset, overrides)
    matching = [p for p in validate(spec) if p.field == field]
    assert [p.level for p in matching] == ["warning"], validate(spec)
    assert all(w in matching[0].message for w in words), matching[0].message
    values = flat_values(spec)
    assert not applies(field, values) and visible(field, values)  # shown in the form, with its warning


def test_an_ignored_field_at_its_default_is_neither_warned_about_nor_shown():
    spec = resolve_spec("7b-lora-ddp")
    values = flat_values(spec)
    hidden = [f.path for f in FORM_FIELDS if not visible(f.path, values)]
    assert "strategy.stage3_max_live_parameters" in hidden and "dataset.prompt_field" in hidden
    assert not [p for p in validate(spec) if p.field in hidden]


def test_a_rule_with_more_to_say_is_not_repeated():
    # fsdp_activation_checkpointing off FSDP has its own rule, which says what to use instead.
    problems = validate(resolve_spec("7b-full-zero2", ["strategy.fsdp_activation_checkpointing=true"]))
    about = [p for p in problems if p.field == "strategy.fsdp_activation_checkpointing"]
    assert len(about) == 1 and "training.gradient_checkpointing" in about[0].message


@pytest.mark.parametrize(
    "preset, overrides",
    [(p, []) for p in PRESET_IDS]
    + [
        ("7b-lora-ddp", ["dataset.eval_split=test", "training.per_device_eval_batch_size=4"]),
        ("7b-lora-ddp", ["dataset.format=alpaca"]),
        ("7b-lora-ddp", ["launch.use_cpu=true", "training.precision=fp32", "model.dtype=float32"]),
    ],
)
def test_sft_arguments_are_copied_by_name_exactly_where_they_apply(preset, overrides):
    spec = resolve_spec(preset, overrides)
    values, args = flat_values(spec), training_args_dict(spec)
    for path, name in SFT_ARGUMENTS.items():
        if applies(path, values):
            assert args[name] == values[path], path
        elif name in dict(OBJECTIVES[spec.objective].fixed):  # set by the objective itself (SimPO's loss_type)
            assert args[name] == dict(OBJECTIVES[spec.objective].fixed)[name], path
        elif not any(applies(other, values) for other, same in SFT_ARGUMENTS.items() if same == name):
            # (DPO's and GRPO's beta are one argument name, each where its objective applies)
            assert name not in args, f"{name} is written although {path} does not apply"


def test_every_training_field_that_trl_takes_is_declared_as_one():
    # TrainingSpec mirrors SFTConfig's names: a field of the same name that is not an SftField is a slip
    # (it would not reach training_args.yaml). Those below are derived or read by train_sft.py.
    derived = {
        "training.precision",
        "training.eval_steps",
        "training.resume_from_checkpoint",
        "training.group_by_length",
    }
    # training.health is the recipe's own section (its health guard), no SFTConfig argument
    training = {f.path for f in FORM_FIELDS if f.path.startswith("training.") and ".health." not in f.path}
    assert training - set(SFT_ARGUMENTS) == derived
