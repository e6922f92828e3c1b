"""Where a run's processes run, behind one small interface: this machine, Slurm (here or over SSH), SkyPilot.

The manager starts, follows and stops every run through a Backend; everything else (the run view,
`tunedeck runs`, the queue, sweeps, notifications, the after-training tools) reads the local run
folder, which each backend keeps up to date: the local supervisor writes it, a Slurm run writes it
on the shared filesystem or has it mirrored over SSH by byte offsets (remote_folder.py), so none
of them asks which backend a run is on. A backend's calls:

- prepare: the command status.json records and the environment tunedeck adds, for a run a
  scheduler outside tunedeck runs (None for local: the manager claims this machine's GPUs and
  queues the run itself);
- submit: check what can be checked before anything is launched, then launch; a refusal removes
  the run folder;
- follow: status.json's data with the backend's present view folded in (an end recorded once);
- stop: the stop request the ranks read at their next step (they save and exit), then the
  backend's own end after the grace period; requeue and restarts are the backend's (the local
  supervisor's launch.max_restarts, Slurm's requeue);
- fetch: a run's weights into its local folder, when they are elsewhere;
- unavailable: the errors that mean the backend did not answer (never a failed run).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tunedeck.backend.runs import folder as run_folder
from tunedeck.backend.runs import local_runs, sky_runs, slurm_runs


@dataclass(frozen=True)
class Backend:
    name: str
    submit: Callable[..., object]  # (spec, run_dir, inherited env, env changes)
    follow: Callable[[Path, dict], dict]
    stop: Callable[[Path, dict, float], None]
    fetch: Callable[[Path, dict, int | None], Path]
    unavailable: tuple[type[Exception], ...]
    prepare: Callable[..., tuple[list[str], dict[str, str]]] | None = None  # (spec, accelerate, env changes)


LOCAL = Backend(
    local_runs.BACKEND, local_runs.submit, local_runs.follow, local_runs.stop, local_runs.fetch, local_runs.UNAVAILABLE
)
SLURM = Backend(
    slurm_runs.BACKEND,
    slurm_runs.submit,
    slurm_runs.follow,
    slurm_runs.stop,
    slurm_runs.fetch,
    slurm_runs.UNAVAILABLE,
    slurm_runs.prepare,
)
SKYPILOT = Backend(
    sky_runs.BACKEND,
    sky_runs.submit,
    sky_runs.follow,
    sky_runs.stop,
    sky_runs.fetch,
    sky_runs.UNAVAILABLE,
    sky_runs.prepare,
)
BACKENDS = {backend.name: backend for backend in (LOCAL, SLURM, SKYPILOT)}
# What any backend's call can end in, short of a failed run.
UNAVAILABLE = tuple(dict.fromkeys(error for backend in BACKENDS.values() for error in backend.unavailable))


def named(name: str) -> Backend:
    """The backend of launch.backend (validated before: an unknown one is a spec error, never a KeyError here)."""
    return BACKENDS[name]


def of(data: dict) -> Backend:
    """The backend a run's status.json names (runs written before the field existed ran here)."""
    return BACKENDS.get(data.get("backend") or local_runs.BACKEND, LOCAL)


def fetch_weights(run_dir: Path, checkpoint: int | None) -> Path:
    """A run's final model (checkpoint None) or one checkpoint, brought into its local folder from wherever its
    backend keeps it; its local path (`tunedeck runs fetch`)."""
    data = run_folder.read_status_quietly(run_dir)
    return of(data).fetch(run_dir, data, checkpoint)
