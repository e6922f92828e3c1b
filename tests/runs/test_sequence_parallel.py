"""Sequence parallelism for real: 2 CPU ranks share each sequence (DeepSpeed Ulysses) and learn what one process learns.

Ulysses cuts every row in two along the sequence; each rank computes the attention of half the
heads over the whole row (all-to-all, over gloo here) and the rest on its half. The proof that it
is right, not only that it runs: the same demo job on one process gives the same loss at every step.
The smoke paths (sharded QLoRA, a full fine-tune) run each engine's load with Ulysses on.
"""

from __future__ import annotations

import pytest

from tunedeck.backend.runs.summary import facts_line
from tunedeck.backend.spec import resolve_spec

from .helpers import log_records, repeated_warnings, start_record
from .preset_proof import ONE_DTYPE, deepspeed
from .test_smoke_presets import smoke
from .test_training_runs import assert_finished, run_to_end

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

STEPS = 12
ULYSSES = ["strategy.kind=zero3", "strategy.sequence_parallel=2", "dataset.packing=false"]


def train(runs_dir, *changes: str) -> tuple[dict, list[dict]]:
    """(start record, log records) of the demo trained STEPS steps with `changes`."""
    spec = resolve_spec("demo", [f"training.max_steps={STEPS}", "training.logging_steps=1", *changes])
    manager, run_id, status = run_to_end(runs_dir, spec)
    assert_finished(manager, run_id, status)
    run_dir = manager.run_dir(run_id)
    assert repeated_warnings(run_dir) == {}  # ZeRO-3's deprecated collectives once per rank, not once per step
    return start_record(run_dir), log_records(run_dir)


def test_two_ranks_sharing_each_sequence_learn_what_one_process_learns(runs_dir):
    start, shared = train(runs_dir, *ULYSSES)
    assert (start["world_size"], start["zero_stage"], start["sequence_parallel"]) == (2, 3, 2)
    assert start["gate"]["passed"]
    assert "2 ranks · DeepSpeed ZeRO-3 + 2 GPUs per sequence" in facts_line(start)

    alone_start, alone = train(runs_dir, *ULYSSES[:1], "dataset.packing=false", "launch.num_processes=1")
    assert (alone_start["world_size"], alone_start["sequence_parallel"]) == (1, 1)

    # The two ranks read their rows as one data-parallel group: the same rows, step for step, as one process ...
    assert [r["step"] for r in shared] == [r["step"] for r in alone] == list(range(1, STEPS + 1))
    assert [r["num_tokens"] for r in shared] == [r["num_tokens"] for r in alone]
    # ... and the same loss: attention over the gathered heads is the whole row's attention.
    for together, single in zip(shared, alone, strict=True):
        assert together["loss"] == pytest.approx(single["loss"], rel=1e-4), (together, single)
    assert min(r["loss"] for r in shared[-4:]) < shared[0]["loss"] / 2  # and it learns


SMOKE_PATHS = {
    # 4-bit base sharded by ZeRO-3 (bf16 storage), adapters on it
    "qlora-zero3": ("70b-qlora-zero3", (), {**deepspeed(3), **ONE_DTYPE, "method": "qlora"}),
    # every weight trains; ZeRO-2 keeps whole weights per GPU and shards gradients and optimizer states
    "full-zero2": ("7b-full-zero2", (), {**deepspeed(2), "method": "full"}),
    # what the advisor offers when rows are long and memory tight: the optimizer in CPU RAM (DeepSpeed's CPU Adam)
    "lora-zero3-cpu-optimizer": (
        "7b-lora-ddp",
        ("strategy.offload_optimizer=cpu",),
        {**deepspeed(3), "method": "lora"},
    ),
}


@pytest.mark.parametrize("path", SMOKE_PATHS)
def test_ulysses_smoke_runs_on_each_load_path(path, tmp_path):
    preset, changes, proof = SMOKE_PATHS[path]
    kind = f"strategy.kind=zero{proof['zero_stage']}"
    result, run_dir = smoke(preset, tmp_path, kind, *ULYSSES[1:], *changes)
    assert result.stdout.strip().splitlines()[-1].startswith("smoke test passed: 2 ranks on 1 machine")
    start = start_record(run_dir)
    assert start["gate"]["passed"] and start["sequence_parallel"] == 2
    for key, value in proof.items():
        assert start[key] == value, f"{path}: {key} is {start[key]!r}, expected {value!r}"
    assert [r["step"] for r in log_records(run_dir)] == [1, 2, 3]
