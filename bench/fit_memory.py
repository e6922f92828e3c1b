"""Fit the memory model's only empirical constants, the caching allocator's shares, on the published peaks.

    .venv/bin/python bench/fit_memory.py

Every other term of backend/memory*.py is counted from the job and the code of the software that trains it. What
PyTorch's caching allocator reserves beyond its tensors is not: it depends on how freed blocks fragment.
AllocatorConstants (backend/memory_train.py) holds it as two shares: of the step's activations and loss tensors, and
of the communication buffers (FSDP's gathered units, gradient buckets). `fit` takes the fit rows only (bench/estimate_accuracy.py's `split`,
fixed before fitting) and searches a grid of the shares for the least weighted absolute error, an under-prediction
weighing UNDER_WEIGHT times an over-prediction (it is an out-of-memory the user was not warned of). The constants
it prints are what memory_train.FITTED holds.

The allocator term is linear in the shares, so each row is estimated once without it (`prepare`) and `predicted`
adds it back the way Estimate.phase_view and estimate_accuracy.measured_view combine the terms;
tests/estimate/test_published.py checks that the two agree on every row.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import estimate_accuracy as accuracy

from tunedeck.backend.memory import LOAD_TENSOR_TERMS, TENSOR_TERMS
from tunedeck.backend.memory_train import FITTED, AllocatorConstants

UNDER_WEIGHT = 3.0
GRID_ACTIVATIONS = [i / 100 for i in range(101)]  # 0 .. 1 of the step's activations and loss tensors
GRID_COMMUNICATION = [i / 20 for i in range(41)]  # 0 .. 2 of the gathered units and buckets
NONE = AllocatorConstants(activations=0.0, communication=0.0)


@dataclasses.dataclass(frozen=True)
class Prepared:
    """A row's estimate without allocator overhead (GiB): its tensors in training and loading, the CUDA context,
    and the amounts the shares multiply."""

    row: dict
    measured: float
    train: float
    load: float
    load_device: float
    context: float
    step: float
    communication: float


def prepare(row: dict) -> Prepared:
    est = accuracy.row_estimate(row, NONE)
    b, lb = est.breakdown, est.load_breakdown
    return Prepared(
        row=row,
        measured=accuracy.measured_gib(row),
        train=sum(b[t] for t in TENSOR_TERMS),
        load=sum(lb.get(t, 0.0) for t in LOAD_TENSOR_TERMS),
        load_device=sum(lb.values()),
        context=b["cuda_context"],
        step=b["activations"] + b["logits"] + b["generation"] + b["generation_gathered"],
        communication=b["gathered"] + b["buckets"],
    )


def predicted(p: Prepared, constants: AllocatorConstants) -> float:
    """The row's prediction (GiB) with these constants."""
    allocator = constants.activations * p.step + constants.communication * p.communication
    measure, phase = p.row["measure"], p.row.get("phase", "peak")
    if phase == "load":
        allocated = p.load
        value = p.load_device if measure == "device" else p.load
    else:
        allocated = p.train if phase == "train" else max(p.train, p.load)
        reserved = p.train + allocator if phase == "train" else max(p.train + allocator, p.load)
        device = (
            p.train + allocator + p.context if phase == "train" else max(p.train + allocator + p.context, p.load_device)
        )
        value = {"allocated": allocated, "reserved": reserved, "device": device}[measure]
    if "gpu" not in p.row or measure == "allocated":
        return value
    floor = allocated + (p.context if measure == "device" else 0.0)
    card = accuracy.GPU_MIB[p.row["gpu"]] / 1024 - (p.context if measure == "reserved" else 0.0)
    return max(floor, min(value, card))


def loss(constants: AllocatorConstants, prepared: list[Prepared]) -> float:
    """Mean weighted absolute relative error: an under-prediction counts UNDER_WEIGHT times."""
    total = 0.0
    for p in prepared:
        error = predicted(p, constants) / p.measured - 1
        total += error if error > 0 else -UNDER_WEIGHT * error
    return total / len(prepared)


def fit(rows: list[dict]) -> AllocatorConstants:
    """The constants that best predict `rows` (only these: the caller passes the fit rows)."""
    prepared = [prepare(row) for row in rows]
    candidates = [AllocatorConstants(a, c) for a in GRID_ACTIVATIONS for c in GRID_COMMUNICATION]
    return min(candidates, key=lambda k: (round(loss(k, prepared), 9), dataclasses.astuple(k)))


def main() -> int:
    fit_rows, held = accuracy.split(accuracy.load_rows())
    fitted = fit(fit_rows)
    print(f"fitted on {len(fit_rows)} rows ({len(held)} held out): {fitted}")
    if fitted != FITTED:
        print(f"backend/memory_train.py holds {FITTED}: set FITTED = {fitted!r}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
