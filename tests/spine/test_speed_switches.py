"""The fast defaults and the speed switches: what training_args.yaml gets, and the rules that refuse them."""

from __future__ import annotations

import importlib.util
import json

import pytest
import yaml

from tunedeck.backend import recipe
from tunedeck.backend.render import render_bundle
from tunedeck.backend.spec import resolve_spec, spec_to_dict
from tunedeck.backend.validate import validate


def args_of(preset: str, overrides: list[str] = ()) -> dict:
    return yaml.safe_load(render_bundle(resolve_spec(preset, list(overrides)))["training_args.yaml"])


def problems_of(preset: str, overrides: list[str], field: str) -> list[tuple[str, str]]:
    return [(p.level, p.message) for p in validate(resolve_spec(preset, overrides)) if p.field == field]


def test_gpu_jobs_pack_use_fused_adamw_and_dataloader_workers():
    args = args_of("7b-full-zero2")
    assert args["packing"] is True and "train_sampling_strategy" not in args
    assert args["optim"] == "adamw_torch_fused"  # transformers' own default on torch >= 2.8, no longer overridden
    assert args["dataloader_num_workers"] == 2
    assert args["use_liger_kernel"] is False and args["torch_compile"] is False


def test_without_packing_rows_are_grouped_by_length():
    assert args_of("7b-lora-ddp", ["dataset.packing=false"])["train_sampling_strategy"] == "group_by_length"
    unsorted = args_of("7b-lora-ddp", ["dataset.packing=false", "training.group_by_length=false"])
    assert "train_sampling_strategy" not in unsorted


def test_cpu_jobs_keep_their_cores_for_the_ranks():
    args = args_of("demo")
    assert "dataloader_num_workers" not in args and args["packing"] is True


def test_assistant_only_loss_reaches_trl_for_chat_data_only():
    assert args_of("7b-lora-ddp", ["dataset.format=messages", "dataset.assistant_only_loss=true"])[
        "assistant_only_loss"
    ]
    ignored = problems_of("7b-lora-ddp", ["dataset.assistant_only_loss=true"], "dataset.assistant_only_loss")
    assert ignored and "dataset.format=messages" in ignored[0][1]


def test_liger_is_refused_on_cpu():
    ((level, message),) = problems_of("demo", ["training.use_liger_kernel=true"], "training.use_liger_kernel")
    assert level == "error" and "training.use_liger_kernel=false" in message


def test_liger_on_a_llama_gpu_job_is_accepted_and_installed():
    spec = resolve_spec("7b-lora-ddp", ["training.use_liger_kernel=true"])
    assert not [p for p in validate(spec) if p.field == "training.use_liger_kernel"]
    assert "liger-kernel" in render_bundle(spec)["requirements.txt"]
    assert "liger-kernel" not in render_bundle(resolve_spec("7b-lora-ddp"))["requirements.txt"]


def test_liger_refuses_a_model_type_it_has_no_kernels_for(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    on = [f"model.name_or_path={tmp_path}", "training.use_liger_kernel=true"]
    ((level, message),) = problems_of("7b-lora-ddp", on, "training.use_liger_kernel")
    assert level == "error" and "model type gpt2" in message
    unknown = ["model.name_or_path=someone/unknown-model", "training.use_liger_kernel=true"]
    ((level, message),) = problems_of("7b-lora-ddp", unknown, "training.use_liger_kernel")
    assert level == "warning" and "llama" in message


@pytest.mark.skipif(importlib.util.find_spec("liger_kernel") is not None, reason="liger-kernel is installed here")
def test_a_missing_liger_package_is_named_before_the_model_loads(tmp_path):
    job = spec_to_dict(resolve_spec("7b-lora-ddp", ["training.use_liger_kernel=true"]))
    problems = dict(recipe.input_problems(job, tmp_path))
    assert "pip install liger-kernel" in problems["training.use_liger_kernel"]
    assert "training.use_liger_kernel" not in dict(
        recipe.input_problems(spec_to_dict(resolve_spec("7b-lora-ddp")), tmp_path)
    )


def test_compiling_a_quantized_model_is_warned_about():
    ((level, message),) = problems_of("70b-qlora-zero3", ["training.torch_compile=true"], "training.torch_compile")
    assert level == "warning" and "training.torch_compile=false" in message
    assert not problems_of("7b-lora-ddp", ["training.torch_compile=true"], "training.torch_compile")
