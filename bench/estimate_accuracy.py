"""How close the memory estimator comes to published, measured peaks: on the rows its constants were fitted on,
and on the third it never saw.

    .venv/bin/python bench/estimate_accuracy.py

Reads tests/data/measured_peaks.yaml, predicts every run with backend/estimate/memory.py, and prints prediction vs
measurement per run, then the mean absolute error, the largest error and the largest under-prediction (a
prediction below the measurement is an out-of-memory the estimate did not warn of) of the fit rows and of the
held-out rows. Each run is compared on what its source measured: allocated tensors, the allocator's reserved
pool, or the whole device as nvidia-smi shows it; with the software that trained it (backend/estimate/memory_software.py);
and over the phases its software went through: the whole run (load and training, the default), the training step
alone where its loader never held the whole model on one GPU, or the load alone where the source measured that.

The split is fixed before any fit (`held_out`): within each publisher's rows ordered by the SHA-256 of their ids,
every third row is held out. bench/fit_memory.py fits the allocator constants on the other rows only.
"""

from __future__ import annotations

import hashlib
import sys
from dataclasses import dataclass
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tunedeck.backend.estimate.memory import Estimate, estimate  # noqa: E402
from tunedeck.backend.estimate.memory_allocator import FITTED, AllocatorConstants  # noqa: E402
from tunedeck.backend.estimate.memory_job import GIB  # noqa: E402
from tunedeck.backend.spec import JobSpec, set_paths  # noqa: E402

TABLE = ROOT / "tests" / "data" / "measured_peaks.yaml"
UNIT_BYTES = {"GB": 1e9, "GiB": GIB}
# What nvidia-smi reports as each GPU's total memory (MiB); "24GB" is a card of that class the source leaves unnamed.
GPU_MIB = {"RTX 3090": 24576, "RTX 4090": 24564, "24GB": 24564, "A10G": 23028, "A100 40GB": 40960, "H100 80GB": 81559}
COMMAND = ".venv/bin/python bench/estimate_accuracy.py"
# Issue 32's goals on the held-out third: mean absolute error under 8%, the largest under 15%, and no prediction
# more than 5% below its measurement.
GOAL_MEAN, GOAL_WORST, GOAL_UNDER = 0.08, 0.15, 0.05


@dataclass(frozen=True)
class Comparison:
    row: dict
    predicted_gib: float
    measured_gib: float

    @property
    def error(self) -> float:
        """Signed relative error of the prediction."""
        return (self.predicted_gib - self.measured_gib) / self.measured_gib


@dataclass(frozen=True)
class Summary:
    rows: int
    mean: float  # mean absolute error
    worst: Comparison  # the largest absolute error
    under: float  # the largest under-prediction (0 when none), as a positive share

    def line(self, name: str) -> str:
        return (
            f"{name}: {self.rows} runs, mean absolute error {self.mean:.1%}, largest {self.worst.error:+.1%} "
            f"({self.worst.row['id']}), largest under-prediction {-self.under:.1%}"
        )


def load_rows(path: Path = TABLE) -> list[dict]:
    return yaml.safe_load(path.read_text(encoding="utf-8"))


def publisher(row: dict) -> str:
    """The repository that published a row (github.com/OWNER/REPO): the unit the split is stratified by."""
    return "/".join(row["source"].split("/")[3:5])


def held_out(row: dict, rows: list[dict]) -> bool:
    """The fixed split, chosen before any fit: within each publisher's rows ordered by the SHA-256 of their ids,
    every third row (the 2nd, 5th, 8th ...) is held out of the fit."""
    own = sorted((r for r in rows if publisher(r) == publisher(row)), key=_digest)
    return [r["id"] for r in own].index(row["id"]) % 3 == 1


def split(rows: list[dict]) -> tuple[list[dict], list[dict]]:
    """(the rows the fit sees, the held-out third)."""
    held = [r for r in rows if held_out(r, rows)]
    return [r for r in rows if r not in held], held


def _digest(row: dict) -> str:
    return hashlib.sha256(row["id"].encode()).hexdigest()


def row_spec(row: dict) -> JobSpec:
    settings = {
        "model.name_or_path": row["model"],
        "method": row["method"],
        "launch.num_processes": row["gpus"],
        "training.per_device_train_batch_size": row["micro_batch"],
        "dataset.max_seq_length": row["seq_len"],
        **row.get("settings", {}),
    }
    return set_paths(JobSpec(), settings)


def row_estimate(row: dict, allocator: AllocatorConstants = FITTED) -> Estimate:
    return estimate(row_spec(row), software=row["software"], allocator=allocator)


def measured_gib(row: dict) -> float:
    return row["measured"] * UNIT_BYTES[row["unit"]] / GIB


def measured_view(est: Estimate, row: dict) -> float:
    """The part of the estimate that the source's measurement covers, in GiB. On the row's GPU the allocator's
    cached blocks fill at most what the card holds beyond the tensors (and the CUDA context)."""
    measure, phase = row["measure"], row.get("phase", "peak")
    value = est.phase_view(measure, phase)
    if "gpu" not in row or measure == "allocated":
        return value
    context = est.breakdown["cuda_context"]
    tensors = est.phase_view("allocated", phase) + (context if measure == "device" else 0.0)
    card = GPU_MIB[row["gpu"]] / 1024 - (context if measure == "reserved" else 0.0)
    return max(tensors, min(value, card))


def compare(row: dict, allocator: AllocatorConstants = FITTED) -> Comparison:
    return Comparison(row, measured_view(row_estimate(row, allocator), row), measured_gib(row))


def summary(results: list[Comparison]) -> Summary:
    return Summary(
        rows=len(results),
        mean=sum(abs(r.error) for r in results) / len(results),
        worst=max(results, key=lambda r: abs(r.error)),
        under=max([0.0] + [-r.error for r in results]),
    )


def main() -> int:
    rows = load_rows()
    fit_rows, held = split(rows)
    print(f"{'run':44s} {'set':8s} {'measure':9s} {'phase':5s} {'measured':>9s} {'predicted':>9s} {'error':>7s}")
    for row in rows:
        r = compare(row)
        phase = row.get("phase", "peak")
        which = "held-out" if row in held else "fit"
        print(
            f"{row['id']:44s} {which:8s} {row['measure']:9s} {phase:5s} {r.measured_gib:8.2f}G "
            f"{r.predicted_gib:8.2f}G {r.error:+7.1%}"
        )
    publishers = len({publisher(r) for r in rows})
    print(f"\n{len(rows)} published runs from {publishers} publishers; allocator constants {FITTED}")
    print(summary([compare(r) for r in fit_rows]).line("fit rows"))
    print(summary([compare(r) for r in held]).line("held-out rows"))
    print(f"(goals on the held-out rows: mean under {GOAL_MEAN:.0%}, largest under {GOAL_WORST:.0%}, "
          f"no under-prediction beyond {GOAL_UNDER:.0%}; recompute: {COMMAND})")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
