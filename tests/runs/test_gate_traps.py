"""The sanity gate against every silent launch trap measured on CPU (docs/notes/cpu-distributed.md).

Each test writes a real bundle, launches it the wrong way with the real launcher, and
checks that the run stops with a failure naming the difference, before training: these
launches used to exit 0 after training something else than the job asked for.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tunedeck.backend.render import render_bundle, write_bundle
from tunedeck.backend.render.launch import JOB_FILE, TRAIN_SCRIPT, TRAINING_ARGS_FILE
from tunedeck.backend.render.recipe_files import RECIPE_PACKAGE

from .helpers import end_record, logs_tail, read_metrics

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

BIN = Path(sys.executable).parent
SCRIPT_ARGS = [TRAIN_SCRIPT, "--job", JOB_FILE, "--training-args", TRAINING_ARGS_FILE]


def bundle_for(tmp_path: Path, spec, training_args: dict | None = None, accelerate: dict | None = None) -> Path:
    """The job's real bundle, optionally with keys of training_args.yaml / accelerate_config.yaml changed (None drops)."""
    folder = tmp_path / "bundle"
    write_bundle(render_bundle(spec), folder)
    for name, changes in (("training_args.yaml", training_args), ("accelerate_config.yaml", accelerate)):
        if changes:
            data = yaml.safe_load((folder / name).read_text())
            data.update(changes)
            (folder / name).write_text(yaml.safe_dump({k: v for k, v in data.items() if v is not None}))
    return folder


def launch(folder: Path, argv: list[str]) -> tuple[subprocess.CompletedProcess, float]:
    # HF_HOME elsewhere: no default accelerate config of this machine leaks into the launch.
    env = {**os.environ, "HF_HOME": str(folder.parent / "hf"), "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    began = time.monotonic()
    result = subprocess.run(
        argv, cwd=folder, env=env, capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=300
    )
    return result, time.monotonic() - began


def assert_stopped_by_the_gate(folder: Path, result, seconds: float, *expected: str) -> str:
    detail = result.stdout[-2000:] + result.stderr[-2000:] + logs_tail(folder)
    assert result.returncode != 0, detail
    end = end_record(folder)
    assert end["status"] == "failed", detail
    error = end["error"]
    assert error.startswith("sanity gate: "), error
    for text in expected:
        assert text in error, error
    assert not [r for r in read_metrics(folder) if r["event"] == "log"], "it trained before the gate stopped it"
    assert "Traceback" not in (folder / "logs" / "rank0.log").read_text(), (
        "the gate's failure is a message, not a crash"
    )
    print(f"stopped by the gate after {seconds:.1f} s: {error}")
    return error


def start_records(folder: Path) -> list[dict]:
    return [r for r in read_metrics(folder) if r["event"] == "start"]


def test_accelerate_cpu_flag_starts_one_process(tmp_path, demo_spec):
    """`accelerate launch --cpu --num_processes 2` silently starts ONE process."""
    folder = bundle_for(tmp_path, demo_spec())
    result, seconds = launch(folder, [str(BIN / "accelerate"), "launch", "--cpu", "--num_processes", "2", *SCRIPT_ARGS])
    assert_stopped_by_the_gate(
        folder, result, seconds, "asked 2 processes on 1 machine, got 1: ", "accelerate launch --cpu"
    )
    assert start_records(folder) == []  # stopped right after setup, before the model was loaded


def test_multi_cpu_yaml_starts_one_process(tmp_path, demo_spec):
    """distributed_type MULTI_CPU in the accelerate YAML silently starts one process."""
    folder = bundle_for(tmp_path, demo_spec(), accelerate={"distributed_type": "MULTI_CPU"})
    result, seconds = launch(
        folder, [str(BIN / "accelerate"), "launch", "--config_file", "accelerate_config.yaml", *SCRIPT_ARGS]
    )
    assert_stopped_by_the_gate(folder, result, seconds, "asked 2 processes on 1 machine, got 1: ")
    assert start_records(folder) == []


def test_torchrun_without_use_cpu_trains_independent_ranks(tmp_path, demo_spec):
    """torchrun on CPU without use_cpu: two processes, each training alone (no DDP, no gradient shared)."""
    folder = bundle_for(tmp_path, demo_spec(), training_args={"use_cpu": None})
    result, seconds = launch(folder, [str(BIN / "torchrun"), "--standalone", "--nproc_per_node", "2", *SCRIPT_ARGS])
    error = assert_stopped_by_the_gate(folder, result, seconds)
    assert "asked DDP, got no data-parallel wrapper" in error or "got 1:" in error, error


def accelerate_launch(folder: Path) -> list[str]:
    return [
        str(BIN / "accelerate"),
        "launch",
        "--config_file",
        "accelerate_config.yaml",
        "--main_process_port",
        "0",
        *SCRIPT_ARGS,
    ]


def test_fsdp_in_the_training_arguments_becomes_ddp_on_cpu(tmp_path, demo_spec):
    """SFTConfig(fsdp=...) under a DDP launch on CPU: accelerate ignores the FSDP plugin and runs DDP."""
    spec = demo_spec({"strategy.kind": "fsdp"})
    ddp = bundle_for(tmp_path / "ddp", demo_spec())
    folder = bundle_for(tmp_path, spec, training_args={"fsdp": "full_shard", "fsdp_config": {"version": 2}})
    (folder / "accelerate_config.yaml").write_text((ddp / "accelerate_config.yaml").read_text())
    result, seconds = launch(folder, accelerate_launch(folder))
    assert_stopped_by_the_gate(folder, result, seconds, "asked FSDP2, got DDP (MULTI_CPU)", "falls back to DDP")
    (start,) = start_records(folder)  # what it got, with the verdict
    assert start["model_class"] == "DistributedDataParallel" and start["fsdp"] is False
    assert start["gate"]["passed"] is False


def test_fsdp2_ranks_without_use_cpu_are_not_wrapped(tmp_path, demo_spec):
    """FSDP2 on CPU ranks that do not say use_cpu: accelerate neither shards nor wraps them."""
    folder = bundle_for(tmp_path, demo_spec({"strategy.kind": "fsdp"}), training_args={"use_cpu": None})
    result, seconds = launch(folder, accelerate_launch(folder))
    assert_stopped_by_the_gate(folder, result, seconds, "asked FSDP2, got no data-parallel wrapper")


def patch_recipe(folder: Path, old: str, new: str) -> None:
    """Replace `old` (found once in the bundle's recipe package, tunedeck_recipe/) by `new`: a step taken out."""
    found = [path for path in (folder / RECIPE_PACKAGE).glob("*.py") if old in path.read_text()]
    assert len(found) == 1 and found[0].read_text().count(old) == 1, found
    found[0].write_text(found[0].read_text().replace(old, new))


def test_smoke_run_that_got_ddp_fails_the_gate(tmp_path):
    """The FSDP preset's smoke run with the recipe's FSDP2-on-CPU step taken out: accelerate gives it DDP, the gate stops it."""
    from tunedeck.backend.runs.smoke import smoke_spec
    from tunedeck.backend.spec import resolve_spec

    folder = bundle_for(tmp_path, smoke_spec(resolve_spec("13b-lora-fsdp")))
    patch_recipe(folder, "if _switch_cpu_ranks_to_fsdp2(self.accelerator):", "if False:  # accelerate alone")
    result, seconds = launch(folder, accelerate_launch(folder))
    assert_stopped_by_the_gate(folder, result, seconds, "asked FSDP2, got DDP")
    errors = [yaml.safe_load(line) for line in (folder / "errors.jsonl").read_text().splitlines()]
    assert sorted(e["rank"] for e in errors) == [0, 1]  # every rank stopped, each with rank 0's message
    assert len({e["error"] for e in errors}) == 1


def test_torchrun_on_a_deepspeed_bundle_runs_without_deepspeed(tmp_path, demo_spec):
    """torchrun does not start DeepSpeed (only accelerate's launcher exports its config): the ranks would train alone."""
    folder = bundle_for(tmp_path, demo_spec({"strategy.kind": "zero2"}))
    result, seconds = launch(folder, [str(BIN / "torchrun"), "--standalone", "--nproc_per_node", "2", *SCRIPT_ARGS])
    error = assert_stopped_by_the_gate(folder, result, seconds)
    assert "asked DeepSpeed ZeRO-2, got" in error or "got 1:" in error, error
