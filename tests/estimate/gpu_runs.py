"""A finished GPU run's folder as train.py leaves it, for the tests of calibration from your runs
(no GPU here: the records are written as a GPU run writes them)."""

from __future__ import annotations

import json
from pathlib import Path

from tunedeck.backend.spec import spec_to_yaml


def fake_gpu_run(runs_dir: Path, run_id: str, spec, tokens_per_s: float, peak_gb: float, world: int = 4) -> Path:
    """A finished run folder as train.py writes it on a GPU: job.yaml and metrics.jsonl."""
    run_dir = runs_dir / run_id
    run_dir.mkdir(parents=True)
    (run_dir / "job.yaml").write_text(spec_to_yaml(spec))
    records = [{"event": "start", "world_size": world, "gpu_name": "NVIDIA A100-SXM4-80GB", "compute_dtype": "bf16"}]
    for step in range(1, 5):
        records.append({"event": "log", "step": step, "loss": 1.0, "tokens_per_second": tokens_per_s * world,
                        "gpu_peak_allocated_gb": [peak_gb] * world})  # fmt: skip
    records.append({"event": "end", "status": "finished", "runtime_s": 60.0})
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return run_dir
