"""`tunedeck train PRESET --smoke` for every preset: 2 CPU ranks, exit 0, and the start record proves the strategy
(the demo objectives' presets are proven by their learning runs instead: LEARNING_RUNS below).

Each smoke run is the preset's exact path (strategy, quantization, LoRA targets, wrap class,
checkpointing) on a 2-layer random-weight model of the same architecture, 3 steps. The
start record is the proof: what the run got, read from the live objects.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tunedeck.backend.runs.startup import read_phases
from tunedeck.backend.spec import flops, load_presets

from .helpers import log_records, logs_tail, repeated_warnings, start_record
from .preset_proof import DDP, FSDP2, ONE_DTYPE, PROOF, assert_proves, deepspeed

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

BIN = Path(sys.executable).parent


def smoke(preset: str, tmp_path: Path, *assignments: str) -> tuple[subprocess.CompletedProcess, Path]:
    """`tunedeck train PRESET --smoke [--set A ...]`: the finished process and its run folder."""
    runs_dir = tmp_path / "runs"
    sets = [arg for assignment in assignments for arg in ("--set", assignment)]
    result = subprocess.run(
        [str(BIN / "tunedeck"), "train", preset, "--smoke", "--runs-dir", str(runs_dir), *sets],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        timeout=500,
    )
    (run_dir,) = [p for p in runs_dir.iterdir() if p.is_dir()]
    assert result.returncode == 0, result.stdout + result.stderr + logs_tail(run_dir)
    assert repeated_warnings(run_dir) == {}, "a rank log repeats a library's warning: it buries the log's lines"
    return result, run_dir


# The demo objectives' presets (demo-dpo, demo-kto, ...) train the demo model, a toy already: their learning runs
# execute each preset's exact path and assert its PROOF (LEARNING_RUNS); their smoke runs would repeat that path on a
# smaller copy of the same toy. The demo preset's smoke run stands for the --smoke gesture on all of them.
LEARNING_RUNS = {
    "demo-dpo": "test_dpo.py",
    "demo-kto": "test_kto.py",
    "demo-grpo": "test_grpo.py",
    "demo-orpo": "test_reference_free.py",
    "demo-simpo": "test_reference_free.py",
}
SMOKED = sorted(set(load_presets()) - set(LEARNING_RUNS))


def test_every_preset_is_proven_by_a_smoke_run_or_its_learning_run():
    here = Path(__file__).parent
    for preset, test_file in LEARNING_RUNS.items():
        assert preset in load_presets(), f"{preset} is no preset any more: take it out of LEARNING_RUNS"
        text = (here / test_file).read_text()
        assert "assert_proves(" in text and preset.removeprefix("demo-") in text, f"{test_file} proves no {preset}"
    assert set(SMOKED) | set(LEARNING_RUNS) == set(load_presets()) and set(PROOF) == set(load_presets())


@pytest.mark.parametrize("preset", SMOKED)
def test_smoke_run_of_every_preset_passes_and_proves_its_strategy(preset, tmp_path):
    result, run_dir = smoke(preset, tmp_path)
    verdict = result.stdout.strip().splitlines()[-1]
    assert verdict.startswith("smoke test passed: 2 ranks on 1 machine"), verdict
    assert_proves(preset, start_record(run_dir))
    assert [r["step"] for r in log_records(run_dir)] == [1, 2, 3]
    assert (run_dir / "output" / "checkpoint-3").is_dir()  # the strategy's checkpoint path ran too

    listing = subprocess.run(
        [str(BIN / "tunedeck"), "runs", "--runs-dir", str(run_dir.parent)], capture_output=True, text=True
    )
    assert run_dir.name in listing.stdout and "finished" in listing.stdout and "smoke/" in listing.stdout
    show = subprocess.run(
        [str(BIN / "tunedeck"), "runs", "show", run_dir.name, "--runs-dir", str(run_dir.parent)],
        capture_output=True,
        text=True,
    )
    assert f"verdict  {verdict}" in show.stdout, show.stdout


OBJECTIVE_DATA = {
    "dpo": ("objective=dpo", "dataset.format=preference"),
    "kto": ("objective=kto", "dataset.format=unpaired-preference", "training.per_device_train_batch_size=2"),
    "grpo": ("objective=grpo", "dataset.format=prompt-only"),
    "orpo": ("objective=orpo", "dataset.format=preference"),
    "simpo": ("objective=simpo", "dataset.format=preference"),
}


# Full DPO and KTO keep a frozen reference copy, prepared by each engine as the model is: sharded and wrapped by
# DeepSpeed, sharded by FSDP2, a plain copy on each DDP rank (evaluation mode: not wrapped). With adapters the
# reference is the base with the adapters off: no copy, here under FSDP2 and sharded QLoRA. TRL's two trainers
# prepare their reference alike, so each way runs here once, on one of them; by hand all ten passed (and the full
# fine-tune on ZeRO-2, QLoRA on DDP and on FSDP: the same two ways to a reference).
PRECOMPUTE, SCORED = "preference.precompute_ref_log_probs=true", {"reference": "scored before training"}
REFERENCE_PATHS = {
    "dpo-full-zero3": ("7b-full-zero2", ("strategy.kind=zero3",), {**deepspeed(3), "reference": "DeepSpeedEngine"}),
    "kto-full-fsdp": (
        "7b-full-zero2",
        ("strategy.kind=fsdp",),
        {"fsdp_version": 2, "reference": "FSDPQwen2ForCausalLM"},
    ),
    "dpo-full-ddp": ("7b-full-zero2", ("strategy.kind=ddp",), {**DDP, "reference": "Qwen2ForCausalLM"}),
    "dpo-lora-fsdp": ("13b-lora-fsdp", (), {**FSDP2, "reference": "adapters off"}),
    "kto-qlora-zero3": ("70b-qlora-zero3", (), {**deepspeed(3), **ONE_DTYPE, "reference": "adapters off"}),
    # preference.precompute_ref_log_probs: each row scored before the first step, then no reference at all. Each
    # engine has its own way: ZeRO-3 scores with a DeepSpeed inference engine around the model, DDP with the model
    # itself, FSDP2 (whose model is sharded only when training starts) with a sharded copy that train.py then drops;
    # with adapters, the model with the adapters off.
    "dpo-full-zero3-precomputed": ("7b-full-zero2", ("strategy.kind=zero3", PRECOMPUTE), {**deepspeed(3), **SCORED}),
    "kto-full-fsdp-precomputed": ("7b-full-zero2", ("strategy.kind=fsdp", PRECOMPUTE), {"fsdp_version": 2, **SCORED}),
    "dpo-full-ddp-precomputed": ("7b-full-zero2", ("strategy.kind=ddp", PRECOMPUTE), {**DDP, **SCORED}),
    "kto-lora-fsdp-precomputed": ("13b-lora-fsdp", (PRECOMPUTE,), {**FSDP2, **SCORED}),
}


@pytest.mark.parametrize("path", REFERENCE_PATHS)
def test_preference_smoke_runs_on_each_engine_with_its_reference(path, tmp_path):
    preset, changes, proof = REFERENCE_PATHS[path]
    objective, method = path.split("-")[:2]
    result, run_dir = smoke(preset, tmp_path, *OBJECTIVE_DATA[objective], *changes)
    assert result.stdout.strip().splitlines()[-1].startswith("smoke test passed: 2 ranks on 1 machine")
    start = start_record(run_dir)
    assert start["gate"]["passed"] and start["objective"] == objective and start["method"] == method
    for key, value in proof.items():
        assert start[key] == value, f"{preset} {objective}: {key} is {start[key]!r}, expected {value!r}"
    precomputed = PRECOMPUTE in changes
    assert start["flops_inputs"]["extra_forwards"] == flops.extra_forwards(objective, precomputed)
    # Before step 1 the run said when it loaded a reference copy, and when it scored every row with one.
    phases = [phase for phase, _ in read_phases(run_dir)]
    copy = method == "full" and (not precomputed or "fsdp" in path)
    assert ("loading the reference model" in phases) == copy, phases
    assert ("tokenizing the data, then scoring every row with the reference" in phases) == precomputed, phases
    logs = log_records(run_dir)
    assert [r["step"] for r in logs] == [1, 2, 3]
    assert all("reward_margin" in r for r in logs)
    if objective == "dpo":
        assert all(0 <= r["reward_accuracy"] <= 1 for r in logs)
    else:
        assert all(r["kl"] >= 0 and "reward_accuracy" not in r for r in logs)


# ORPO and SimPO score no reference: each engine runs the pair's two answers through the model alone, full or with
# adapters. DDP runs in the presets' smoke runs above (demo-orpo, demo-simpo); here ZeRO-3 and FSDP2.
REFERENCE_FREE_PATHS = {
    "orpo-full-zero3": ("7b-full-zero2", ("strategy.kind=zero3",), deepspeed(3)),
    "orpo-lora-fsdp": ("13b-lora-fsdp", (), FSDP2),
    "simpo-full-fsdp": ("7b-full-zero2", ("strategy.kind=fsdp",), {"fsdp_version": 2}),
    # TRL's experimental trainers (ORPO, CPO) run peft's prepare_model_for_kbit_training on a 4-bit base
    # (trl/experimental/cpo/cpo_trainer.py): the norms, embeddings and head (7 tensors here) turn float32.
    "simpo-qlora-zero3": ("70b-qlora-zero3", (), {**deepspeed(3), "frozen_dtypes": {"float32": 7, "bfloat16": 14}}),
}


@pytest.mark.parametrize("path", REFERENCE_FREE_PATHS)
def test_reference_free_smoke_runs_on_each_engine_with_no_reference(path, tmp_path):
    preset, changes, proof = REFERENCE_FREE_PATHS[path]
    objective, method = path.split("-")[:2]
    result, run_dir = smoke(preset, tmp_path, *OBJECTIVE_DATA[objective], *changes)
    assert result.stdout.strip().splitlines()[-1].startswith("smoke test passed: 2 ranks on 1 machine")
    start = start_record(run_dir)
    assert start["gate"]["passed"] and start["objective"] == objective and start["method"] == method
    for key, value in {**proof, "reference": None}.items():
        assert start[key] == value, f"{path}: {key} is {start[key]!r}, expected {value!r}"
    assert start["flops_inputs"]["extra_forwards"] == 0 and start["flops_inputs"]["sequences_per_row"] == 2
    assert "loading the reference model" not in [phase for phase, _ in read_phases(run_dir)]
    logs = log_records(run_dir)
    assert [r["step"] for r in logs] == [1, 2, 3]
    assert all(0 <= r["reward_accuracy"] <= 1 and "kl" not in r for r in logs)
    assert all(("log_odds_ratio" in r and "nll_loss" in r) == (objective == "orpo") for r in logs)


# GRPO writes its answers with the model as each engine holds it: ZeRO-3 gathers the sharded weights for the
# generation (GRPOConfig.ds3_gather_for_generation), FSDP2 gathers them as its forward does, DDP uses its copy.
# A KL weight (grpo.beta > 0) adds the reference: the base with the adapters off, or a copy TRL loads and each
# engine prepares as DPO's (without one, none at all).
KL = "grpo.beta=0.04"
GRPO_PATHS = {
    "full-zero3": ("7b-full-zero2", ("strategy.kind=zero3",), {**deepspeed(3), "reference": None}),
    "lora-fsdp": ("13b-lora-fsdp", (), {**FSDP2, "reference": None}),
    "qlora-zero3-kl": ("70b-qlora-zero3", (KL,), {**deepspeed(3), **ONE_DTYPE, "reference": "adapters off"}),
    "full-ddp-kl": ("7b-full-zero2", ("strategy.kind=ddp", KL), {**DDP, "reference": "Qwen2ForCausalLM"}),
    "full-fsdp-kl": (
        "7b-full-zero2",
        ("strategy.kind=fsdp", KL),
        {"fsdp_version": 2, "reference": "FSDPQwen2ForCausalLM"},
    ),
}


@pytest.mark.parametrize("path", GRPO_PATHS)
def test_grpo_smoke_runs_on_each_engine_with_its_generation_and_reference(path, tmp_path):
    preset, changes, proof = GRPO_PATHS[path]
    result, run_dir = smoke(preset, tmp_path, *OBJECTIVE_DATA["grpo"], *changes)
    assert result.stdout.strip().splitlines()[-1].startswith("smoke test passed: 2 ranks on 1 machine")
    start = start_record(run_dir)
    assert start["gate"]["passed"] and start["objective"] == "grpo" and start["method"] == path.split("-")[0]
    for key, value in proof.items():
        assert start[key] == value, f"{path}: {key} is {start[key]!r}, expected {value!r}"
    assert start["flops_inputs"]["extra_forwards"] == flops.extra_forwards("grpo", kl_reference=KL in changes)
    logs = log_records(run_dir)
    assert [r["step"] for r in logs] == [1, 2, 3]
    assert all("reward" in r and set(r["rewards"]) == {"exact_answer"} for r in logs)
    assert all(("kl" in r) == (KL in changes) for r in logs)
