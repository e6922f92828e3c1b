"""`tunedeck estimate` as a user runs it: the real console script in a subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tunedeck.backend.spec import catalog, resolve_spec

TUNEDECK = str(Path(sys.executable).with_name("tunedeck"))


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [TUNEDECK, "estimate", *args], capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=120
    )


def estimate_json(*args: str) -> dict:
    result = run(*args, "--json")
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_json_has_current_strategies_and_recommended():
    data = estimate_json("7b-full-zero2", "--gpu-mem", "80", "--cpu-mem", "512")  # the preset's A100-80GB
    current = data["current"]
    keys = {"per_gpu_gb", "phases", "limited_by", "cpu_gb", "load_cpu_gb", "breakdown", "load_breakdown", "fits"}
    assert keys <= current.keys()
    assert current["phases"]["train"] == pytest.approx(sum(current["breakdown"].values()), abs=0.05)
    assert current["phases"]["load"] == pytest.approx(sum(current["load_breakdown"].values()), abs=0.05)
    assert current["per_gpu_gb"] == max(current["phases"].values()) and current["limited_by"] == "train"
    labels = [s["strategy"] for s in data["strategies"]]
    assert {"ZeRO-2", "ZeRO-3", "FSDP FULL_SHARD", "DDP"} <= set(labels)
    for s in data["strategies"]:
        assert {"strategy", "fits", "changes", "per_gpu_gb", "phases", "breakdown"} <= s.keys()
        assert s["per_gpu_gb"] == max(s["phases"].values())
        assert s["fits"] == (s["per_gpu_gb"] <= 0.9 * 80 and max(s["cpu_gb"], s["load_cpu_gb"]) <= 0.9 * 512)
    assert [s["strategy"] for s in data["strategies"] if s["current"]] == ["ZeRO-2"]
    rec = data["recommended"]
    assert rec["strategy"] == "ZeRO-2" and rec["changes"] == {} and rec["reason"].endswith(".")


def test_the_cli_prints_the_one_advice_the_panel_shows():
    # One Advice per job (backend/advisor.advise): the CLI's JSON is it, the panel's table is built from it.
    from tunedeck.app.estimate_view import compute_advice, estimate_table
    from tunedeck.backend.spec import resolve_spec

    data = estimate_json("13b-lora-fsdp", "--gpu-mem", "24", "--cpu-mem", "256")
    advice = compute_advice(resolve_spec("13b-lora-fsdp"), "24", cpu_mem_gb=256)
    assert {k: v for k, v in data.items() if k not in ("model", "gpu_mem_source", "speed")} == json.loads(
        json.dumps(advice.to_dict())
    )
    _, rows = estimate_table(advice)
    by_memory = sorted(data["strategies"], key=lambda s: s["per_gpu_gb"])  # the table's order
    assert [row[0].split(" (")[0] for row in rows] == [s["strategy"] for s in by_memory]


def test_set_overrides_and_gpu_names_change_the_answer():
    # 8 ranks read the 13B checkpoint into host RAM while loading: give the machine the RAM for it.
    big = estimate_json("13b-lora-fsdp", "--gpu-mem", "A100-80GB", "--cpu-mem", "512")
    small = estimate_json("13b-lora-fsdp", "--gpu-mem", "RTX 4090", "--cpu-mem", "512")
    assert big["gpu_mem_gb"] == 80 and small["gpu_mem_gb"] == 24
    # On 80 GB DDP fits and is predicted as fast as the preset's FSDP, so the job's own choice stays.
    assert big["recommended"]["strategy"] == "FSDP FULL_SHARD" and "as fast as DDP" in big["recommended"]["reason"]
    assert next(s for s in big["strategies"] if s["strategy"] == "DDP")["fits"]
    assert not next(s for s in small["strategies"] if s["strategy"] == "DDP")["fits"]
    longer = estimate_json(
        "13b-lora-fsdp", "--gpu-mem", "80", "--cpu-mem", "512", "--set", "dataset.max_seq_length=8192"
    )
    assert longer["current"]["breakdown"]["activations"] > 3 * big["current"]["breakdown"]["activations"]


def test_text_report_shows_the_breakdown_table_and_advice():
    result = run("7b-lora-ddp", "--gpu-mem", "24", "--cpu-mem", "256")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "Qwen/Qwen2.5-7B-Instruct · lora · ddp · 4 process(es)" in out
    assert "Activations" in out and "Weights as loaded" in out and "STRATEGY" in out and "DDP (current)" in out
    assert "training sets the peak" in out and "host RAM per machine" in out
    assert "is the fastest option that fits" in out


@pytest.mark.parametrize("preset", ["70b-qlora-zero3", "70b-qlora-fsdp"])
def test_70b_qlora_presets_need_the_whole_4bit_model_per_gpu_to_load(preset):
    arch = catalog.lookup(resolve_spec(preset).model.name_or_path)
    four_bit_gb = (arch.linear_params * 0.5 + (arch.num_parameters - arch.linear_params) * 2) / 2**30  # 35-38 GB
    for gpu in ("24", "40"):
        data = estimate_json(preset, "--gpu-mem", gpu, "--cpu-mem", "512")
        current = data["current"]
        assert current["phases"]["load"] >= four_bit_gb and current["per_gpu_gb"] == current["phases"]["load"]
        assert current["limited_by"] == "load" and not current["fits"]
        assert data["recommended"]["strategy"] is None and not any(s["fits"] for s in data["strategies"])
    text = run(preset, "--gpu-mem", "40", "--cpu-mem", "512").stdout
    assert "loading sets the peak" in text and "fits in training" in text and "to load the model" in text


def test_without_a_gpu_it_says_what_it_assumed():
    data = estimate_json("demo")
    assert data["gpu_mem_gb"] > 0 and data["gpu_mem_source"]


@pytest.mark.parametrize(
    "args,field",
    [
        (["7b-lora-ddp", "--gpu-mem", "banana"], "--gpu-mem"),
        (["7b-lora-ddp", "--cpu-mem", "-4"], "--cpu-mem"),
        (["7b-lora-ddp", "--cpu-mem", "nan"], "--cpu-mem"),
        (["7b-lora-ddp", "--set", "model.name_or_path=nobody/secret-model"], "model.name_or_path"),
        (["7b-lora-ddp", "--set", "lora.r=0"], "lora.r"),
        (["no-such-preset"], "spec"),
    ],
)
def test_bad_input_names_the_field_and_exits_nonzero(args, field):
    result = run(*args)
    assert result.returncode == 2
    assert f"error: {field}:" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.slow  # builds the demo model and data
def test_demo_preset_on_a_fresh_machine_builds_the_demo_first(tmp_path):
    # A newcomer's first command may be this one: the demo's architecture comes from its built config.json.
    env = {**os.environ, "TUNEDECK_HOME": str(tmp_path)}
    out = subprocess.run(
        [TUNEDECK, "estimate", "demo", "--gpu-mem", "16", "--json"],
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        timeout=300,
        env=env,
    )
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["model"] == str(tmp_path / "demo" / "model")
    assert 0 < report["current"]["per_gpu_gb"] < 16
    assert (tmp_path / "demo" / "model" / "config.json").is_file()
