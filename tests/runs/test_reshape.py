"""Resume on another shape keeps the global batch (backend/runs/reshape.py); what cannot is said with its fix.
The real 2 -> 1 and 1 -> 2 process resumes: tests/runs/test_resume_shape.py."""

from __future__ import annotations

import pytest

from tunedeck.backend.runs import RunError, reshaped
from tunedeck.backend.spec import resolve_spec, set_paths


def demo(**changes):
    return set_paths(resolve_spec("demo"), changes) if changes else resolve_spec("demo")


def test_fewer_processes_accumulate_more_and_the_global_batch_stays():
    job = demo()  # 2 processes x 2 rows x 1 step = 4 rows a step
    one, said = reshaped(job, 1, None)
    assert (one.launch.num_processes, one.training.gradient_accumulation_steps) == (1, 2)
    assert one.global_batch_size == job.global_batch_size == 4
    assert said == "on 1 process (1 machine) instead of 2, gradient accumulation 1 → 2: the global batch stays 4"
    back, _ = reshaped(one, 2, None)
    assert back.training.gradient_accumulation_steps == 1 and back.global_batch_size == 4


def test_the_same_shape_changes_nothing():
    job = demo()
    assert reshaped(job, None, None) == (job, "")
    assert reshaped(job, 2, 1) == (job, "")


@pytest.mark.parametrize(
    ("changes", "processes", "said"),
    [
        ({"launch.num_processes": 1, "training.gradient_accumulation_steps": 3}, 2, "set it to a divisor of 3"),
        ({"launch.num_processes": 1, "training.per_device_train_batch_size": 3}, 2, "on a number of processes that divides 3"),
        ({"strategy.kind": "zero3", "strategy.offload_optimizer": "nvme", "strategy.nvme_path": "/tmp"}, 1, "offloaded to NVMe is kept per process and loads only on the 2 processes it was saved on: resume it on 2"),
    ],
)  # fmt: skip
def test_what_cannot_keep_its_batch_or_load_is_refused_with_its_fix(changes, processes, said):
    with pytest.raises(RunError, match=said):
        reshaped(demo(**changes), processes, None)


@pytest.mark.parametrize("kind", ["zero2", "zero3", "fsdp"])
def test_sharded_checkpoints_go_on_another_number_of_processes(kind):
    one, said = reshaped(demo(**{"strategy.kind": kind}), 1, None)  # the recipe makes the shards load (reshard.py)
    assert one.launch.num_processes == 1 and one.global_batch_size == 4 and "the global batch stays 4" in said


def test_processes_divide_over_the_machines():
    with pytest.raises(RunError, match="--num-processes 3 does not divide over 2 machines"):
        reshaped(demo(), 3, 2)
