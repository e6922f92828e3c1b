"""A finished GPU run's folder as train.py leaves it, for the tests of calibration from your runs
(no GPU here: the records are written as a GPU run writes them)."""

from __future__ import annotations

import json
from pathlib import Path

from tunedeck.backend.spec import spec_to_yaml


def fake_gpu_run(
    runs_dir: Path,
    run_id: str,
    spec,
    tokens_per_s: float,
    peak_gb: float,
    world: int = 4,
    to_step1_s: float = 0.0,
    network: dict | None = None,
) -> Path:
    """A finished run folder as train.py writes it on a GPU: job.yaml and metrics.jsonl (and, with `to_step1_s`,
    status.json's launch and startup.json's phases, the first step that many seconds after the launch; with
    `network`, the start record's measured network as recipe/network.py writes it)."""
    run_dir = runs_dir / run_id
    run_dir.mkdir(parents=True)
    if to_step1_s:
        launched = 1_700_000_000.0
        (run_dir / "status.json").write_text(
            json.dumps({"run_id": run_id, "state": "finished", "started_at": launched})
        )
        phases = [("importing the libraries", launched + 5), ("loading the model", launched + 20),
                  ("the first step", launched + to_step1_s), ("training", launched + to_step1_s + 3)]  # fmt: skip
        (run_dir / "startup.json").write_text(json.dumps({"phases": [{"phase": p, "at": t} for p, t in phases]}))
    (run_dir / "job.yaml").write_text(spec_to_yaml(spec))
    records = [{"event": "start", "world_size": world, "gpu_name": "NVIDIA A100-SXM4-80GB", "compute_dtype": "bf16"}]
    if network:
        records[0]["network"] = network
    for step in range(1, 5):
        records.append({"event": "log", "step": step, "loss": 1.0, "tokens_per_second": tokens_per_s * world,
                        "gpu_peak_allocated_gb": [peak_gb] * world})  # fmt: skip
    records.append({"event": "end", "status": "finished", "runtime_s": 60.0})
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return run_dir
