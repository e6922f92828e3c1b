"""The memory estimate against published, measured peaks (tests/data/measured_peaks.yaml).

The comparison lives in bench/estimate_accuracy.py and the fit of the allocator's constants in bench/fit_memory.py,
the commands docs/estimates.md quotes, so the tests and the guide's figures cannot drift apart.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import sys
from pathlib import Path

import pytest

from tunedeck.backend.estimate.memory_allocator import FITTED
from tunedeck.backend.estimate.memory_software import SOFTWARE
from tunedeck.backend.spec import catalog

ROOT = Path(__file__).resolve().parents[2]


def _bench(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "bench" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


accuracy = _bench("estimate_accuracy")
fit_memory = _bench("fit_memory")
ROWS = accuracy.load_rows()
FIT_ROWS, HELD_OUT = accuracy.split(ROWS)
REQUIRED = ("id", "model", "method", "strategy", "gpus", "micro_batch", "seq_len", "measured", "unit", "measure")
REQUIRED += ("software", "source", "quote")


def test_the_table_holds_forty_sourced_runs_of_five_publishers():
    assert len(ROWS) >= 40 and len({r["id"] for r in ROWS}) == len(ROWS)
    assert len({accuracy.publisher(r) for r in ROWS}) >= 5
    for row in ROWS:
        missing = [k for k in REQUIRED if row.get(k) in (None, "")]
        assert not missing, f"{row['id']}: missing {missing}"
        assert row["source"].startswith("https://github.com/"), row["id"]
        assert row["unit"] in accuracy.UNIT_BYTES and row["measure"] in ("allocated", "reserved", "device")
        assert row.get("phase", "peak") in ("peak", "train", "load"), row["id"]
        assert row["software"] in SOFTWARE and row.get("gpu", "RTX 3090") in accuracy.GPU_MIB, row["id"]
        assert catalog.lookup(row["model"]) is not None, row["id"]


def test_the_table_covers_strategies_methods_and_single_gpu_runs():
    kinds = {accuracy.row_spec(r).strategy.kind for r in ROWS}
    assert {"ddp", "fsdp", "zero3"} <= kinds
    assert {"full", "lora", "qlora"} <= {r["method"] for r in ROWS}
    assert any(accuracy.row_spec(r).strategy.offload_params == "cpu" for r in ROWS)
    single = [r for r in ROWS if r["gpus"] == 1]
    assert len(single) >= 12 and {"lora", "qlora"} <= {r["method"] for r in single}


def test_a_third_of_each_publishers_rows_is_held_out_by_a_fixed_rule():
    assert len(HELD_OUT) == len(ROWS) // 3 and not {r["id"] for r in HELD_OUT} & {r["id"] for r in FIT_ROWS}
    for name in {accuracy.publisher(r) for r in ROWS}:
        own = [r for r in ROWS if accuracy.publisher(r) == name]
        assert len([r for r in own if r in HELD_OUT]) == (len(own) + 1) // 3, name  # the 2nd, 5th ... by id hash
    # The rule depends on the ids only: the same rows are held out whatever their order in the file.
    assert accuracy.split(list(reversed(ROWS)))[1] == list(reversed(HELD_OUT))


def test_the_allocator_constants_are_the_fit_on_the_fit_rows_alone(monkeypatch):
    """FITTED is what bench/fit_memory.py finds on the fit rows; no held-out row reaches the fit, and changing the
    held-out rows' measurements changes nothing."""
    seen = []
    prepare = fit_memory.prepare
    monkeypatch.setattr(fit_memory, "prepare", lambda row: seen.append(row["id"]) or prepare(row))
    assert fit_memory.fit(FIT_ROWS) == FITTED
    assert set(seen) == {r["id"] for r in FIT_ROWS}
    tampered = [{**r, "measured": r["measured"] * 3} if r in HELD_OUT else r for r in ROWS]
    fit_rows, held = accuracy.split(tampered)
    assert [r["id"] for r in held] == [r["id"] for r in HELD_OUT]
    monkeypatch.setattr(fit_memory, "prepare", prepare)
    assert fit_memory.fit(fit_rows) == FITTED


def test_the_fit_predicts_every_row_as_the_estimator_does():
    """fit_memory adds the allocator term back in closed form; it must agree with the estimator itself."""
    other = dataclasses.replace(FITTED, activations=0.1, varying=0.4, communication=0.7, wrap=2.0)
    for row in ROWS:
        prepared = fit_memory.prepare(row)
        for constants in (FITTED, other):
            expected = accuracy.compare(row, constants).predicted_gib
            assert fit_memory.predicted(prepared, constants) == pytest.approx(expected, rel=1e-9), row["id"]


def test_the_held_out_third_is_predicted_within_the_mean_goal():
    """Issue 32's goal on runs the fit never saw: a mean absolute error under 8%; the fit rows too."""
    held = accuracy.summary([accuracy.compare(r) for r in HELD_OUT])
    fit = accuracy.summary([accuracy.compare(r) for r in FIT_ROWS])
    assert held.mean < accuracy.GOAL_MEAN and fit.mean < accuracy.GOAL_MEAN, (held.line("held"), fit.line("fit"))
    # Not a bound: the prediction is above some measurements and below others.
    errors = [accuracy.compare(r).error for r in ROWS]
    assert any(e > 0.02 for e in errors) and any(e < -0.02 for e in errors)


def test_the_held_out_third_is_predicted_within_the_largest_error_and_under_prediction_goals():
    """Issue 32's other goals on the held-out third: no error beyond 15%, no prediction more than 5% below its
    measurement (an out-of-memory the estimate did not warn of)."""
    held = accuracy.summary([accuracy.compare(r) for r in HELD_OUT])
    assert abs(held.worst.error) < accuracy.GOAL_WORST and held.under <= accuracy.GOAL_UNDER, held.line("held")


def _row(row_id: str) -> dict:
    return next(r for r in ROWS if r["id"] == row_id)


def test_litgpt_resource_tables_are_predicted_within_five_percent():
    """LitGPT's tables measured allocated tensors (no allocator share): a layer as torch 2.1.0 ran it keeps its
    RMSNorms' squared inputs too (mean saved its input before torch 2.2), and the 4-bit lm_head, quantized from fp16,
    holds an fp16 and a bf16 copy of its weight while it computes the logits."""
    rows = [r for r in ROWS if r["software"] == "litgpt-2023"]
    assert len(rows) == 7
    for row in rows:
        assert abs(accuracy.compare(row).error) < 0.05, row["id"]


def test_answerai_allocated_peak_grows_with_the_tokens_as_published():
    """8.28 GiB allocated at 512 tokens, 9.16 at 2048: the peak is the last layer's recomputation beside two
    gathered FSDP units and the fp32 logits train.py keeps, not the loss's backward (only the root unit gathered)."""
    short = accuracy.compare(_row("aai-lora-fsdp-llama2-7b-ctx512-allocated")).predicted_gib
    long = accuracy.compare(_row("aai-lora-fsdp-llama2-7b-ctx2048")).predicted_gib
    assert long - short == pytest.approx(9.16 - 8.28, abs=0.15)


def test_torchtune_init_counts_the_template_layer_its_builder_copies():
    for row_id in ("torchtune-lora-init-llama2-7b", "torchtune-lora-init-allocated-llama2-7b"):
        assert abs(accuracy.compare(_row(row_id)).error) < 0.01, row_id


def test_single_gpu_lora_and_qlora_runs_are_no_longer_all_over_predicted():
    """The review's finding: every single-GPU LoRA/QLoRA peak over-predicted by 12-26%. Frozen weights keep no
    input and frozen norms no normalised value; the adapters' copies are counted as PEFT makes them."""
    single = [accuracy.compare(r) for r in ROWS if r["gpus"] == 1 and r["method"] in ("lora", "qlora")]
    assert len(single) >= 12
    assert not any(r.error > 0.05 for r in single)
    assert abs(sum(r.error for r in single) / len(single)) < 0.08


def test_sharded_qlora_rows_are_compared_on_training_alone():
    # No published sharded-QLoRA run used transformers 5's load path, which holds the whole 4-bit model on every
    # GPU (see the table's header): these rows compare the training step, below what that load would show.
    for row in ROWS:
        spec = accuracy.row_spec(row)
        if row["method"] == "qlora" and spec.strategy.kind in ("fsdp", "zero3"):
            assert row.get("phase") == "train", row["id"]
            est = accuracy.row_estimate(row)
            assert accuracy.compare(row).predicted_gib <= est.phase_view(row["measure"], "train")
