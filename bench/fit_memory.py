"""Fit the memory model's only empirical constants, the caching allocator's shares, on the published peaks.

    .venv/bin/python bench/fit_memory.py

Every other term of backend/memory*.py is counted from the job and the code of the software that trains it. What
PyTorch's caching allocator reserves beyond its tensors is not: it depends on how freed blocks fragment.
AllocatorConstants (backend/estimate/memory_allocator.py) holds it as a share of the step's activations and loss tensors, a
further share when the step's shapes change every step, a share of the communication buffers (FSDP's gathered units,
gradient buckets) and the blocks an FSDP 1 wrap from rank 0's CPU copy leaves. `fit` takes the fit rows only
(bench/estimate_accuracy.py's `split`, fixed before fitting) and searches a grid of the four for the least weighted
absolute error, an under-prediction weighing UNDER_WEIGHT times an over-prediction (it is an out-of-memory the user
was not warned of). The constants it prints are what memory_allocator.FITTED holds.

The allocator term is piecewise linear in the constants (numpy, installed with torch, evaluates the grid), so each row is estimated once without it (`prepare`) and
`predicted` adds it back the way Estimate.phase_view and estimate_accuracy.measured_view combine the terms (`grid`
does the same for every point of the grid at once); tests/estimate/test_published.py checks that the two agree with
the estimator on every row.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import estimate_accuracy as accuracy

from tunedeck.backend.estimate.memory import LOAD_TENSOR_TERMS, TENSOR_TERMS
from tunedeck.backend.estimate.memory_allocator import FITTED, AllocatorConstants
from tunedeck.backend.estimate.memory_job import GIB, Job, input_values

UNDER_WEIGHT = 3.0
GRID = {  # each constant's candidates
    "activations": np.round(np.arange(0, 1.001, 0.02), 2),  # of the step's activations and loss tensors
    "varying": np.round(np.arange(0, 3.001, 0.1), 2),  # of the loss's tensors when shapes change every step
    "communication": np.round(np.arange(0, 2.001, 0.05), 2),  # of the gathered units and buckets
    "wrap": np.round(np.arange(0, 8.001, 0.5), 2),  # root units an FSDP 1 wrap from CPU leaves cached
}
NONE = AllocatorConstants(activations=0.0, varying=0.0, communication=0.0, wrap=0.0)


@dataclasses.dataclass(frozen=True)
class Prepared:
    """A row's estimate without allocator overhead (GiB): its tensors in training and loading, the CUDA context,
    and the amounts the constants multiply."""

    row: dict
    measured: float
    train: float
    load: float
    load_device: float
    context: float
    step: float
    communication: float
    varying: float  # the loss's tensors where the shapes change every step; 0 elsewhere
    root: float  # the FSDP root unit, where a wrap from CPU leaves a floor; 0 elsewhere


def prepare(row: dict) -> Prepared:
    est = accuracy.row_estimate(row, NONE)
    b, lb = est.breakdown, est.load_breakdown
    job = Job.from_values(input_values(accuracy.row_spec(row), software=row["software"]))
    wraps = job.software.wraps_from_cpu and job.layout.is_fsdp
    return Prepared(
        row=row,
        measured=accuracy.measured_gib(row),
        train=sum(b[t] for t in TENSOR_TERMS),
        load=sum(lb.get(t, 0.0) for t in LOAD_TENSOR_TERMS),
        load_device=sum(lb.values()),
        context=b["cuda_context"],
        step=b["activations"] + b["logits"] + b["generation"] + b["generation_gathered"],
        communication=b["gathered"] + b["buckets"],
        varying=b["logits"] if job.varying_shapes else 0.0,
        root=job.root_unit_bytes / GIB if wraps else 0.0,
    )


def predicted(p: Prepared, constants: AllocatorConstants):
    """The row's prediction (GiB) with these constants: floats, or numpy arrays of candidates that broadcast."""
    allocator = (
        constants.activations * p.step + constants.varying * p.varying + constants.communication * p.communication
    )
    if p.root:
        allocator = np.maximum(allocator, constants.wrap * p.root - p.step)
    measure, phase = p.row["measure"], p.row.get("phase", "peak")
    # (+ 0.0 * allocator: a measurement the allocator does not reach still takes the grid's shape)
    if phase == "load":
        allocated = p.load
        value = p.load_device if measure == "device" else p.load + 0.0 * allocator
    else:
        allocated = p.train if phase == "train" else max(p.train, p.load)
        reserved = p.train + allocator if phase == "train" else np.maximum(p.train + allocator, p.load)
        device = reserved + p.context if phase == "train" else np.maximum(reserved + p.context, p.load_device)
        value = {"allocated": allocated + 0.0 * allocator, "reserved": reserved, "device": device}[measure]
    if "gpu" not in p.row or measure == "allocated":
        return value
    floor = allocated + (p.context if measure == "device" else 0.0)
    card = accuracy.GPU_MIB[p.row["gpu"]] / 1024 - (p.context if measure == "reserved" else 0.0)
    return np.maximum(floor, np.minimum(value, card))


def loss(constants: AllocatorConstants, prepared: list[Prepared]):
    """Mean weighted absolute relative error: an under-prediction counts UNDER_WEIGHT times."""
    total = 0.0
    for p in prepared:
        error = predicted(p, constants) / p.measured - 1
        total = total + np.where(error > 0, error, -UNDER_WEIGHT * error)
    return total / len(prepared)


def fit(rows: list[dict]) -> AllocatorConstants:
    """The constants that best predict `rows` (only these: the caller passes the fit rows). Every point of GRID is
    tried at once; between equal losses the smallest constants, in GRID's order, win."""
    prepared = [prepare(row) for row in rows]
    axes = np.meshgrid(*GRID.values(), indexing="ij", sparse=True)
    losses = np.round(loss(AllocatorConstants(*axes), prepared), 9)
    best = np.unravel_index(np.argmin(losses), losses.shape)  # the first minimum in C order: smallest constants
    return AllocatorConstants(*(float(values[i]) for values, i in zip(GRID.values(), best, strict=True)))


def main() -> int:
    fit_rows, held = accuracy.split(accuracy.load_rows())
    fitted = fit(fit_rows)
    print(f"fitted on {len(fit_rows)} rows ({len(held)} held out): {fitted}")
    if fitted != FITTED:
        print(f"backend/estimate/memory_allocator.py holds {FITTED}: set FITTED = {fitted!r}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
