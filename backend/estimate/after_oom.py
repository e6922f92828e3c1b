"""The advisor's next strategy for a run that ran out of memory (backend/recipe/failures.py's class `oom`).

Such a run is never started again as it was: it fails the same way. Its job's estimate fit what the GPU has (or
the person started it anyway), yet it did not: the real need is above the estimate. So the advisor is asked again
with a budget OOM_MARGIN under the smaller of the two, and its recommendation there, the fastest option that fits
that budget (sharding, offload, then a 4-bit base), is the next strategy.
"""

from __future__ import annotations

from dataclasses import dataclass

from tunedeck.backend.estimate.advisor import advise
from tunedeck.backend.estimate.gpu_fit import format_gb
from tunedeck.backend.spec import JobSpec

OOM_MARGIN = 0.85  # at least 15% less memory per GPU than the job that ran out of it


@dataclass(frozen=True)
class NextStrategy:
    strategy: str  # the advisor's label: "ZeRO-3", "QLoRA + DDP", ...
    changes: dict  # the job fields it sets
    line: str  # one sentence: what it is and what it needs against the job that ran out

    def cli_sets(self) -> list[str]:
        """The changes as `tunedeck train --set` arguments."""
        return [
            f"{path}={str(value).lower() if isinstance(value, bool) else value}" for path, value in self.changes.items()
        ]


def next_after_oom(spec: JobSpec, gpu_mem_gb: float | None = None) -> NextStrategy | None:
    """What to run instead of `spec`, which ran out of memory on GPUs of `gpu_mem_gb` (None: not known); None when
    the advisor has nothing that needs less."""
    current = advise(spec, gpu_mem_gb or 1e9).current.per_gpu_gb
    budget = OOM_MARGIN * min(current, gpu_mem_gb or current)
    recommendation = advise(spec, budget).recommendation
    if recommendation.strategy is None or not recommendation.changes or recommendation.estimate is None:
        return None
    sets = ", ".join(f"{path}={value}" for path, value in recommendation.changes.items())
    line = (
        f"{recommendation.strategy} ({sets}) is estimated at {format_gb(recommendation.estimate.per_gpu_gb)} per "
        f"{'process' if spec.launch.use_cpu else 'GPU'}, against {format_gb(current)} for the job that ran out"
    )
    return NextStrategy(recommendation.strategy, dict(recommendation.changes), line)
