"""Whether the job as set fits its GPUs and host RAM, as problems like any other.

The estimate is what nvidia-smi would show: tensors, the caching allocator's cached blocks and the
CUDA context (backend/estimate/memory_allocator.py). An error when it exceeds the GPU's memory (or the
machine's RAM, for loading and CPU/NVMe offload): the job cannot fit at all. A warning when it
stays below but above FIT_FRACTION (advisor.py): against published measured peaks the runs the fit
never saw were predicted from 2.6% below to 13.7% above (docs/estimates.md, "Memory"), and the
cached part is the least regular, so such a job may or may not fit. Each problem carries the
advisor's way out as `fix` (the recommendation's changes), which the page applies. A job that trains
within both is checked at its saves too (save_fit.py).
CPU jobs are checked against this machine's RAM by validate_launch.py instead.
"""

from __future__ import annotations

from typing import Literal

from tunedeck.backend.estimate.advisor import Advice
from tunedeck.backend.estimate.gpu_fit import FIT_FRACTION, format_gb
from tunedeck.backend.estimate.save_fit import save_problems
from tunedeck.backend.spec import JobSpec
from tunedeck.backend.spec.problem import Problem

FIELD = "strategy.kind"  # what the way out changes first


def fit_problems(spec: JobSpec, advice: Advice) -> list[Problem]:
    """At most one problem: the GPU's, else the host RAM's, else the saves'."""
    if spec.launch.use_cpu:
        return []
    est, gpu, ram = advice.current, advice.gpu_mem_gb, advice.cpu_mem_gb
    if est.per_gpu_gb > FIT_FRACTION * gpu:
        phase = " while loading" if est.limiting_phase == "load" else ""
        need = f"needs {format_gb(est.per_gpu_gb)} per GPU{phase}"
        if est.per_gpu_gb > gpu:
            return [_problem("error", f"does not fit: it {need} and the GPU has {gpu:g} GB", advice)]
        return [_problem("warning", f"may not fit: it {need} of {gpu:g} GB, above {FIT_FRACTION:.0%}", advice)]
    if ram is not None and est.host_gb > FIT_FRACTION * ram:
        need = f"needs {est.host_gb:.0f} GB of host RAM per machine (loading, offload)"
        if est.host_gb > ram:
            return [_problem("error", f"does not fit: it {need} and the machine has {ram:.0f} GB", advice)]
        return [_problem("warning", f"may not fit: it {need} of {ram:.0f} GB, above {FIT_FRACTION:.0%}", advice)]
    return save_problems(spec, est, gpu, ram)


def _problem(level: Literal["error", "warning"], what: str, advice: Advice) -> Problem:
    rec = advice.recommendation
    if rec.strategy is None:
        return Problem(level, FIELD, f"The job as set {what}. {rec.reason}")
    if not rec.changes:  # the job's own strategy is advised: only its settings can change
        return Problem(level, FIELD, f"The job as set {what}. {rec.reason}")
    sets = ", ".join(f"{k}={_word(v)}" for k, v in rec.changes.items())
    return Problem(
        level,
        FIELD,
        f"The job as set {what}: use {rec.strategy} instead ({sets}; Apply recommendation).",
        fix=rec.changes,
    )


def _word(value) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)
