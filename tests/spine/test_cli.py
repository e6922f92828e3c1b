"""The `tunedeck` console script, run as a user runs it (a real subprocess)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

# The console script installed next to this interpreter (pip install -e . put it there).
TUNEDECK = str(Path(sys.executable).parent / "tunedeck")


def tunedeck(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([TUNEDECK, *args], capture_output=True, text=True, cwd=cwd, timeout=120)


def test_export_70b_qlora_zero3(tmp_path, check):
    out = tmp_path / "out"
    result = tunedeck("export", "70b-qlora-zero3", "-o", str(out))
    assert result.returncode == 0, result.stderr
    ds = json.loads((out / "ds_config.json").read_text())
    assert ds["zero_optimization"]["stage"] == 3
    job = yaml.safe_load((out / "job.yaml").read_text())
    assert (job["quantization"]["bits"], job["quantization"]["bnb_4bit_quant_type"]) == (4, "nf4")
    assert job["quantization"]["bnb_4bit_quant_storage"] == "bfloat16"
    assert (out / "launch.sh").stat().st_mode & 0o100
    assert check(out).zero_stage == 3


def test_export_7b_lora_ddp(tmp_path, check):
    result = tunedeck("export", "7b-lora-ddp", "-o", "out", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    acc = yaml.safe_load((tmp_path / "out" / "accelerate_config.yaml").read_text())
    assert (acc["distributed_type"], acc["num_processes"]) == ("MULTI_GPU", 4)
    checked = check(tmp_path / "out")
    assert (checked.launcher, checked.num_processes) == ("multi_gpu", 4)


def test_export_with_overrides(tmp_path):
    result = tunedeck(
        "export",
        "7b-full-zero2",
        "--set",
        "strategy.kind=zero3",
        "--set",
        "launch.num_processes=16",
        "-o",
        str(tmp_path),
    )
    assert result.returncode == 0, result.stderr
    assert json.loads((tmp_path / "ds_config.json").read_text())["zero_optimization"]["stage"] == 3
    assert yaml.safe_load((tmp_path / "accelerate_config.yaml").read_text())["num_processes"] == 16


@pytest.mark.parametrize(
    "override, field, fix",
    [
        ("lora.r=0", "lora.r", "greater than or equal to 1"),
        ("strategy.kind=zero4", "strategy.kind", "'zero3'"),
        ("training.gradient_accumulation_steps=many", "training.gradient_accumulation_steps", "valid integer"),
        ("strategy.offload_params=cpu", "strategy.offload_params", "strategy.kind=zero3"),
        ("strategy.kindd=zero2", "strategy.kindd", "strategy.kind"),
        ("launch.num_processes", "launch.num_processes", "dotted.path=value"),
    ],
)
def test_invalid_set_names_the_field_and_the_fix_and_writes_nothing(tmp_path, override, field, fix):
    out = tmp_path / "out"
    result = tunedeck("export", "7b-lora-ddp", "--set", override, "-o", str(out))
    assert result.returncode != 0
    assert f"error: {field}: " in result.stderr
    assert fix in result.stderr
    assert "Traceback" not in result.stderr
    assert not out.exists()


def test_validate_reports_the_global_batch_and_problems(tmp_path):
    ok = tunedeck("validate", "7b-lora-ddp")
    assert ok.returncode == 0
    assert "global batch 32 = 2 per device x 4 processes x 4 accumulation steps" in ok.stdout
    bad = tunedeck("validate", "demo", "--set", "strategy.kind=fsdp", "--set", "strategy.fsdp_version=1")
    assert bad.returncode == 2
    assert "error: strategy.fsdp_version: FSDP1 cannot run on CPU" in bad.stderr


def test_spec_file_round_trips_through_the_cli(tmp_path):
    first = tmp_path / "a"
    assert tunedeck("export", "13b-lora-fsdp", "--set", "lora.r=32", "-o", str(first)).returncode == 0
    second = tmp_path / "b"
    result = tunedeck("export", str(first / "job.yaml"), "-o", str(second))
    assert result.returncode == 0, result.stderr
    for name in ("job.yaml", "accelerate_config.yaml", "training_args.yaml", "launch.sh"):
        assert (first / name).read_text() == (second / name).read_text()


def test_unknown_spec_source_and_bad_yaml(tmp_path):
    missing = tunedeck("validate", "no-such-preset")
    assert missing.returncode == 2 and "neither a preset" in missing.stderr
    broken = tmp_path / "job.yaml"
    broken.write_text("model: {name_or_path: x\n")
    result = tunedeck("validate", str(broken))
    assert result.returncode == 2 and "not valid YAML" in result.stderr


def test_presets_table_and_schema():
    table = tunedeck("presets")
    assert table.returncode == 0
    lines = table.stdout.splitlines()
    assert lines[0].split()[:2] == ["ID", "TITLE"]
    assert any(line.startswith("70b-qlora-zero3") and "zero3" in line and "8xGPU" in line for line in lines)
    assert any(line.startswith("demo") and "2xCPU" in line for line in lines)
    schema = json.loads(tunedeck("schema").stdout)
    assert {"model", "method", "lora", "quantization", "dataset", "training", "strategy", "launch"} <= set(
        schema["properties"]
    )


@pytest.mark.slow  # imports the training stack in a subprocess
def test_check_command_reports_what_accelerate_would_start(tmp_path):
    assert tunedeck("export", "7b-full-zero2", "-o", str(tmp_path)).returncode == 0
    ok = tunedeck("check", str(tmp_path))
    assert ok.returncode == 0, ok.stderr
    assert "accelerate starts 8 processes (8 per machine) with its deepspeed launcher as DEEPSPEED, ZeRO-2" in ok.stdout


def test_check_command_names_the_refused_file(tmp_path, capsys, check):
    from tunedeck.backend.cli import main

    assert main(["export", "7b-full-zero2", "-o", str(tmp_path)]) == 0
    ds = tmp_path / "ds_config.json"
    ds.write_text(ds.read_text().replace('"stage": 2', '"stage": 9'))
    capsys.readouterr()
    # In-process (the libraries are loaded already); the same handler as the console script.
    assert main(["check", str(tmp_path)]) == 2
    assert "error: bundle: ds_config.json: DeepSpeed refused it" in capsys.readouterr().err


def test_unreadable_spec_and_unwritable_output_are_errors_not_tracebacks(tmp_path, capsys):
    from tunedeck.backend.cli import main

    binary = tmp_path / "job.yaml"
    binary.write_bytes(b"\xff\xfe\x00 not text")
    with pytest.raises(SystemExit) as exited:
        main(["validate", str(binary)])
    assert exited.value.code == 2
    assert "error: spec: cannot read" in capsys.readouterr().err

    blocker = tmp_path / "a-file"
    blocker.write_text("in the way")
    assert main(["export", "7b-lora-ddp", "-o", str(blocker / "out")]) == 2
    err = capsys.readouterr().err
    assert "error: --output: cannot write the bundle" in err and "writable folder" in err
