"""A finished run's measured speed and memory beside what tunedeck predicts for its job, and the
correction your own runs suggest for the next prediction on the same GPU.

The measurement is the run's own metrics.jsonl (the GPU by its NVML name in the start record,
tokens/s and peak memory in the log records); the prediction is backend/estimate/speed.py and
backend/estimate/memory.py for the run's job.yaml on that GPU, computed when asked, so a run started
from a bundle without tunedeck is compared too.
"""

from __future__ import annotations

import dataclasses
import functools
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tunedeck.backend.estimate.memory import estimate
from tunedeck.backend.estimate.memory_job import EstimateError, Job, input_values
from tunedeck.backend.estimate.speed import Hardware, predict, schedule_of
from tunedeck.backend.estimate.speed_data import DataShape
from tunedeck.backend.runs.folder import DamagedStatus, read_status_file
from tunedeck.backend.runs.job_file import read_job
from tunedeck.backend.runs.records import is_number, read_records
from tunedeck.backend.runs.startup import FIRST_STEP, read_phases
from tunedeck.backend.runs.summary import format_clock
from tunedeck.backend.spec import JobSpec, SpecError
from tunedeck.backend.spec.flops import gpu_row

RUNS_CALIBRATED = 5  # the last runs a correction is taken from
LAUNCH_TO_FIRST_PHASE_S = 300  # Python, the launcher and train.py's own imports take well under this


@dataclass(frozen=True)
class RunComparison:
    run_id: str
    gpu: str  # GPU_TABLE key
    measured_tokens_per_s_per_gpu: float
    predicted_tokens_per_s_per_gpu: float
    measured_peak_gb: float | None  # highest torch.cuda.max_memory_allocated over the ranks
    predicted_peak_gb: float
    objective: str = "sft"
    # From the launch to the first step (startup.json): what the estimate models as startup, load and reference scoring.
    measured_to_step1_s: float | None = None
    predicted_to_step1_s: float | None = None
    # Between machines, the all-reduce bus bandwidth the run measured before its model loaded (GB/s; the start
    # record's "network"): its prediction used it, so the throughput ratio leaves the network out.
    network_gbps: float | None = None

    @property
    def throughput_ratio(self) -> float:
        return self.measured_tokens_per_s_per_gpu / self.predicted_tokens_per_s_per_gpu

    def line(self) -> str:
        """'4,210 tokens/s per GPU measured vs 3,900 predicted on A100-80GB (+8%); peak 20.1 GB vs 18.4 (+9%)'."""
        text = (
            f"{self.measured_tokens_per_s_per_gpu:,.0f} tokens/s per GPU measured vs "
            f"{self.predicted_tokens_per_s_per_gpu:,.0f} predicted on {self.gpu} ({self.throughput_ratio - 1:+.0%})"
        )
        if self.measured_peak_gb:
            error = (self.measured_peak_gb - self.predicted_peak_gb) / self.predicted_peak_gb
            text += f"; peak {self.measured_peak_gb:.1f} GB allocated vs {self.predicted_peak_gb:.1f} ({error:+.0%})"
        if self.startup_error is not None and self.measured_to_step1_s and self.predicted_to_step1_s:
            text += (
                f"; step 1 began {format_clock(self.measured_to_step1_s)} after the launch vs "
                f"{format_clock(self.predicted_to_step1_s)} predicted ({self.startup_error:+.0%})"
            )
        return text

    @property
    def startup_error(self) -> float | None:
        if not self.measured_to_step1_s or not self.predicted_to_step1_s:
            return None
        return (self.measured_to_step1_s - self.predicted_to_step1_s) / self.predicted_to_step1_s

    def to_dict(self) -> dict:
        return {
            "run_id": self.run_id,
            "gpu": self.gpu,
            "tokens_per_s_per_gpu": {
                "measured": round(self.measured_tokens_per_s_per_gpu, 1),
                "predicted": round(self.predicted_tokens_per_s_per_gpu, 1),
            },
            "peak_allocated_gb": {
                "measured": self.measured_peak_gb,
                "predicted": round(self.predicted_peak_gb, 2),
            },
            "seconds_to_step_1": {
                "measured": None if self.measured_to_step1_s is None else round(self.measured_to_step1_s, 1),
                "predicted": None if self.predicted_to_step1_s is None else round(self.predicted_to_step1_s, 1),
            },
            "network_between_machines_gbps": self.network_gbps,
        }


def measured_to_step1(run_dir: Path) -> float | None:
    """Seconds from the run's launch (status.json's started_at, else rank 0's first phase) to its first step."""
    phases = dict(read_phases(run_dir))
    if FIRST_STEP not in phases:
        return None
    try:
        launched = read_status_file(run_dir).get("started_at")
    except (OSError, DamagedStatus):
        launched = None
    first = min(phases.values())
    # A launch long before rank 0's first phase was another process's (a requeued Slurm job, a resume): not this one.
    began = launched if launched and first - LAUNCH_TO_FIRST_PHASE_S <= launched <= first else first
    return phases[FIRST_STEP] - began


def compare_run(run_dir: Path) -> RunComparison | None:
    """Measured vs predicted for a finished GPU run; None when it has nothing to compare (CPU, failed, unknown GPU)."""
    stamps = []
    for name in ("metrics.jsonl", "job.yaml"):
        try:
            stat = (Path(run_dir) / name).stat()
        except OSError:
            return None
        stamps.append((stat.st_mtime_ns, stat.st_size))
    return _compare_files(Path(run_dir), tuple(stamps))


@functools.lru_cache(maxsize=1024)
def _compare_files(run_dir: Path, stamps: tuple) -> RunComparison | None:
    """compare_run for files with these (mtime, size) stamps: the page asks on every edit, a run's files rarely change."""
    run = read_records(run_dir)
    if not run.start or not run.end or run.end.get("status") != "finished":
        return None
    row = gpu_row(run.start.get("gpu_name") or "")
    world = run.start.get("world_size") or 1
    rates = [rate for r in run.records if is_number(rate := r.get("tokens_per_second"))]
    if row is None or len(rates) < 2:
        return None
    try:
        spec = read_job(run_dir)
        if not isinstance(spec, JobSpec):
            return None  # a job of another version: nothing to predict it with
        job = Job.from_values(input_values(spec))
        schedule = schedule_of(spec, None)
        trained = _trained_rows(spec, run.records)
        if trained is not None:  # predict the rows the run trained, not rows of max_seq_length
            schedule = dataclasses.replace(schedule, data=trained)
        network = between_machines_gbps(run.start)
        speed = predict(job, Hardware.named(row[0], measured_ring_gbps=network), schedule)
        memory = estimate(spec)
    except (SpecError, EstimateError, ValueError):
        return None
    if speed is None:
        return None
    peaks = [max(peak) for r in run.records if (peak := r.get("gpu_peak_allocated_gb"))]
    return RunComparison(
        run_id=Path(run_dir).name,
        gpu=row[0],
        measured_tokens_per_s_per_gpu=statistics.median(rates[1:]) / world,  # the first window holds the warm-up
        predicted_tokens_per_s_per_gpu=speed.tokens_per_s_per_gpu,
        measured_peak_gb=max(peaks) if peaks else None,
        predicted_peak_gb=memory.allocated_gb,
        objective=spec.objective,
        measured_to_step1_s=measured_to_step1(run_dir),
        predicted_to_step1_s=sum(speed.around_s.get(part, 0.0) for part in ("startup", "load", "reference")),
        network_gbps=network,
    )


def between_machines_gbps(start: Mapping[str, Any]) -> float | None:
    """The bus bandwidth a run on several machines measured over every rank (recipe/network.py), else None."""
    network = start.get("network") or {}
    measured = network.get("all_ranks_gbps")
    return float(measured) if is_number(measured) and measured > 0 and (network.get("machines") or 1) > 1 else None


def _trained_rows(spec, records: Sequence[Mapping[str, Any]]) -> DataShape | None:
    """The tokens a sequence of the run held on average, from its logged token count (TRL's num_tokens: the tokens
    trained by every rank, padding left out) over its steps and global batch; None when the logs do not say. The
    padding a run computed is not logged: packed (padding-free) and length-grouped rows have next to none."""
    counted = [
        (r["step"], r["num_tokens"]) for r in records if is_number(r.get("num_tokens")) and is_number(r.get("step"))
    ]
    if len(counted) < 2 or counted[-1][0] <= counted[0][0] or spec.objective != "sft":
        return None
    per_step = (counted[-1][1] - counted[0][1]) / (counted[-1][0] - counted[0][0])
    tokens = min(per_step / spec.global_batch_size, spec.dataset.max_seq_length)
    if tokens <= 0:
        return None
    note = f"the run's own: {tokens:,.0f} tokens a sequence on average (its logged token count), padding not logged"
    return DataShape(tokens, tokens, tokens, 1.0, note)


@dataclass(frozen=True)
class Calibration:
    gpu: str
    runs: list[RunComparison]

    @property
    def factor(self) -> float:
        """Measured over predicted throughput, the median of the runs: what --calibrate multiplies by."""
        return statistics.median(r.throughput_ratio for r in self.runs)

    @property
    def memory_error(self) -> float | None:
        errors = [
            (r.measured_peak_gb - r.predicted_peak_gb) / r.predicted_peak_gb for r in self.runs if r.measured_peak_gb
        ]
        return statistics.median(errors) if errors else None

    @property
    def startup_error(self) -> float | None:
        errors = [r.startup_error for r in self.runs if r.startup_error is not None]
        return statistics.median(errors) if errors else None

    @property
    def network_gbps(self) -> float | None:
        """The bandwidth between machines your runs on several machines measured (the median), for --calibrate."""
        measured = [r.network_gbps for r in self.runs if r.network_gbps]
        return statistics.median(measured) if measured else None

    def sentence(self) -> str:
        count = len(self.runs)
        runs = "your last run" if count == 1 else f"your last {count} runs"
        text = f"{runs} on {self.gpu} {'was' if count == 1 else 'were'} {self.factor - 1:+.0%} vs prediction in tokens/s per GPU"
        if self.memory_error is not None:
            text += f", {self.memory_error:+.0%} in peak memory"
        if self.startup_error is not None:
            text += f", {self.startup_error:+.0%} in the time to step 1"
        if self.network_gbps:
            text += f"; they measured {self.network_gbps:.1f} GB/s between machines"
        return text

    def to_dict(self) -> dict:
        return {
            "gpu": self.gpu,
            "throughput_factor": round(self.factor, 3),
            "peak_memory_error": None if self.memory_error is None else round(self.memory_error, 3),
            "time_to_step_1_error": None if self.startup_error is None else round(self.startup_error, 3),
            "network_between_machines_gbps": None if self.network_gbps is None else round(self.network_gbps, 2),
            "sentence": self.sentence(),
            "runs": [r.to_dict() for r in self.runs],
        }


def calibration(runs_dir: Path | str, gpu: str | None) -> Calibration | None:
    """The last RUNS_CALIBRATED finished runs on this GPU (a GPU_TABLE key) that compare, or None."""
    folder = Path(runs_dir)
    if gpu is None or not folder.is_dir():
        return None
    found = []
    for run_dir in sorted((p for p in folder.iterdir() if p.is_dir()), reverse=True):  # run ids sort by time
        comparison = compare_run(run_dir)
        # A GRPO run's tokens/s depends on how long its answers came out (a decode step a token, whatever the
        # batch), which the prediction cannot know (it takes grpo.max_completion_length): it calibrates nothing.
        if comparison is not None and comparison.gpu == gpu and comparison.objective != "grpo":
            found.append(comparison)
            if len(found) == RUNS_CALIBRATED:
                break
    return Calibration(gpu, found) if found else None
