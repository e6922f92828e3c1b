"""How close the memory estimator comes to published, measured peaks.

    .venv/bin/python bench/estimate_accuracy.py

Reads tests/data/measured_peaks.yaml, predicts every run with backend/memory.py, and prints
prediction vs measurement per run and the mean absolute (percentage) error. Each run is
compared on what its source measured: allocated tensors, the allocator's reserved pool, or
the whole device as nvidia-smi shows it; with the loss implementation its software used; and
over the phases its software went through: the whole run (load and training, the default),
or the training step alone where its loader never held the whole model on one GPU.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tunedeck.backend.memory import Estimate, estimate  # noqa: E402
from tunedeck.backend.memory_job import GIB  # noqa: E402
from tunedeck.backend.spec import JobSpec, set_paths  # noqa: E402

TABLE = ROOT / "tests" / "data" / "measured_peaks.yaml"
UNIT_BYTES = {"GB": 1e9, "GiB": GIB}


@dataclass(frozen=True)
class Comparison:
    row: dict
    predicted_gib: float
    measured_gib: float

    @property
    def error(self) -> float:
        """Signed relative error of the prediction."""
        return (self.predicted_gib - self.measured_gib) / self.measured_gib


def load_rows(path: Path = TABLE) -> list[dict]:
    return yaml.safe_load(path.read_text(encoding="utf-8"))


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


def measured_view(est: Estimate, row: dict) -> float:
    """The part of the estimate that the source's measurement covers, in GiB."""
    return est.phase_view(row["measure"], row.get("phase", "peak"))


def compare(row: dict) -> Comparison:
    est = estimate(row_spec(row), loss=row["loss"])
    measured = row["measured"] * UNIT_BYTES[row["unit"]] / GIB
    return Comparison(row, measured_view(est, row), measured)


def main() -> int:
    results = [compare(row) for row in load_rows()]
    print(f"{'run':44s} {'measure':9s} {'phase':5s} {'measured':>9s} {'predicted':>9s} {'error':>7s}")
    for r in results:
        phase = r.row.get("phase", "peak")
        print(
            f"{r.row['id']:44s} {r.row['measure']:9s} {phase:5s} {r.measured_gib:8.2f}G {r.predicted_gib:8.2f}G"
            f" {r.error:+7.1%}"
        )
    mae = sum(abs(r.error) for r in results) / len(results)
    worst = max(results, key=lambda r: abs(r.error))
    print(f"\n{len(results)} published runs: mean absolute error {mae:.1%}, worst {worst.row['id']} {worst.error:+.1%}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
