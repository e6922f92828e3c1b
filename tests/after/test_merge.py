"""`tunedeck merge`: a standalone model that transformers loads without PEFT, equal to base + adapter.

Each case trains a real demo run on CPU (DDP, QLoRA), merges it with the CLI in float32, loads
the result in a process where peft and bitsandbytes cannot be imported, and compares its logits
on the demo's eval prompts with the base + adapter through PEFT. The checkpoints of ZeRO-3 and
FSDP2, consolidated from their shards, are merged in tests/runs/test_resume_shape.py (its runs
save them).
"""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from tunedeck.tests.runs.helpers import start_record

from .helpers import eval_prompts, max_difference, merged_logits, peft_logits, tunedeck

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]
TOLERANCE = 1e-4


def merge(runs_dir, run_id, out, *extra) -> subprocess.CompletedProcess:
    result = tunedeck("merge", run_id, "-o", out, "--dtype", "float32", "--runs-dir", runs_dir, *extra)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    return result


@pytest.fixture(scope="module")
def merged_demo(demo_run, tmp_path_factory):
    """(folder, CLI result) of the demo run's final adapter merged in float32."""
    out = tmp_path_factory.mktemp("merged-demo") / "merged"
    return out, merge(*demo_run, out)


def test_demo_run_merges_into_a_model_equal_to_base_plus_adapter(demo_run, merged_demo, demo_home, tmp_path):
    runs_dir, run_id = demo_run
    out, result = merged_demo
    assert f"saved to {out}" in result.stdout
    for name in ("model.safetensors", "config.json", "generation_config.json", "tokenizer.json", "serve.sh", "adapter"):
        assert (out / name).exists(), name
    assert not (out / "adapter_config.json").exists()  # a plain model: transformers must not take it for an adapter
    prompts = eval_prompts(demo_home)
    reference = peft_logits(demo_home / "model", runs_dir / run_id / "output", prompts)
    merged, facts = merged_logits(out, prompts, tmp_path)
    assert facts["class"] == "LlamaForCausalLM"
    assert max_difference(reference, merged) < TOLERANCE
    # The adapter really changes the model, so the equality above says something.
    assert max_difference(peft_logits(demo_home / "model", None, prompts), merged) > 0.1


def test_qlora_adapter_is_merged_into_the_16bit_base(qlora_run, demo_home, tmp_path):
    runs_dir, run_id = qlora_run
    # What the run got (QLoRA on 2 DDP ranks; on 1 process: test_training_runs.py): the base's linear layers in 4 bits.
    start = start_record(runs_dir / run_id)
    assert (start["world_size"], start["method"], start["model_class"]) == (2, "qlora", "DistributedDataParallel")
    assert start["quantized_modules"].get("Linear4bit", 0) >= 7, start["quantized_modules"]
    assert 0 < start["trainable_params"] < start["total_params"]
    out = tmp_path / "merged"
    result = merge(runs_dir, run_id, out)
    assert "not into 4-bit weights" in result.stderr
    assert json.loads((out / "tunedeck_merge.json").read_text())["merged_into"] == "float32 base (not quantized)"
    assert "quantization_config" not in json.loads((out / "config.json").read_text())
    prompts = eval_prompts(demo_home)
    merged, facts = merged_logits(out, prompts, tmp_path)  # bitsandbytes cannot be imported there
    assert facts["quantization_config"] is None
    assert max_difference(peft_logits(demo_home / "model", runs_dir / run_id / "output", prompts), merged) < TOLERANCE


def test_serve_sh_of_a_merged_model_runs_vllm_with_the_right_arguments(demo_run, merged_demo, demo_home, tmp_path):
    run_id = demo_run[1]
    out = merged_demo[0]
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    stand_in = bin_dir / "vllm"  # vLLM needs a GPU: a stand-in records the argv it would get
    stand_in.write_text("#!/usr/bin/env python3\nimport json, sys\nprint(json.dumps(sys.argv[1:]))\n")
    stand_in.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "PORT": "8123"}
    merged = json.loads(
        subprocess.run(["bash", str(out / "serve.sh")], env=env, capture_output=True, text=True, check=True).stdout
    )
    assert merged[:2] == ["serve", str(out)] and merged[merged.index("--port") + 1] == "8123"
    assert merged[merged.index("--dtype") + 1] == "float32"
    adapter = json.loads(
        subprocess.run(
            ["bash", str(out / "serve.sh"), "adapter"], env=env, capture_output=True, text=True, check=True
        ).stdout
    )
    assert adapter[:2] == ["serve", str(demo_home / "model")]  # the base model, with the adapter on top
    assert "--enable-lora" in adapter and adapter[adapter.index("--max-lora-rank") + 1] == "16"
    assert adapter[adapter.index("--lora-modules") + 1] == f"tunedeck-{run_id}-adapter={out / 'adapter'}"
    assert (out / "adapter" / "adapter_config.json").is_file()
