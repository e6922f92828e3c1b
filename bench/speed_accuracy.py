"""How close the speed prediction comes to published, measured training throughput.

    .venv/bin/python bench/speed_accuracy.py

Reads tests/data/measured_throughput.yaml, predicts tokens/s per GPU of every run with
backend/speed.py (its GPU, links, micro batch, accumulation, checkpointing), and prints the
prediction beside the measurement per run, then the median and largest absolute error.
"""

from __future__ import annotations

import dataclasses
import statistics
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tunedeck.backend import catalog  # noqa: E402
from tunedeck.backend.memory_job import Job, input_values  # noqa: E402
from tunedeck.backend.spec import JobSpec, set_paths  # noqa: E402
from tunedeck.backend.speed import Hardware, predict, schedule_of  # noqa: E402

TABLE = ROOT / "tests" / "data" / "measured_throughput.yaml"
STAND_IN = "meta-llama/Llama-2-7b-hf"  # a catalog model for rows given by `arch` (replaced before predicting)


def load_rows(path: Path = TABLE) -> list[dict]:
    return yaml.safe_load(path.read_text(encoding="utf-8"))


def row_spec(row: dict) -> JobSpec:
    settings = {
        "model.name_or_path": row.get("model", STAND_IN),
        "model.dtype": "bfloat16",
        "method": row["method"],
        "launch.num_processes": row["gpus"],
        "training.per_device_train_batch_size": row["micro_batch"],
        "training.gradient_accumulation_steps": row["grad_accum"],
        "training.precision": "bf16",
        "dataset.max_seq_length": row["seq_len"],
        "strategy.kind": "ddp",
        **row.get("settings", {}),
    }
    return set_paths(JobSpec(), settings)


def predicted(row: dict) -> float:
    """Predicted tokens/s per GPU of a published run."""
    spec = row_spec(row)
    job = Job.from_values(input_values(spec))
    if "arch" in row:
        job = dataclasses.replace(job, arch=catalog.from_config(row["arch"], source=row["source"]))
    return predict(job, Hardware.named(row["gpu"]), schedule_of(spec, None)).tokens_per_s_per_gpu


def measured(row: dict) -> float:
    """Tokens/s per GPU as published: given, a run's total, or samples x seq_len over a run's seconds."""
    if "seconds" in row:
        return row["samples"] * row["seq_len"] / row["seconds"] / row["gpus"]
    return row["measured"] / row["gpus"] if row.get("total") else row["measured"]


def errors(rows: list[dict]) -> list[tuple[dict, float, float]]:
    """(row, predicted, signed relative error) per run."""
    out = []
    for row in rows:
        p = predicted(row)
        out.append((row, p, (p - measured(row)) / measured(row)))
    return out


def summary(results) -> tuple[float, float]:
    """(median, largest) absolute relative error."""
    absolute = [abs(e) for _, _, e in results]
    return statistics.median(absolute), max(absolute)


def main() -> int:
    results = errors(load_rows())
    print(f"{'run':34s} {'GPU':>10s} {'measured':>9s} {'predicted':>9s} {'error':>7s}  (tokens/s per GPU)")
    for row, p, error in results:
        print(f"{row['id']:34s} {row['gpu']:>10s} {measured(row):9.0f} {p:9.0f} {error:+7.1%}")
    median, worst = summary(results)
    print(f"\n{len(results)} published runs: median absolute error {median:.1%}, largest {worst:.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
