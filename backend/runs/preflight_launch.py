"""Checks of where a job will run, before anything starts or is submitted.

- The rendezvous host resolves (several machines started by hand: launch.main_process_ip).
  An address that does not resolve makes every node wait silently until its time limit.
- The rendezvous port is free here when this machine is machine 0 (several machines, local).
- The output folder has room for the checkpoints the job keeps: each holds the trained weights
  and the optimizer's states, times training.save_total_limit, plus the final model.
- A Slurm run: sbatch is installed here (else only Start here refuses: the bundle's slurm.sbatch
  is submitted on the cluster), and the runs folder is one the nodes share (a folder under /tmp
  or on a tmpfs is each node's own: a warning, since one machine may be the cluster).

Each problem names the field (or --runs-dir) and the fix.
"""

from __future__ import annotations

import os
import shutil
import socket
import time
from pathlib import Path

from tunedeck.backend.runs.preflight_ssh import ssh_problems
from tunedeck.backend.spec import JobSpec
from tunedeck.backend.spec.problem import Problem, error, refused_here, warning

NODE_LOCAL_PREFIXES = ("/tmp", "/var/tmp", "/dev/shm", "/run", "/scratch/local")
NODE_LOCAL_FILESYSTEMS = {"tmpfs", "ramfs", "overlay"}
# Adam-like optimizers keep two fp32 states per trained parameter; DeepSpeed's mixed precision adds an fp32 master copy.
OPTIMIZER_STATE_BYTES = 8
MASTER_COPY_BYTES = 4
ADAPTER_BYTES = 4  # PEFT saves the adapter in the dtype it trains in: fp32
RESOLVED_FOR_S = 30.0
_resolved: dict[str, tuple[float, bool]] = {}  # host -> (when looked up, resolves)


def launch_problems(spec: JobSpec, runs_dir: Path, run_folder: Path) -> list[Problem]:
    """Problems of where the job runs; run_folder is where its relative paths will point."""
    problems = [*_rendezvous(spec), *_checkpoint_room(spec, run_folder)]
    if spec.launch.backend == "slurm" and spec.launch.slurm.ssh.host:
        problems += ssh_problems(spec.launch.slurm.ssh)  # sbatch and the shared folder are the login node's
    elif spec.launch.backend == "slurm":
        problems += _slurm(runs_dir)
    return problems


def _rendezvous(spec: JobSpec) -> list[Problem]:
    launch = spec.launch
    if launch.backend != "local" or launch.num_machines == 1 or not launch.main_process_ip:
        return []
    host = launch.main_process_ip
    if not _resolves(host):
        return [
            error(
                "launch.main_process_ip",
                f"{host!r} does not resolve here, and the nodes would wait for it until their time limit: give "
                "machine 0's IP address or a host name every machine resolves (DNS or /etc/hosts)",
            )
        ]
    if launch.machine_rank != 0:
        return []
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("", launch.main_process_port))
        except OSError:
            return [
                error(
                    "launch.main_process_port",
                    f"port {launch.main_process_port} is already in use on this machine (machine 0): choose a free "
                    "port for launch.main_process_port, e.g. 29501",
                )
            ]
    return []


def _resolves(host: str) -> bool:
    """Whether `host` resolves here; kept RESOLVED_FOR_S seconds, since the page checks it on every edit and a
    name server that does not answer takes seconds."""
    now = time.monotonic()
    known = _resolved.get(host)
    if known is None or now - known[0] > RESOLVED_FOR_S:
        try:
            socket.getaddrinfo(host, None)
            known = (now, True)
        except (OSError, UnicodeError):
            known = (now, False)
        if len(_resolved) > 256:
            _resolved.clear()
        _resolved[host] = known
    return known[1]


def checkpoint_bytes(spec: JobSpec) -> tuple[int, int, int] | None:
    """(weight bytes, optimizer state bytes, checkpoints kept) of the job; None when its model is unknown."""
    from tunedeck.backend.estimate.memory_job import _DTYPE_BYTES, EstimateError, Job, input_values

    try:
        job = Job.from_values(input_values(spec))
    except (EstimateError, ValueError, KeyError):
        return None
    trained = job.trainable_params
    weights = trained * (_DTYPE_BYTES[spec.model.dtype] if spec.method == "full" else ADAPTER_BYTES)
    states = trained * OPTIMIZER_STATE_BYTES
    if spec.strategy.is_deepspeed and spec.training.precision != "fp32":
        states += trained * MASTER_COPY_BYTES
    training = spec.training
    saves = training.max_steps // training.save_steps if training.max_steps > 0 else None
    kept = training.save_total_limit or saves or 1
    if saves is not None:
        kept = max(1, min(kept, saves))
    return weights, states, kept


def _existing(path: Path) -> Path:
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def _checkpoint_room(spec: JobSpec, run_folder: Path) -> list[Problem]:
    sizes = checkpoint_bytes(spec)
    if sizes is None:
        return []
    weights, states, kept = sizes
    output = Path(os.path.expanduser(spec.output_dir))
    output = output if output.is_absolute() else run_folder / output
    try:
        free = shutil.disk_usage(_existing(output)).free
    except OSError:
        return []
    need = (weights + states) * kept + weights  # the checkpoints kept, and the final model
    if need <= free:
        return []
    return [
        error(
            "output_dir",
            f"{_existing(output)} has {_size(free)} free, and the job keeps {kept} checkpoint(s) of about "
            f"{_size(weights + states)} (weights and optimizer states) plus the final model, about {_size(need)}: "
            "free space, lower training.save_total_limit, or set output_dir to a disk with room",
        )
    ]


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def _filesystem(path: Path) -> str:
    """The type of the filesystem holding path (the longest mount point above it in /proc/mounts)."""
    best, kind = "", ""
    try:
        with open("/proc/mounts", encoding="utf-8") as mounts:
            for line in mounts:
                parts = line.split()
                if (
                    len(parts) >= 3
                    and (str(path) + "/").startswith(parts[1].rstrip("/") + "/")
                    and len(parts[1]) > len(best)
                ):
                    best, kind = parts[1], parts[2]
    except OSError:
        return ""
    return kind


def _slurm(runs_dir: Path) -> list[Problem]:
    problems = []
    if shutil.which("sbatch") is None:
        problems.append(
            refused_here(
                "launch.backend",
                "sbatch is not installed here: run tunedeck on a login node of the cluster (or download the bundle "
                "and submit its slurm.sbatch there), or set launch.backend=local",
            )
        )
    folder = Path(runs_dir).resolve()
    kind = _filesystem(_existing(folder))
    local_prefix = next((p for p in NODE_LOCAL_PREFIXES if str(folder) == p or str(folder).startswith(p + "/")), None)
    if local_prefix or kind in NODE_LOCAL_FILESYSTEMS:
        why = f"it is under {local_prefix}" if local_prefix else f"it is on a {kind} filesystem"
        problems.append(
            warning(
                "--runs-dir",
                f"{folder} looks like a node's own folder ({why}): every node of a Slurm job reads the run folder "
                "and writes its logs and checkpoints there, so give a runs folder on a filesystem they share "
                "(e.g. under your home or /shared)",
            )
        )
    return problems
