"""Sequence parallelism (strategy.sequence_parallel, DeepSpeed Ulysses) in the memory estimate, the speed model and
the advisor: N GPUs share each row, each holding 1/N of its activations, with all-to-alls in every layer."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tunedeck.backend.estimate import speed
from tunedeck.backend.estimate.advisor import advise
from tunedeck.backend.estimate.advisor_sequence import sequence_sizes
from tunedeck.backend.estimate.memory import estimate
from tunedeck.backend.estimate.memory_job import Job, input_values
from tunedeck.backend.spec import set_paths
from tunedeck.backend.spec.presets import resolve_spec as load_preset
from tunedeck.backend.validate import validate

TUNEDECK = str(Path(sys.executable).with_name("tunedeck"))
A100 = speed.Hardware.named("A100-80GB")
LONG_ROWS = {"strategy.kind": "zero3", "dataset.max_seq_length": 32768, "dataset.packing": False}


def estimate_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [TUNEDECK, "estimate", "7b-lora-ddp", *args, "--gpu", "A100-80GB", "--cpu-mem", "512"],
        capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=120,
    )  # fmt: skip


def long_rows(sp: int) -> list[str]:
    sets = {**LONG_ROWS, "strategy.sequence_parallel": sp}
    return [arg for path, value in sets.items() for arg in ("--set", f"{path}={str(value).lower()}")]


def _job(preset: str = "7b-lora-ddp", **changes) -> tuple:
    spec = set_paths(load_preset(preset), changes)
    return spec, Job.from_values(input_values(spec))


# ---------------------------------------------------------------- memory and time as `tunedeck estimate` reports them


def test_two_gpus_per_sequence_halve_the_activations_and_double_the_steps():
    """The 7B LoRA preset on ZeRO-3 with rows of 32,768 tokens, 1 vs 2 GPUs per sequence."""
    one, two = (json.loads(estimate_cli(*long_rows(sp), "--json").stdout)["current"] for sp in (1, 2))
    a, b = one["breakdown"], two["breakdown"]
    # Each GPU holds half of every row's activations; the all-to-all's buffers of one layer add a little.
    assert 0.5 <= b["activations"] / a["activations"] < 0.56
    assert b["logits"] < a["logits"]
    for term in ("weights", "adapter", "gathered", "buckets"):  # ZeRO still shards over all 4 GPUs
        assert b[term] == a[term], term
    assert two["per_gpu_gb"] < 0.6 * one["per_gpu_gb"]
    # 9,846 guanaco rows: global batch 2 x 4 x 4 = 32 -> 308 steps; two GPUs read each row: 16 -> 616 steps.
    assert (one["steps"], two["steps"]) == (308, 616)
    assert "global batch 16" in two["steps_source"]
    # A step reads half the rows: half the compute, plus the all-to-alls; the hours stay close (within 5%).
    assert two["step_parts_s"]["compute"] == pytest.approx(one["step_parts_s"]["compute"] / 2, rel=0.02)
    assert two["step_parts_s"]["sequence_parallel"] > 0 and "sequence_parallel" not in one["step_parts_s"]
    assert one["hours"] < two["hours"] < 1.05 * one["hours"]


def test_the_report_says_how_many_gpus_share_a_sequence():
    text = estimate_cli(*long_rows(2)).stdout
    assert "on 2 GPUs per sequence (16384 tokens each), global batch 16" in text
    assert "ZeRO-3 + 2 GPUs/sequence (current)" in text
    assert "GPUs per sequence" not in estimate_cli().stdout  # the preset as it is


# ---------------------------------------------------------------- the speed model's all-to-alls


def _all_to_alls(**changes) -> float:
    spec, job = _job(**{**LONG_ROWS, "strategy.sequence_parallel": 2, **changes})
    return speed.predict(job, A100, speed.schedule_of(spec, 1000)).parts.get("sequence_parallel", 0.0)


def test_the_all_to_alls_grow_with_the_rows_and_cost_more_across_machines():
    short, long = _all_to_alls(**{"dataset.max_seq_length": 8192}), _all_to_alls()
    assert short > 0 and long == pytest.approx(4 * short, rel=0.01)  # 4x the tokens per GPU
    assert _all_to_alls(**{"strategy.sequence_parallel": 1}) == 0
    assert _all_to_alls(**{"strategy.kind": "fsdp"}) == 0  # Ulysses is DeepSpeed's: FSDP ignores the field
    # Checkpointing recomputes the forward's four all-to-alls: 12 per layer instead of 8.
    assert _all_to_alls(**{"training.gradient_checkpointing": False}) == pytest.approx(long * 2 / 3, rel=0.01)
    # 4 GPUs per sequence on 2 machines of 2 GPUs: the all-to-alls cross InfiniBand instead of NVLink.
    inside = _all_to_alls(**{"strategy.sequence_parallel": 4})
    across = _all_to_alls(**{"strategy.sequence_parallel": 4, "launch.num_machines": 2})
    assert across > 5 * inside


# ---------------------------------------------------------------- the advisor


def test_rows_too_long_for_one_gpu_get_the_fewest_gpus_per_sequence_that_fit():
    spec = set_paths(load_preset("7b-lora-ddp"), {"dataset.max_seq_length": 65536})
    schedule = speed.schedule_of(spec, 9846)
    advice = advise(spec, 80, cpu_mem_gb=512, hardware=A100, schedule=schedule)
    rec = advice.recommendation
    assert not any(o.fits for o in advice.options if "GPUs/sequence" not in o.strategy and "QLoRA" not in o.strategy)
    assert rec.fits and rec.strategy == "ZeRO-3 + 2 GPUs/sequence"
    assert rec.changes == {"strategy.kind": "zero3", "strategy.sequence_parallel": 2, "dataset.packing": False}
    assert "rows of 65,536 tokens: their activations need 2 GPUs per sequence" in rec.reason
    assert "gradient_accumulation_steps" in rec.reason  # the global batch halves
    assert not any("4 GPUs/sequence" in o.strategy for o in advice.options)  # the smallest N that fits only
    by_label = {o.strategy: o for o in advice.options}
    assert by_label["ZeRO-3 + 2 GPUs/sequence"].speed.steps == 2 * by_label["ZeRO-3"].speed.steps  # its own batch
    # Applied, the job is valid, estimates as its option did, and the advisor keeps it.
    applied = set_paths(spec, rec.changes)
    assert not [p for p in validate(applied) if p.level == "error"]
    assert estimate(applied).per_gpu_gb == pytest.approx(rec.estimate.per_gpu_gb)
    again = advise(applied, 80, cpu_mem_gb=512)
    assert again.recommendation.changes == {} and [o.strategy for o in again.options if o.current] == [rec.strategy]


def test_on_smaller_gpus_the_rows_need_more_gpus_per_sequence():
    spec = set_paths(load_preset("7b-lora-ddp"), {"dataset.max_seq_length": 32768})
    advice = advise(spec, 24, cpu_mem_gb=128)
    assert advice.recommendation.changes["strategy.sequence_parallel"] == 4  # 2 leave each GPU 36 GB of rows
    assert not any("2 GPUs/sequence" in o.strategy for o in advice.options)


def test_short_rows_and_other_objectives_keep_one_gpu_per_sequence():
    preset = load_preset("7b-lora-ddp")
    assert not any("GPUs/sequence" in o.strategy for o in advise(preset, 24, cpu_mem_gb=128).options)
    assert advise(preset, 24, cpu_mem_gb=128).recommendation.strategy == "DDP"
    long = set_paths(preset, {"dataset.max_seq_length": 65536})
    # DPO: TRL's DPOTrainer does not split sequences.
    dpo = set_paths(long, {"objective": "dpo", "dataset.format": "preference"})
    assert not any("GPUs/sequence" in o.strategy for o in advise(dpo, 80, cpu_mem_gb=512).options)
    # A 34B base too big for 2 x 24 GB: the model states overflow, not the rows, so sequences stay whole.
    big = set_paths(preset, {"model.name_or_path": "01-ai/Yi-34B", "launch.num_processes": 2})
    assert not any("GPUs/sequence" in o.strategy for o in advise(big, 24, cpu_mem_gb=96).options)


def test_gpus_per_sequence_split_the_heads_and_stay_inside_a_machine():
    def sizes(**changes) -> list[int]:
        return sequence_sizes(input_values(set_paths(load_preset("7b-lora-ddp"), changes)))

    assert sizes() == [2, 4]  # Qwen2.5-7B: 28 heads, 4 key/value heads
    assert sizes(**{"launch.num_processes": 8}) == [2, 4]  # 28 heads do not split over 8
    assert sizes(**{"launch.num_processes": 8, "launch.num_machines": 4}) == [2]  # 2 GPUs per machine
    assert sizes(**{"strategy.kind": "zero3", "strategy.sequence_parallel": 2}) == [4]  # more than the job's own


def test_a_job_with_gpus_per_sequence_is_exactly_one_option_and_the_others_reset_it():
    spec = set_paths(load_preset("7b-lora-ddp"), {**LONG_ROWS, "strategy.sequence_parallel": 2})
    options = advise(spec, 80, cpu_mem_gb=512).options
    assert [o.strategy for o in options if o.current] == ["ZeRO-3 + 2 GPUs/sequence"]
    for o in options:
        deepspeed = o.changes["strategy.kind"].startswith("zero")
        assert o.changes["strategy.sequence_parallel"] == (2 if deepspeed else 1), o.strategy
        assert ("GPUs/sequence" in o.strategy) == deepspeed
