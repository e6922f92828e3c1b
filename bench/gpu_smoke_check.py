"""GPU check: the smoke run of every preset on this machine's GPUs, with its memory peaks beside the estimate.

For each preset: `tunedeck train PRESET --smoke` (the preset's exact path on a tiny model of its
architecture, on as many GPUs as the preset puts on one machine, at most the GPUs found). A
preset whose smoke job the estimate says does not fit the GPUs is skipped, and says so. The
peaks come from the run's own records: right after the model loaded (start record,
load_gpu_peak_allocated_gb) and at each logging step (gpu_peak_allocated_gb); the estimate is
tunedeck's for the smoke job (its load phase too, where the estimate has phases).

Without a GPU the smoke runs go to 2 CPU processes and only the host peaks are recorded: the
way to try this script's CPU-side parts (`--presets demo` for a quick one).

Prints one PASS/FAIL/SKIP line per preset; exits non-zero if any failed.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from tunedeck.backend.estimate.memory import estimate
from tunedeck.backend.machine.nvml import gpu_memory
from tunedeck.backend.runs.preflight import gpu_indices
from tunedeck.backend.runs.smoke import smoke_spec
from tunedeck.backend.spec import load_presets, load_spec_file, resolve_spec


def gpu_memory_gb() -> float | None:
    """The smallest GPU's memory (GiB), or None without NVML."""
    return min((gpu.total_gb for gpu in gpu_memory()), default=None)


def records(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.is_file() else []


def peaks(run_dir: Path) -> dict:
    """Max over ranks of the load-phase and training peaks the run recorded."""
    start = next((r for r in records(run_dir) if r.get("event") == "start"), {})
    steps = [r["gpu_peak_allocated_gb"] for r in records(run_dir) if r.get("gpu_peak_allocated_gb")]
    load = start.get("load_gpu_peak_allocated_gb")
    mfu = [r["mfu"] for r in records(run_dir) if "mfu" in r]
    return {
        "load_gpu_gb": max(load) if load else None,
        "train_gpu_gb": max(steps[-1]) if steps else None,
        "load_host_rss_gb": max(start.get("load_host_peak_rss_gb") or [0]) or None,
        # MFU of a 3-step smoke run on a 2-layer model: proof that it is logged, not a speed figure.
        "mfu_last": round(mfu[-1], 5) if mfu else None,
        "peak_tflops": start.get("peak_tflops"),
    }


def predicted(job_file: Path) -> dict:
    est = estimate(load_spec_file(job_file))
    phases = est.to_dict().get("phases") or {}  # the load/train split, where the estimate has one
    return {"allocated_gb": round(est.allocated_gb, 3), "per_gpu_gb": round(est.per_gpu_gb, 3), "phases": phases}


def check(preset: str, gpus: int, gpu_gb: float | None, runs_dir: Path) -> dict:
    smoke = smoke_spec(resolve_spec(preset), gpus=gpus)
    if gpu_gb is not None:
        need = estimate(smoke).per_gpu_gb
        if need > gpu_gb:
            return {
                "preset": preset,
                "result": "SKIP",
                "why": f"the smoke job needs {need:.1f} GB per GPU, the GPUs have {gpu_gb:.1f}",
            }
    before = set(runs_dir.iterdir()) if runs_dir.is_dir() else set()
    done = subprocess.run(
        [sys.executable, "-m", "tunedeck.backend.cli", "train", preset, "--smoke", "--runs-dir", str(runs_dir)],
        capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=900,
    )  # fmt: skip
    new = sorted(set(runs_dir.iterdir()) - before)
    verdict = (done.stdout + done.stderr).strip().splitlines()[-1:] or ["no output"]
    row = {"preset": preset, "result": "PASS" if done.returncode == 0 else "FAIL", "verdict": verdict[0]}
    if new:
        row.update(run=str(new[-1]), measured=peaks(new[-1]), estimate=predicted(new[-1] / "job.yaml"))
    if gpus and row["result"] == "PASS" and not (row.get("measured") or {}).get("train_gpu_gb"):
        row.update(result="FAIL", verdict=row["verdict"] + " (but no GPU peak was recorded)")
    measured = row.get("measured") or {}
    if gpus and row["result"] == "PASS" and measured.get("peak_tflops") and not measured.get("mfu_last"):
        row.update(result="FAIL", verdict=row["verdict"] + " (but no MFU was logged against the GPU's known peak)")
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=None, help="write the rows as JSON here")
    parser.add_argument("--runs-dir", type=Path, default=Path("/tmp/gpu-smoke-runs"))
    parser.add_argument("--presets", nargs="*", default=None, help="default: every preset")
    args = parser.parse_args()
    gpus, gpu_gb = len(gpu_indices()), gpu_memory_gb()
    print(
        f"  {gpus} GPU(s)"
        + (f", smallest {gpu_gb:.1f} GiB" if gpu_gb else ": smoke runs on 2 CPU processes, host peaks only")
    )
    rows = []
    for preset in args.presets or sorted(load_presets()):
        row = check(preset, gpus, gpu_gb, args.runs_dir)
        rows.append(row)
        m, e = row.get("measured") or {}, row.get("estimate") or {}
        detail = row.get("why") or row["verdict"]
        if m:
            detail += (f"; load peak {m['load_gpu_gb']} GiB, train peak {m['train_gpu_gb']} GiB allocated "
                       f"(estimate {e['allocated_gb']} allocated, phases {e['phases'] or 'n/a'}); host RSS at load {m['load_host_rss_gb']} GiB; "
                       f"MFU {m['mfu_last']} of {m['peak_tflops']} TFLOPS")  # fmt: skip
        print(f"{row['result']} smoke {preset}: {detail}", flush=True)
    if args.out:
        args.out.write_text(json.dumps({"gpus": gpus, "gpu_gb": gpu_gb, "rows": rows}, indent=2))
    return 1 if any(r["result"] == "FAIL" for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
