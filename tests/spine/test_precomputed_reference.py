"""preference.precompute_ref_log_probs: DPO's and KTO's reference scores every row once, before training.

tests/runs/test_smoke_presets.py runs it on each engine (the start record says "scored before training", read
from the live trainer); here each layer says what a user sees of it: the form, the files TRL checks, the memory
and speed estimates, the warning for several machines and the run's facts line.
"""

from __future__ import annotations

import pytest

from tunedeck.backend.estimate import speed
from tunedeck.backend.estimate.memory import estimate
from tunedeck.backend.estimate.memory_job import Job, input_values
from tunedeck.backend.render import render_bundle, write_bundle
from tunedeck.backend.render.bundle_check import check_bundle
from tunedeck.backend.runs.summary import facts_line
from tunedeck.backend.spec import resolve_spec, set_paths
from tunedeck.backend.spec.applies import applies
from tunedeck.backend.spec.fields import values_from_spec
from tunedeck.backend.validate import validate

PRECOMPUTED = {"preference.precompute_ref_log_probs": True}
DPO = {"objective": "dpo", "dataset.format": "preference"}
KTO = {"objective": "kto", "dataset.format": "unpaired-preference", "training.per_device_train_batch_size": 2}
FIELD = "preference.precompute_ref_log_probs"


def predicted(spec):
    job = Job.from_values(input_values(spec))
    return speed.predict(job, speed.Hardware.named("H100"), speed.schedule_of(spec, 10_000))


def test_the_form_offers_it_for_dpo_and_kto_and_the_bundle_hands_it_to_trl(tmp_path):
    lora = resolve_spec("7b-lora-ddp")
    assert not applies(FIELD, values_from_spec(lora))  # SFT has no reference
    for objective in (DPO, KTO):
        spec = set_paths(lora, {**objective, **PRECOMPUTED})
        assert applies(FIELD, values_from_spec(spec))
        folder = tmp_path / spec.objective
        write_bundle(render_bundle(spec), folder)
        config = check_bundle(folder).sft_config  # TRL's own DPOConfig / KTOConfig, built from training_args.yaml
        assert type(config).__name__ == f"{spec.objective.upper()}Config" and config.precompute_ref_log_probs
    sft_args = render_bundle(set_paths(lora, PRECOMPUTED))["training_args.yaml"]
    assert "precompute_ref_log_probs" not in sft_args  # SFTConfig has no such argument


@pytest.mark.parametrize("objective", [DPO, KTO], ids=["dpo", "kto"])
def test_a_full_fine_tune_holds_no_reference_copy_and_its_steps_skip_the_reference(objective):
    full = set_paths(resolve_spec("7b-full-zero2"), objective)
    kept, precomputed = estimate(full), estimate(set_paths(full, PRECOMPUTED))
    assert kept.breakdown["reference"] > 13  # GiB: a 16-bit 7B copy on every GPU under ZeRO-2
    assert precomputed.breakdown["reference"] == 0
    assert kept.per_gpu_gb - precomputed.per_gpu_gb == pytest.approx(kept.breakdown["reference"], rel=0.15)
    before, after = predicted(full), predicted(set_paths(full, PRECOMPUTED))
    # A full step's forward and backward are 3 forwards' FLOPs a token and checkpointing recomputes one (4): DPO's
    # reference adds one (5), KTO's reference two and the model's KL answer one (7); scores computed before training
    # take the reference's away: 4 of 5, 5 of 7.
    ratio = after.parts["compute"] / before.parts["compute"]
    assert ratio == pytest.approx(4 / 5 if full.objective == "dpo" else 5 / 7, abs=0.02)
    # Paid once instead: every row's reference forward before the first step, in the time to finish.
    assert before.around_s["reference"] == 0 and after.around_s["reference"] > 0
    assert after.around_s["reference"] < 0.5 * before.step_time_s * before.steps  # one forward vs each step's


def test_with_adapters_there_is_no_copy_to_save_but_the_steps_are_faster():
    lora = set_paths(resolve_spec("7b-lora-ddp"), DPO)
    assert estimate(set_paths(lora, PRECOMPUTED)).breakdown["reference"] == estimate(lora).breakdown["reference"] == 0
    assert predicted(set_paths(lora, PRECOMPUTED)).step_time_s < predicted(lora).step_time_s


def test_several_machines_are_told_where_the_scores_are_kept():
    spec = set_paths(resolve_spec("7b-full-zero2"), {**DPO, **PRECOMPUTED})
    assert not [p for p in validate(spec) if p.field == FIELD]
    (problem,) = [p for p in validate(set_paths(spec, {"launch.num_machines": 2})) if p.field == FIELD]
    assert problem.level == "warning" and "HF_DATASETS_CACHE" in problem.message


def test_the_runs_facts_line_says_the_reference_was_scored_before_training():
    start = {"world_size": 2, "nodes": ["a", "a"], "distributed_type": "DEEPSPEED", "zero_stage": 3,
             "objective": "dpo", "method": "full", "reference": "scored before training"}  # fmt: skip
    assert "DPO, reference: scored before training" in facts_line(start)


def test_loading_a_full_dpo_holds_the_reference_beside_the_model_unless_its_scores_come_first():
    sft = set_paths(resolve_spec("7b-full-zero2"), {"strategy.kind": "ddp"})
    dpo = set_paths(sft, DPO)
    plain, kept, scored = estimate(sft), estimate(dpo), estimate(set_paths(dpo, PRECOMPUTED))
    # Every rank reads the reference into host RAM beside the model, then moves it to its GPU whole.
    assert kept.load_breakdown["reference"] == pytest.approx(plain.load_breakdown["weights"])
    assert kept.load_cpu_gb == pytest.approx(2 * plain.load_cpu_gb, rel=0.01)
    assert scored.load_breakdown["reference"] == 0 and scored.load_cpu_gb == pytest.approx(plain.load_cpu_gb)
    # zero.Init shards it as it loads, and rank 0 reads its checkpoint once the model's is gone.
    zero3 = estimate(set_paths(dpo, {"strategy.kind": "zero3"}))
    assert zero3.load_breakdown["reference"] == pytest.approx(zero3.load_breakdown["weights"])
    assert zero3.load_cpu_gb == pytest.approx(estimate(set_paths(sft, {"strategy.kind": "zero3"})).load_cpu_gb)
    # FSDP shards the model only when training starts: a copy scores the rows first, so it still loads one.
    fsdp = set_paths(dpo, {"strategy.kind": "fsdp", **PRECOMPUTED})
    assert estimate(fsdp).load_breakdown["reference"] > 0 and estimate(fsdp).breakdown["reference"] == 0
