"""Helpers for the run tests: read what a run wrote, find its processes."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import psutil

from tunedeck.backend.runs.supervisor import process_identity

# For a run a test trains until it stops, kills or requeues it: each micro-batch takes at least half a second, the
# CPU idle for the rest (TUNEDECK_FAULT=pace, backend/recipe/faults.py), as a big model's step on a GPU leaves it.
# Flat out, the demo's two ranks took both cores from the other lane's tests for as long as the test waited.
PACED = ("TUNEDECK_FAULT", "pace=0.5")


def read_metrics(run_dir: Path) -> list[dict]:
    path = Path(run_dir) / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def start_record(run_dir: Path) -> dict:
    records = [r for r in read_metrics(run_dir) if r["event"] == "start"]
    assert len(records) == 1, f"expected one start record, got {records}\n{logs_tail(run_dir)}"
    return records[0]


def log_records(run_dir: Path) -> list[dict]:
    return [r for r in read_metrics(run_dir) if r["event"] == "log" and "loss" in r]


def end_record(run_dir: Path) -> dict:
    records = [r for r in read_metrics(run_dir) if r["event"] == "end"]
    assert len(records) == 1, f"expected one end record, got {records}\n{logs_tail(run_dir)}"
    return records[0]


def repeated_warnings(run_dir: Path) -> dict[str, int]:
    """Each Python warning a rank log shows more than once ("file.py:N: FutureWarning: text"), with its count."""
    counts: dict[str, int] = {}
    for log in sorted((Path(run_dir) / "logs").glob("rank*.log")):
        for match in WARNING_LINE.finditer(log.read_text(errors="replace")):
            key = f"{log.name}: {match.group(0)}"
            counts[key] = counts.get(key, 0) + 1
    return {warning: count for warning, count in counts.items() if count > 1}


WARNING_LINE = re.compile(r"[^\s|\]]+\.py:\d+: \w*Warning: .*")


def logs_tail(run_dir: Path, lines: int = 30) -> str:
    """The end of every log of a run, for assertion messages."""
    return files_tail(sorted((Path(run_dir) / "logs").glob("*.log")), lines)


def files_tail(paths: list[Path], lines: int = 30) -> str:
    """The last `lines` lines of each file, under its name."""
    return "\n".join(
        f"--- {path.name}\n" + "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) for path in paths
    )


def status_json(run_dir: Path) -> dict:
    return json.loads((Path(run_dir) / "status.json").read_text())


def run_processes(run_dir: Path) -> list[psutil.Process]:
    """The launcher and everything under it (the ranks run in sessions of their own)."""
    launcher = psutil.Process(status_json(run_dir)["launcher"]["pid"])
    return [launcher, *launcher.children(recursive=True)]


def still_alive(processes: list[psutil.Process]) -> list[int]:
    """Those of the processes, or members of their process groups, that are alive (not zombies)."""
    groups = set()
    alive = []
    for proc in processes:
        groups.add(proc.pid)  # each was started as leader of its own group, or in the launcher's
        try:
            if proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE:
                alive.append(proc.pid)
        except psutil.NoSuchProcess:
            pass
    for other in psutil.process_iter(["pid", "status"]):
        try:
            if os.getpgid(other.pid) in groups and other.info["status"] != psutil.STATUS_ZOMBIE:
                alive.append(other.pid)
        except (ProcessLookupError, psutil.NoSuchProcess):
            continue
    return sorted(set(alive))


def processes_working_in(run_dir: Path) -> list[int]:
    """Live processes whose working folder is the run folder (the launcher and every rank work there)."""
    target = str(Path(run_dir).resolve())
    found = []
    for proc in psutil.process_iter(["pid", "status"]):
        try:
            if proc.info["status"] != psutil.STATUS_ZOMBIE and proc.cwd() == target:
                found.append(proc.pid)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return found


def wait_for(predicate, timeout: float, interval: float = 0.2, what: str | Callable[[], str] = "condition"):
    """Poll until predicate() is true; `what` names the wait in the failure (a callable: read when it fails,
    so that logs and queue states in it are those at the timeout)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what() if callable(what) else what}")


def fill(disk: Path, leave: int = 0) -> Path:
    """Write a filler file until only `leave` bytes of the disk are free (0: until the disk is full)."""
    filler = disk / f"filler-{len(list(disk.glob('filler-*')))}"
    with open(filler, "wb", buffering=0) as f:
        try:
            while shutil.disk_usage(disk).free > leave:
                f.write(b"\xff" * min(65536, shutil.disk_usage(disk).free - leave))
        except OSError:  # ENOSPC: full
            pass
    return filler


def fake_run(runs_dir: Path, run_id: str, state: str, holder: subprocess.Popen | None, gpu_ids=None) -> Path:
    """A run folder as the supervisor leaves it, owned by `holder` (a real process standing in for the supervisor)."""
    folder = Path(runs_dir) / run_id
    folder.mkdir(parents=True)
    identity = process_identity(holder.pid) if holder else None
    (folder / "status.json").write_text(
        json.dumps(
            {
                "run_id": run_id,
                "state": state,
                "title": "m · lora · ddp · 2xGPU",
                "created_at": time.time() - 100,
                "started_at": time.time() - 99,
                "ended_at": None,
                "exit_code": None,
                "error": None,
                "gpu_ids": gpu_ids,
                "supervisor": identity,
                "launcher": None,
            }
        )
    )
    return folder


def tunedeck(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """The `tunedeck` command of this environment, as a user runs it."""
    return subprocess.run(
        [str(Path(sys.executable).parent / "tunedeck"), *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def run_bench(script: str, *args: str, folder: Path) -> tuple[dict, str]:
    """Run bench/SCRIPT with its --json report in `folder`: (the report, its stderr); fails on a non-zero exit."""
    report = Path(folder) / "report.json"
    bench = Path(__file__).resolve().parents[2] / "bench" / script
    result = subprocess.run(
        [sys.executable, str(bench), *args, "--json", str(report)], capture_output=True, text=True, timeout=540
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    return json.loads(report.read_text()), result.stderr


def split_demo_files(demo_home: Path, folder: Path) -> tuple[Path, Path]:
    """(additions, subtractions): the demo's training rows of each kind, in two files of `folder` (a dataset.mix)."""
    rows = [json.loads(line) for line in (demo_home / "data" / "train.jsonl").read_text().splitlines()]
    files = []
    for kind in ("Add", "Subtract"):
        path = folder / f"{kind.lower()}.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in rows if r["prompt"].startswith(f"Q: {kind}")))
        files.append(path)
    return files[0], files[1]
