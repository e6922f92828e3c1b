"""GRPO's memory and step time as a user sees them (backend/estimate/memory_grpo.py, backend/estimate/speed_generation.py): the
answers written at once before each step hold a KV cache (and, under ZeRO-3, the whole model gathered), and
writing them takes a decode step a token, bound by the GPU's memory bandwidth."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from estimate.gpu_runs import fake_gpu_run
from tunedeck.backend.estimate import speed
from tunedeck.backend.estimate.memory import TERMS, estimate
from tunedeck.backend.estimate.memory_job import GIB, Job, input_values
from tunedeck.backend.estimate.speed_generation import HBM_TBPS
from tunedeck.backend.runs.speed import calibration
from tunedeck.backend.spec import flops, set_paths
from tunedeck.backend.spec.presets import resolve_spec as load_preset

TUNEDECK = str(Path(sys.executable).with_name("tunedeck"))
GRPO = {"objective": "grpo", "dataset.format": "prompt-only", "grpo.max_prompt_length": 2048}  # long prompts


def grpo_spec(preset: str = "7b-lora-ddp", **changes):
    return set_paths(load_preset(preset), {**GRPO, **changes})


def predict(spec, gpu: str = "A100-80GB"):
    job = Job.from_values(input_values(spec))
    return speed.predict(job, speed.Hardware.named(gpu), speed.schedule_of(spec, None))


def generation_gb(e) -> float:
    return e.breakdown["generation"] + e.breakdown["generation_gathered"]


# ---------------------------------------------------------------- memory


def test_grpo_trains_on_prompt_plus_answer_and_its_memory_grows_with_the_answer():
    sft = estimate(load_preset("7b-lora-ddp"))
    short = estimate(grpo_spec(**{"grpo.max_completion_length": 256}))
    long = estimate(grpo_spec(**{"grpo.max_completion_length": 4096}))
    assert sft.per_gpu_gb < short.per_gpu_gb < long.per_gpu_gb
    assert sft.breakdown["activations"] < short.breakdown["activations"] < long.breakdown["activations"]
    job = Job.from_values(input_values(grpo_spec(**{"grpo.max_completion_length": 256})))
    assert job.seq_len == 2048 + 256 and job.tokens == 2 * (2048 + 256)  # batch 2 x (prompt + answer)


def test_grpo_memory_grows_with_the_answers_written_at_once():
    """TRL writes per_device_train_batch_size x gradient_accumulation_steps answers per GPU in one go: the KV cache
    grows with them though the step's activations (one micro batch) do not."""
    few = estimate(grpo_spec(**{"training.gradient_accumulation_steps": 4}))
    many = estimate(grpo_spec(**{"training.gradient_accumulation_steps": 32}))
    assert few.breakdown["activations"] == many.breakdown["activations"]
    assert many.breakdown["generation"] > few.breakdown["generation"]
    assert many.per_gpu_gb > few.per_gpu_gb + 10  # 64 answers of 2,304 tokens: GBs of KV cache and prefill
    assert any("GRPO writes 64 answers at once per GPU" in note for note in many.notes)
    assert TERMS["generation"] == "Generation: KV cache and logits (GRPO)"


def test_generation_counts_only_what_it_holds_beyond_the_steps_activations():
    """The KV cache is freed before the step's forward: the peak is the larger moment, not the sum."""
    e = estimate(grpo_spec(**{"grpo.max_completion_length": 16, "training.gradient_accumulation_steps": 1}))
    assert e.breakdown["generation"] == 0  # two short answers fit in what the activations take later
    assert any("GRPO writes 2 answers at once per GPU" in note and "no more at the peak" in note for note in e.notes)


def test_a_kl_weight_on_a_full_fine_tune_adds_a_reference_the_size_of_the_weights_and_none_with_lora():
    full = grpo_spec("7b-full-zero2", **{"grpo.beta": 0.04})
    with_kl = estimate(full)
    without = estimate(set_paths(full, {"grpo.beta": 0.0}))
    weights_gb = Job.from_values(input_values(full)).arch.num_parameters * 2 / GIB  # bf16, whole under ZeRO-2
    assert with_kl.breakdown["reference"] == pytest.approx(weights_gb, rel=0.01)
    assert with_kl.load_breakdown["reference"] == pytest.approx(weights_gb, rel=0.01)
    assert without.breakdown["reference"] == 0 and without.load_breakdown["reference"] == 0
    assert with_kl.per_gpu_gb - without.per_gpu_gb == pytest.approx(weights_gb, rel=0.05)
    assert any("grpo.beta=0" in note for note in with_kl.notes)
    lora = estimate(grpo_spec(**{"grpo.beta": 0.04}))  # the base with the adapters off is the reference
    assert lora.breakdown["reference"] == 0 and lora.load_breakdown["reference"] == 0
    sft = estimate(load_preset("7b-full-zero2"))
    assert sft.breakdown["reference"] == 0  # SFT never has one


def test_zero3_gathers_the_whole_model_to_write_the_answers():
    """GRPOConfig.ds3_gather_for_generation (default True): every GPU holds the whole model while it writes."""
    zero3 = estimate(grpo_spec(**{"strategy.kind": "zero3", "grpo.max_prompt_length": 512}))
    assert zero3.breakdown["generation_gathered"] > 5  # most of Qwen2.5-7B's 14.2 GB beyond the 4-GPU shard
    assert any("GB of weights gathered (ZeRO-3)" in note for note in zero3.notes)
    ddp = estimate(grpo_spec(**{"grpo.max_prompt_length": 512}))
    assert ddp.breakdown["generation_gathered"] == 0  # DDP holds the whole model anyway
    sft_zero3 = estimate(set_paths(load_preset("7b-lora-ddp"), {"strategy.kind": "zero3"}))
    assert sft_zero3.breakdown["generation_gathered"] == sft_zero3.breakdown["generation"] == 0


# ---------------------------------------------------------------- step time


def test_grpo_steps_take_longer_than_sft_and_grow_with_the_answer():
    sft = predict(load_preset("7b-lora-ddp"))
    short = predict(grpo_spec(**{"grpo.max_completion_length": 128}))
    long = predict(grpo_spec(**{"grpo.max_completion_length": 1024}))
    assert "generation" not in sft.parts  # SFT's figures are untouched
    assert sft.step_time_s < short.step_time_s < long.step_time_s
    assert long.parts["generation"] > 6 * short.parts["generation"]  # a decode step per answer token
    assert short.step_time_s == pytest.approx(sum(short.parts.values()))


def test_generation_time_scales_inversely_with_the_memory_bandwidth():
    spec = grpo_spec()  # 8 answers of a 7B model at once: decoding is memory-bound
    a100, h200 = predict(spec, "A100-80GB").parts["generation"], predict(spec, "H200").parts["generation"]
    assert h200 / a100 == pytest.approx(HBM_TBPS["A100-80GB"] / HBM_TBPS["H200"], rel=0.01)


def test_fsdp_gathers_every_layer_for_each_token_written():
    ddp = predict(grpo_spec(), "H100")
    fsdp = predict(grpo_spec(**{"strategy.kind": "fsdp"}), "H100")
    assert fsdp.parts["generation"] > 2 * ddp.parts["generation"]
    assert any("FSDP gathers every layer again for each token" in note for note in fsdp.notes)


def test_every_gpu_with_a_peak_has_a_memory_bandwidth():
    assert {row[0] for row in flops.GPU_TABLE} == set(HBM_TBPS)


def test_steps_from_rows_count_each_prompts_answers():
    spec = grpo_spec(**{"grpo.num_generations": 8})  # global batch 2 x 4 x 4 = 32 answers: 4 prompts a step
    assert speed.schedule_of(spec, 3200).steps == 800
    assert "x 8 answers" in speed.schedule_of(spec, 3200).steps_source


def test_grpo_runs_do_not_calibrate_the_speed(tmp_path):
    """A GRPO run's tokens/s depends on how long its answers came out: it says nothing about the next prediction."""
    spec = grpo_spec()
    fake_gpu_run(tmp_path / "runs", "20260101-000000-aaaaaa", spec, 1000.0, 20.0)
    assert calibration(tmp_path / "runs", "A100-80GB") is None


def test_the_estimate_command_shows_generation_in_memory_and_step_time():
    result = subprocess.run(
        [TUNEDECK, "estimate", "7b-lora-ddp", "--set", "objective=grpo", "--set", "dataset.format=prompt-only",
         "--set", "training.per_device_train_batch_size=8", "--gpu", "H100", "--json"],
        capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    current = json.loads(result.stdout)["current"]
    parts = current["step_parts_s"]
    assert parts["generation"] > 0 and current["step_time_s"] == pytest.approx(sum(parts.values()), abs=0.01)
    assert {"generation", "generation_gathered"} <= set(current["breakdown"])


def test_the_memory_chart_draws_every_term_grpo_included():
    from tunedeck.app.estimate_view import TERM_COLORS, estimate_figure
    from tunedeck.backend.estimate.advisor import advise

    assert set(TERMS) <= set(TERM_COLORS)  # a term without a colour would break the chart
    spec = grpo_spec(**{"training.gradient_accumulation_steps": 32, "strategy.kind": "zero3"})
    figure = estimate_figure(advise(spec, 80))
    names = {trace.name for trace in figure.data}
    assert {TERMS["generation"], TERMS["generation_gathered"]} <= names
