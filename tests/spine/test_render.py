"""The generators: golden files for the two named presets, and what each file says.

Regenerate the golden files after an intended change with
    TUNEDECK_UPDATE_GOLDEN=1 .venv/bin/python -m pytest tests/spine/test_render.py
and review the diff: it is the change users will see.
"""

from __future__ import annotations

import io
import json
import os
import stat
import subprocess
import zipfile
from pathlib import Path

import pytest
import yaml

from tunedeck.backend.render import render_bundle, write_bundle, zip_bundle
from tunedeck.backend.render.recipe_files import ENTRY_SCRIPT, RECIPE_DIR, RECIPE_PACKAGE
from tunedeck.backend.spec import resolve_spec, spec_from_yaml

GOLDEN = Path(__file__).parent / "golden"
GOLDEN_PRESETS = ["70b-qlora-zero3", "7b-lora-ddp"]
# train_sft.py and the recipe package beside it are backend/recipe/ verbatim (checked below), not generated files.
NOT_GOLDEN = {"train_sft.py"}


def golden(name: str) -> bool:
    return name not in NOT_GOLDEN and not name.startswith(f"{RECIPE_PACKAGE}/")


@pytest.mark.parametrize("preset", GOLDEN_PRESETS)
def test_golden_bundle(preset):
    files = {name: text for name, text in render_bundle(resolve_spec(preset)).items() if golden(name)}
    folder = GOLDEN / preset
    if os.environ.get("TUNEDECK_UPDATE_GOLDEN"):
        folder.mkdir(parents=True, exist_ok=True)
        for old in folder.iterdir():
            old.unlink()
        for name, text in files.items():
            (folder / name).write_text(text, encoding="utf-8")
    expected = {path.name: path.read_text(encoding="utf-8") for path in folder.iterdir()}
    assert sorted(files) == sorted(expected)
    for name, text in files.items():
        assert text == expected[name], f"{preset}/{name} differs from the golden file"


def test_bundle_order_and_contents():
    files = render_bundle(resolve_spec("70b-qlora-zero3"))
    names = list(files)
    assert names[:5] == ["job.yaml", "accelerate_config.yaml", "ds_config.json", "training_args.yaml", "launch.sh"]
    assert names[names.index("README.md") + 1 :] == [
        f"{RECIPE_PACKAGE}/{path.name}" for path in sorted(RECIPE_DIR.glob("*.py"))
    ]
    assert files["train_sft.py"] == ENTRY_SCRIPT
    assert "ds_config.json" not in render_bundle(resolve_spec("7b-lora-ddp"))


def test_70b_qlora_zero3_files_say_stage3_4bit_nf4_bf16_storage():
    files = render_bundle(resolve_spec("70b-qlora-zero3"))
    ds = json.loads(files["ds_config.json"])
    assert ds["zero_optimization"]["stage"] == 3
    assert ds["bf16"] == {"enabled": True}
    assert ds["train_batch_size"] == ds["train_micro_batch_size_per_gpu"] == "auto"
    job = yaml.safe_load(files["job.yaml"])
    assert job["method"] == "qlora"
    assert job["quantization"]["bits"] == 4
    assert job["quantization"]["bnb_4bit_quant_type"] == "nf4"
    assert job["quantization"]["bnb_4bit_use_double_quant"] is True
    assert job["quantization"]["bnb_4bit_quant_storage"] == "bfloat16"
    acc = yaml.safe_load(files["accelerate_config.yaml"])
    assert acc["distributed_type"] == "DEEPSPEED"
    assert acc["deepspeed_config"]["deepspeed_config_file"] == "ds_config.json"
    assert "mixed_precision" not in acc  # accelerate refuses it next to a deepspeed_config_file


def test_job_yaml_in_the_bundle_is_the_spec():
    spec = resolve_spec("13b-lora-fsdp", ["lora.r=8"])
    assert spec_from_yaml(render_bundle(spec)["job.yaml"]) == spec


def test_cpu_training_args_carry_what_the_ranks_need():
    ddp = yaml.safe_load(render_bundle(resolve_spec("demo"))["training_args.yaml"])
    assert (ddp["use_cpu"], ddp["ddp_backend"], ddp["bf16"], ddp["fp16"]) == (True, "gloo", False, False)
    zero = yaml.safe_load(render_bundle(resolve_spec("demo", ["strategy.kind=zero2"]))["training_args.yaml"])
    assert (zero["use_cpu"], zero["ddp_backend"], zero["bf16"]) == (False, "gloo", False)
    acc = yaml.safe_load(render_bundle(resolve_spec("demo"))["accelerate_config.yaml"])
    # MULTI_CPU and --cpu silently start one process: DDP on CPU is MULTI_GPU + use_cpu.
    assert (acc["distributed_type"], acc["use_cpu"], acc["num_processes"]) == ("MULTI_GPU", True, 2)


def test_training_args_follow_the_spec():
    spec = resolve_spec(
        "7b-lora-ddp",
        [
            "dataset.eval_split=test",
            "training.eval_steps=50",
            "dataset.format=messages",
            "training.report_to=tensorboard",
        ],
    )
    args = yaml.safe_load(render_bundle(spec)["training_args.yaml"])
    assert (args["eval_strategy"], args["eval_steps"]) == ("steps", 50)
    assert "dataset_text_field" not in args  # only the text format reads one column
    assert args["report_to"] == "tensorboard"
    assert args["activation_checkpointing_kwargs"] == {"use_reentrant": False}
    assert args["ddp_find_unused_parameters"] is False
    plain = yaml.safe_load(render_bundle(resolve_spec("7b-lora-ddp"))["training_args.yaml"])
    assert plain["eval_strategy"] == "no"
    assert plain["dataset_text_field"] == "text"


@pytest.mark.parametrize(
    "preset, overrides, reentrant",
    [
        ("70b-qlora-zero3", [], True),  # adapters on ZeRO-3: TRL's SFTTrainer forces reentrant (trl#2514)
        ("7b-lora-ddp", ["strategy.kind=zero3"], True),
        ("7b-full-zero2", ["strategy.kind=zero3"], False),  # no adapter: TRL leaves the choice alone
        ("7b-lora-ddp", ["strategy.kind=zero2"], False),
        ("7b-lora-ddp", [], False),
    ],
)
def test_checkpointing_kwargs_are_what_trl_runs(preset, overrides, reentrant):
    args = yaml.safe_load(render_bundle(resolve_spec(preset, overrides))["training_args.yaml"])
    assert args["activation_checkpointing"] is True
    assert args["activation_checkpointing_kwargs"] == {"use_reentrant": reentrant}


def test_multi_machine_launch_sh_takes_rank_and_address_from_the_environment(tmp_path):
    spec = resolve_spec(
        "7b-lora-ddp", ["launch.num_machines=2", "launch.num_processes=8", "launch.main_process_ip=10.0.0.1"]
    )
    files = render_bundle(spec)
    acc = yaml.safe_load(files["accelerate_config.yaml"])
    assert (acc["num_machines"], acc["num_processes"], acc["main_process_ip"]) == (2, 8, "10.0.0.1")
    # Run launch.sh with a stand-in `accelerate` that prints its arguments and environment.
    write_bundle(files, tmp_path)
    fake = tmp_path / "fake_accelerate"
    fake.write_text('#!/bin/sh\necho "OMP=$OMP_NUM_THREADS ARGS=$*"\n')
    fake.chmod(0o755)
    env = {"PATH": os.environ["PATH"], "ACCELERATE": str(fake), "MACHINE_RANK": "1"}
    out = subprocess.run(
        ["bash", str(tmp_path / "launch.sh"), "--run-dir", "x"], env=env, capture_output=True, text=True, check=True
    )
    assert "--machine_rank 1 --main_process_ip 10.0.0.1" in out.stdout
    assert "train_sft.py --job job.yaml --training-args training_args.yaml --run-dir x" in out.stdout
    assert int(out.stdout.split("OMP=")[1].split()[0]) >= 1
    env["OMP_NUM_THREADS"] = "3"
    out = subprocess.run(["bash", str(tmp_path / "launch.sh")], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.startswith("OMP=3 ")


def test_zip_bundle_unzips_to_the_same_files_with_an_executable_launcher(tmp_path):
    files = render_bundle(resolve_spec("demo"))
    data = zip_bundle(files)
    assert data == zip_bundle(files)  # deterministic: same files, same bytes
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        assert archive.namelist() == list(files)
        for name, text in files.items():
            assert archive.read(name).decode() == text
        mode = archive.getinfo("launch.sh").external_attr >> 16
        assert mode & stat.S_IXUSR
