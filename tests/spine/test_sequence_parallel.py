"""Sequence parallelism (strategy.sequence_parallel, DeepSpeed Ulysses): its rules, its files, its batch arithmetic.

The run itself (2 CPU ranks sharing each sequence, the same losses as one process) is in
tests/runs/test_sequence_parallel.py.
"""

from __future__ import annotations

import pytest

from tunedeck.backend.render.accelerate_yaml import accelerate_config_dict
from tunedeck.backend.render.bundle_readme import render_bundle_readme
from tunedeck.backend.render.training_args import training_args_dict
from tunedeck.backend.spec import flat_values, resolve_spec
from tunedeck.backend.spec.applies import applies
from tunedeck.backend.validate import describe_global_batch, has_errors, validate

ULYSSES = ["strategy.kind=zero3", "strategy.sequence_parallel=2", "dataset.packing=false"]


def problems(preset: str, *changes: str) -> list[tuple[str, str, str, dict | None]]:
    """(field, level, message, fix) of each of the job's problems."""
    return [(p.field, p.level, p.message, p.fix) for p in validate(resolve_spec(preset, list(changes)))]


def problem(preset: str, *changes: str, field: str, words: str) -> tuple[str, str, dict | None]:
    """(level, message, fix) of the one problem on `field` that says `words`."""
    (found,) = [(lvl, msg, fix) for f, lvl, msg, fix in problems(preset, *changes) if f == field and words in msg]
    return found


def test_a_sound_ulysses_job_has_no_problem_and_divides_the_global_batch():
    spec = resolve_spec("7b-lora-ddp", ULYSSES)  # 4 processes: 2 groups of 2 GPUs per sequence
    assert not has_errors(validate(spec)), validate(spec)
    plain = resolve_spec("7b-lora-ddp", ["strategy.kind=zero3", "dataset.packing=false"])
    assert spec.global_batch_size * 2 == plain.global_batch_size
    assert spec.data_parallel_size == 2 and spec.sequence_parallel == 2
    t = spec.training
    assert describe_global_batch(spec) == (
        f"global batch {spec.global_batch_size} = {t.per_device_train_batch_size} per device x 2 sequence groups "
        f"(4 processes, 2 GPUs per sequence) x {t.gradient_accumulation_steps} accumulation steps"
    )


def test_the_field_shows_only_under_deepspeed():
    for kind, shown in [("ddp", False), ("fsdp", False), ("zero1", True), ("zero2", True), ("zero3", True)]:
        values = flat_values(resolve_spec("7b-lora-ddp", [f"strategy.kind={kind}"]))
        assert applies("strategy.sequence_parallel", values) is shown, kind


@pytest.mark.parametrize(
    "changes, field, level, words, fix",
    [
        # FSDP has no Ulysses: refused, not silently ignored (the rows would not fit)
        (["strategy.kind=fsdp", "strategy.sequence_parallel=2"], "strategy.sequence_parallel", "error",
         "FSDP cannot split a sequence: set strategy.kind=zero3", None),
        ([*ULYSSES, "strategy.sequence_parallel=3"], "strategy.sequence_parallel", "error",
         "4 processes do not split into groups of 3 GPUs per sequence: set strategy.sequence_parallel to a divisor "
         "of 4 (2, 4)", None),
        # Qwen2.5-7B has 28 attention heads: 8 GPUs cannot share them
        ([*ULYSSES, "launch.num_processes=8", "strategy.sequence_parallel=8"], "strategy.sequence_parallel",
         "error", "the model's 28 attention heads do not split over 8 GPUs: set strategy.sequence_parallel to a "
         "divisor of 28 (2, 4).", None),
        (["strategy.kind=zero3", "strategy.sequence_parallel=2"], "dataset.packing", "error",
         "packed rows under sequence parallelism with SDPA attend to each other", {"dataset.packing": False}),
        ([*ULYSSES, "model.attn_implementation=eager"], "model.attn_implementation", "error",
         "eager attention cannot run under sequence parallelism", {"model.attn_implementation": "sdpa"}),
        ([*ULYSSES, "launch.num_machines=2", "launch.num_processes=6", "launch.main_process_ip=10.0.0.1"],
         "strategy.sequence_parallel", "warning", "groups of 2 GPUs per sequence span machines (3 per machine)",
         None),
        ([*ULYSSES, "dataset.eval_split=test"], "dataset.eval_split", "warning",
         "evaluation runs without sequence parallelism", None),
    ],
)  # fmt: skip
def test_each_problem_names_its_field_and_fix(changes, field, level, words, fix):
    assert problem("7b-lora-ddp", *changes, field=field, words=words)[::2] == (level, fix)


def test_only_sft_splits_sequences():
    words = "trains with SFT only (TRL's DPO trainer does not split sequences)"
    found = problem("demo-dpo", *ULYSSES, field="strategy.sequence_parallel", words=words)
    assert found[::2] == ("error", {"strategy.sequence_parallel": 1})


def test_key_value_heads_must_split_or_divide():
    # Qwen2.5-14B: 40 attention heads, 8 key/value heads; 5 GPUs split the first and neither split nor divide 8
    changes = [*ULYSSES, "launch.num_processes=10", "strategy.sequence_parallel=5"]
    words = "the model's 8 key/value heads neither split over 5 GPUs nor divide 5"
    assert problem("13b-lora-fsdp", *changes, field="strategy.sequence_parallel", words=words)[0] == "error"


def test_the_files_carry_ulysses_for_accelerate_and_the_padding_for_its_slices():
    spec = resolve_spec("7b-lora-ddp", ULYSSES)
    assert accelerate_config_dict(spec)["parallelism_config"] == {
        "parallelism_config_sp_size": 2,
        "parallelism_config_sp_backend": "deepspeed",
        "parallelism_config_sp_seq_length_is_variable": True,
        "parallelism_config_sp_attn_implementation": "sdpa",
    }
    assert training_args_dict(spec)["pad_to_multiple_of"] == 2  # each batch cuts into 2 equal slices
    # On CPU, gloo gathers equal sizes only: every batch is padded to max_seq_length (rounded to the slices).
    demo = resolve_spec("demo", [*ULYSSES, "dataset.max_seq_length=63"])
    assert training_args_dict(demo)["pad_to_multiple_of"] == 64
    readme = render_bundle_readme(spec, ["accelerate_config.yaml"])
    assert (
        "- Strategy: DeepSpeed ZeRO-3 (optimizer states, gradients and parameters sharded), 2 GPUs per sequence"
        in readme
    )
    assert "= 2 per device x 2 sequence groups (4 processes, 2 GPUs per sequence) x 4 accumulation" in readme
    assert "- accelerate >= 1.12.0: accelerate_config.yaml's parallelism_config sp_size" in readme
    plain = resolve_spec("7b-lora-ddp", ["strategy.kind=zero3"])
    assert "parallelism_config" not in accelerate_config_dict(plain)
    assert "accelerate >=" not in render_bundle_readme(plain, [])
    assert "pad_to_multiple_of" not in training_args_dict(plain)


def test_accelerate_and_trl_take_the_ulysses_bundle(export, check):
    result = check(export(resolve_spec("7b-lora-ddp", ULYSSES)))
    assert (result.launcher, result.zero_stage, result.num_processes) == ("deepspeed", 3, 4)
    sp = result.parallelism_config  # accelerate's ParallelismConfig, built from the launcher's environment
    assert (sp.sp_size, sp.sp_backend, sp.sp_enabled) == (2, "deepspeed", True)
    assert (sp.sp_handler.sp_seq_length_is_variable, sp.sp_handler.sp_attn_implementation) == (True, "sdpa")
    assert result.sft_config.pad_to_multiple_of == 2 and result.sft_config.packing is False
